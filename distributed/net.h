// TCP plumbing of the rendezvous: non-blocking sockets whose every wait is bounded by a deadline.
//
// Nothing here blocks without a deadline: connect retries until it, accept and each send/recv
// poll against it. A peer that exits closes its sockets (its kernel sends FIN or RST), which ends
// any wait at once with IoStatus::kClosed; a peer whose host died or whose network is cut is found
// by TCP keepalive probes (configure()), the kernel's heartbeat, within about keepalive_s while
// the connection is idle (with data in flight, by TCP's retransmission limit or the caller's
// deadline, whichever comes first).
// Private to the package: rendezvous.h is the interface.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace tt::distributed::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// An owned file descriptor (move-only).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

 private:
  int fd_ = -1;
};

enum class IoStatus { kOk, kTimeout, kClosed, kError };

// Listens on every interface at `port` (0: the OS picks one, see local_port). Throws tt::Error
// with `who` (the caller's tag) and the port, e.g. when it is in use.
Socket listen_on(int port, const std::string& who);
int local_port(const Socket& s);

// One connection from the listener, or an invalid socket when the deadline passes first.
Socket accept_until(const Socket& listener, Deadline deadline);

// Connects to host:port, retrying refused or unreachable attempts until the deadline. Returns an
// invalid socket on timeout, with the last failure in *last_error.
Socket connect_until(const std::string& host, int port, Deadline deadline, std::string* last_error);

// TCP_NODELAY, and keepalive probes that declare the peer lost after about keepalive_s of silence
// from its kernel on an idle connection (one waiting for the peer, with nothing unacknowledged).
void configure(const Socket& s, double keepalive_s);

// Moves exactly `bytes`. *error receives a description when the status is not kOk.
IoStatus send_all(const Socket& s, const void* data, size_t bytes, Deadline deadline, std::string* error);
IoStatus recv_all(const Socket& s, void* data, size_t bytes, Deadline deadline, std::string* error);
// What has arrived, up to `bytes`, without waiting: *got = 0 when nothing is there yet.
IoStatus recv_some(const Socket& s, void* data, size_t bytes, size_t* got, std::string* error);

// "10.0.0.7:41234": the peer's address, for messages ("?" when unknown).
std::string peer_address(const Socket& s);

}  // namespace tt::distributed::net
