// Deadline-bounded TCP sockets (see net.h).
#include "distributed/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/check.h"

namespace tt::distributed::net {
namespace {

int ms_until(Deadline d) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return (int)std::max<long long>(0, std::min<long long>(left, 1 << 30));
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// Waits until fd is ready for `events` or the deadline passes: 1 ready, 0 timeout, -1 error.
int wait_for(int fd, short events, Deadline d) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_until(d));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return Clock::now() >= d ? 0 : -2;  // -2: spurious, retry
    return 1;
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket listen_on(int port, const std::string& who) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) throw Error(str(who, ": socket(): ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons((uint16_t)port);
  if (::bind(s.fd(), (sockaddr*)&a, sizeof(a)) != 0)
    throw Error(str(who, ": cannot listen on port ", port, ": ", std::strerror(errno),
                    errno == EADDRINUSE ? " (another job uses it; set MASTER_PORT or --master-port)" : ""));
  if (::listen(s.fd(), 1024) != 0) throw Error(str(who, ": listen() on port ", port, ": ", std::strerror(errno)));
  set_nonblocking(s.fd());
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getsockname(s.fd(), (sockaddr*)&a, &len) != 0) return -1;
  return ntohs(a.sin_port);
}

Socket accept_until(const Socket& listener, Deadline deadline) {
  for (;;) {
    const int w = wait_for(listener.fd(), POLLIN, deadline);
    if (w == 0 || w == -1) return Socket();
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nonblocking(fd);
      return Socket(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) return Socket();
  }
}

Socket connect_until(const std::string& host, int port, Deadline deadline, std::string* last_error) {
  const std::string service = std::to_string(port);
  auto pause = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_until(deadline))));
  };
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    if (gai != 0) {
      *last_error = str("cannot resolve host '", host, "': ", ::gai_strerror(gai));
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!s.valid()) continue;
        set_nonblocking(s.fd());
        int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          const int w = wait_for(s.fd(), POLLOUT, deadline);
          int err = 0;
          socklen_t len = sizeof(err);
          if (w == 1 && ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
            rc = 0;
          } else {
            errno = w == 1 ? err : ETIMEDOUT;
          }
        }
        if (rc == 0) {
          ::freeaddrinfo(res);
          return s;
        }
        *last_error = std::strerror(errno);
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline) return Socket();
    pause();
  }
}

void configure(const Socket& s, double keepalive_s) {
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(s.fd(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // Silence of keepalive_s: first probe after half of it, then 3 probes over the other half.
  const int idle = std::max(1, (int)(keepalive_s / 2));
  const int interval = std::max(1, (int)(keepalive_s / 6));
  const int count = 3;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  // No TCP_USER_TIMEOUT: a rank that sent its chunk to a rank 0 still busy with its step sees a
  // zero window for as long as that step lasts, which is no failure.
}

IoStatus send_all(const Socket& s, const void* data, size_t bytes, Deadline deadline, std::string* error) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(s.fd(), p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      const int w = wait_for(s.fd(), POLLOUT, deadline);
      if (w == 0) return IoStatus::kTimeout;
      if (w == -1) {
        *error = std::strerror(errno);
        return IoStatus::kError;
      }
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      *error = std::strerror(errno);
      return IoStatus::kClosed;
    }
    *error = n < 0 ? std::strerror(errno) : "send() returned 0";
    return errno == ETIMEDOUT ? IoStatus::kClosed : IoStatus::kError;
  }
  return IoStatus::kOk;
}

IoStatus recv_all(const Socket& s, void* data, size_t bytes, Deadline deadline, std::string* error) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(s.fd(), p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= (size_t)n;
      continue;
    }
    if (n == 0) {
      *error = "connection closed";
      return IoStatus::kClosed;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      const int w = wait_for(s.fd(), POLLIN, deadline);
      if (w == 0) return IoStatus::kTimeout;
      if (w == -1) {
        *error = std::strerror(errno);
        return IoStatus::kError;
      }
      continue;
    }
    *error = std::strerror(errno);
    return (errno == ECONNRESET || errno == ETIMEDOUT) ? IoStatus::kClosed : IoStatus::kError;
  }
  return IoStatus::kOk;
}

IoStatus recv_some(const Socket& s, void* data, size_t bytes, size_t* got, std::string* error) {
  *got = 0;
  for (;;) {
    const ssize_t n = ::recv(s.fd(), data, bytes, 0);
    if (n > 0) {
      *got = (size_t)n;
      return IoStatus::kOk;
    }
    if (n == 0 && bytes > 0) {
      *error = "connection closed";
      return IoStatus::kClosed;
    }
    if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) return IoStatus::kOk;
    if (errno == EINTR) continue;
    *error = std::strerror(errno);
    return (errno == ECONNRESET || errno == ETIMEDOUT) ? IoStatus::kClosed : IoStatus::kError;
  }
}

std::string peer_address(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (::getpeername(s.fd(), (sockaddr*)&a, &len) != 0 || a.sin_family != AF_INET) return "?";
  char ip[INET_ADDRSTRLEN] = {0};
  if (::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip)) == nullptr) return "?";
  return str(ip, ":", ntohs(a.sin_port));
}

}  // namespace tt::distributed::net
