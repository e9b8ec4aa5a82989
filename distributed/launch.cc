// Local launcher (see launch.h): fork/exec N ranks, forward their output with a rank prefix,
// stop everyone when one fails.
#include "distributed/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <sstream>

#include "base/check.h"
#include "base/omp_env.h"
#include "distributed/auth.h"
#include "distributed/env.h"
#include "distributed/net.h"

extern char** environ;

namespace tt::distributed {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// Installs handlers for the launcher's lifetime and restores the old ones.
class SignalScope {
 public:
  SignalScope() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe_);  // a closed stdout must not kill the launcher
    g_signal = 0;
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {}, old_pipe_ {};
};

void write_all(int fd, const std::string& s) {
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::write(fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the launcher's own output is gone; keep supervising
    at += (size_t)n;
  }
}

// One output stream of a child: complete lines go out prefixed; a partial line waits.
struct Stream {
  int fd = -1;   // read end, -1 when closed
  int out = 1;   // where it goes (1 or 2)
  std::string buf;
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = true;
  int status = 0;
  Stream streams[2];
};

void emit(const std::string& prefix, Stream& s, bool flush_partial) {
  size_t nl;
  while ((nl = s.buf.find('\n')) != std::string::npos) {
    write_all(s.out, prefix + s.buf.substr(0, nl + 1));
    s.buf.erase(0, nl + 1);
  }
  if (flush_partial && !s.buf.empty()) {
    write_all(s.out, prefix + s.buf + "\n");
    s.buf.clear();
  }
}

// Reads what is there; closes the stream at EOF (flushing a last partial line).
void drain(const std::string& prefix, Stream& s) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n > 0) {
      s.buf.append(buf, (size_t)n);
      emit(prefix, s, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    emit(prefix, s, true);
    ::close(s.fd);
    s.fd = -1;
    return;
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return str("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return str("was killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  return "ended";
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

std::vector<char*> c_argv(std::vector<std::string>& args) {
  std::vector<char*> v;
  for (std::string& a : args) v.push_back(a.data());
  v.push_back(nullptr);
  return v;
}

// The parent's environment without the variables a launcher sets, plus `extra`.
std::vector<std::string> child_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const std::string& x : extra) replaced |= x.compare(0, key.size() + 1, key + "=") == 0;
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// fork + exec with the given stdout/stderr (-1: inherit), in a process group of its own when
// own_group (the launcher stops a rank and all it started; the terminal's Ctrl-C reaches the
// launcher, which passes it on); never returns in the child.
pid_t spawn(std::vector<std::string> argv, std::vector<std::string> env, int out_fd, int err_fd, bool own_group) {
  std::vector<char*> cargv = c_argv(argv);
  std::vector<char*> cenv = c_argv(env);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(str("launch: fork(): ", std::strerror(errno)));
  if (pid > 0) {
    if (own_group) ::setpgid(pid, pid);  // also here: no race with the first kill()
    return pid;
  }
  // Child: only async-signal-safe calls from here on.
  if (own_group) ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGPIPE, &dfl, nullptr);
  sigaction(SIGINT, &dfl, nullptr);
  sigaction(SIGTERM, &dfl, nullptr);
  if (out_fd >= 0) ::dup2(out_fd, 1);
  if (err_fd >= 0) ::dup2(err_fd, 2);
  ::execvpe(cargv[0], cargv.data(), cenv.data());
  const char* what = std::strerror(errno);
  const char* msg = "launch: cannot run ";
  (void)!::write(2, msg, std::strlen(msg));
  (void)!::write(2, cargv[0], std::strlen(cargv[0]));
  (void)!::write(2, ": ", 2);
  (void)!::write(2, what, std::strlen(what));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
}

}  // namespace

int free_port() {
  net::Socket s = net::listen_on(0, "launch");
  return net::local_port(s);
}

std::string self_executable() {
  char buf[PATH_MAX + 1];
  const ssize_t n = ::readlink("/proc/self/exe", buf, PATH_MAX);
  if (n <= 0) throw Error(str("cannot read /proc/self/exe: ", std::strerror(errno)));
  return std::string(buf, (size_t)n);
}

int run_process(const std::vector<std::string>& argv) {
  TT_CHECK(!argv.empty(), "run_process: no program");
  const pid_t pid = spawn(argv, child_env({}), -1, -1, /*own_group=*/false);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(str("waitpid(", pid, "): ", std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void launch(const LaunchOptions& o) {
  if (o.nproc < 1) throw Error(str("launch: --nproc must be >= 1, got ", o.nproc));
  if (o.master_port < 0 || o.master_port > 65535) throw Error(str("launch: --master-port ", o.master_port, " is not a port"));
  const int port = o.master_port > 0 ? o.master_port : free_port();
  const std::string program = o.program.empty() ? self_executable() : o.program;
  // One job id for the ranks, so the rendezvous refuses any other job's (env.h); a TT_JOB_ID of
  // the caller's (a sweep, a wrapper) is kept.
  const char* given_id = std::getenv("TT_JOB_ID");
  const std::string job_id = given_id != nullptr && given_id[0] != '\0'
                                 ? std::string(given_id)
                                 : str("launch-", hostname(), "-", ::getpid(), "-", (long long)::time(nullptr));
  // One secret for the ranks, so that only they can join (auth.h); a caller's is kept.
  const char* given_secret = std::getenv("TT_JOB_SECRET");
  if (given_secret != nullptr && given_secret[0] == '\0')  // a failed $(...) in a job script, as the ranks say
    throw Error("launch: TT_JOB_SECRET is set but empty; leave it unset (launch makes one) or give one");
  const std::string secret = given_secret != nullptr ? std::string(given_secret) : auth::nonce();
  SignalScope signals;

  // The ranks share this host's CPUs and wait passively, unless the user set OMP_* (omp_env.h).
  std::vector<std::string> omp;
  for (const auto& [name, value] :
       omp_defaults([](const char* n) { return std::getenv(n); }, available_cpus(), o.nproc))
    omp.push_back(name + "=" + value);

  std::vector<Child> children(o.nproc);
  for (int r = 0; r < o.nproc; ++r) {
    Child& c = children[r];
    c.rank = r;
    int pipes[2][2];
    for (auto& p : pipes)
      if (::pipe2(p, O_CLOEXEC) != 0) throw Error(str("launch: pipe(): ", std::strerror(errno)));
    std::vector<std::string> argv = {program};
    argv.insert(argv.end(), o.args.begin(), o.args.end());
    std::vector<std::string> vars = {
        "RANK=" + std::to_string(r),
        "WORLD_SIZE=" + std::to_string(o.nproc),
        "LOCAL_RANK=" + std::to_string(r),
        "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc),
        "MASTER_ADDR=" + o.master_addr,
        "MASTER_PORT=" + std::to_string(port),
        "TT_JOB_ID=" + job_id,
        "TT_JOB_SECRET=" + secret,
    };
    vars.insert(vars.end(), omp.begin(), omp.end());
    const std::vector<std::string> env = child_env(vars);
    c.pid = spawn(argv, env, pipes[0][1], pipes[1][1], /*own_group=*/true);
    for (int k = 0; k < 2; ++k) {
      ::close(pipes[k][1]);
      ::fcntl(pipes[k][0], F_SETFL, ::fcntl(pipes[k][0], F_GETFL) | O_NONBLOCK);
      c.streams[k].fd = pipes[k][0];
      c.streams[k].out = k + 1;
    }
  }

  std::string first_failure;
  std::vector<int> stopped;
  std::optional<Clock::time_point> kill_at;
  int interrupted = 0;
  auto stop_others = [&] {
    for (Child& c : children)
      if (c.running) {
        ::kill(-c.pid, SIGTERM);
        stopped.push_back(c.rank);
      }
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
  };
  auto reap = [&](Child& c, int options) {
    if (!c.running) return;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, options);
    if (r != c.pid) return;
    c.running = false;
    c.status = status;
    const bool stopped_by_us = std::find(stopped.begin(), stopped.end(), c.rank) != stopped.end();
    if (failed(status) && first_failure.empty() && !stopped_by_us && !interrupted) {
      first_failure = str("rank ", c.rank, " (pid ", c.pid, ") ", describe_status(status));
      stop_others();
    }
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    std::vector<Child*> owners;
    for (Child& c : children)
      for (Stream& s : c.streams)
        if (s.fd >= 0) {
          fds.push_back(pollfd{s.fd, POLLIN, 0});
          streams.push_back(&s);
          owners.push_back(&c);
        }
    bool any_running = false;
    for (const Child& c : children) any_running |= c.running;
    if (!any_running && fds.empty()) break;
    if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), 50);
    } else {
      ::usleep(50 * 1000);
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      drain(str("[rank ", owners[i]->rank, "] "), *streams[i]);
      // Both streams at EOF: the child is (about to be) gone; reap it now so that the first
      // failure is named by the order in which children ended.
      if (owners[i]->streams[0].fd < 0 && owners[i]->streams[1].fd < 0) reap(*owners[i], 0);
    }
    for (Child& c : children) reap(c, WNOHANG);
    if (g_signal != 0 && !interrupted) {
      interrupted = g_signal;
      for (Child& c : children)
        if (c.running) ::kill(-c.pid, g_signal);
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.grace_s));
    }
    if (kill_at && Clock::now() >= *kill_at) {
      for (Child& c : children)
        if (c.running) ::kill(-c.pid, SIGKILL);
      kill_at.reset();
    }
    // Children gone but a grandchild keeps a pipe open: do not wait for it.
    if (!any_running)
      for (Child& c : children)
        for (Stream& s : c.streams)
          if (s.fd >= 0) {
            emit(str("[rank ", c.rank, "] "), s, true);
            ::close(s.fd);
            s.fd = -1;
          }
  }

  auto list = [](const std::vector<int>& v) {
    std::ostringstream os;
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    return os.str();
  };
  if (interrupted) throw Error(str("launch: interrupted by signal ", interrupted, " (", strsignal(interrupted), ")"));
  if (!first_failure.empty()) {
    std::vector<int> others;
    for (const Child& c : children)
      if (std::find(stopped.begin(), stopped.end(), c.rank) != stopped.end() && failed(c.status)) others.push_back(c.rank);
    throw Error(str("launch: ", first_failure, others.empty() ? "" : "; stopped rank" + std::string(others.size() > 1 ? "s " : " ") + list(others)));
  }
}

}  // namespace tt::distributed
