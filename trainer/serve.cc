// The VLA policy server (see serve.h): one poll() loop over the listening socket and the clients,
// whose sockets are non-blocking: replies a client has not read wait in its connection's buffer,
// so no client's reading (or not reading) holds up another.
#include "trainer/serve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "base/base64.h"
#include "base/check.h"
#include "base/files.h"
#include "base/json.h"
#include "data/actions.h"
#include "data/frames.h"
#include "data/image.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/policy.h"
#include "trainer/checkpoint.h"
#include "trainer/sample.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;
using Exec = model::CpuExec<float>;
using json = nlohmann::json;

// Replies are JSON dumped with invalid UTF-8 replaced (U+FFFD): an error may quote the client's
// bytes (nlohmann's parse errors do), and a strict dump of those would throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

constexpr size_t kMaxSessionName = 256;  // bytes
constexpr size_t kMaxQuote = 512;        // bytes of a parse error's text (it quotes the input)
// Lines of one connection answered in a turn of the poll loop: a client's pipelined burst waits
// for the others' requests (each a model step, milliseconds) every 16 lines.
constexpr int kLinesPerTurn = 16;

// Client text for a log line: a JSON string, quoted, its control characters (a newline that would
// forge a log line, a terminal escape) and non-ASCII bytes escaped.
std::string quoted(const std::string& text) { return json(text).dump(-1, ' ', true, json::error_handler_t::replace); }

struct Conn {
  int fd = -1;
  std::string peer;      // host:port, for log lines
  std::string in;        // request bytes not yet answered: whole lines left for the next turn, then a partial one
  size_t scanned = 0;    // the first bytes of `in` hold no newline (not searched again)
  std::string out;       // reply bytes the socket has not taken yet (it is non-blocking)
  bool eof = false;      // the client sends no more: what `in` holds is answered (its last line
                         // without a newline too), then the connection closes
  bool closing = false;  // reads no more requests; closed once `out` is sent
  // Once a closing connection's replies are sent: its sending side is shut (the client reads the
  // end of the stream after its last reply) and what it still sends is read and dropped until it
  // closes too or linger_until, so closing with its bytes unread (a reset) cannot discard that
  // last reply on its way. A lingering connection holds no --max-sessions slot; at most
  // --max-sessions served and as many refused ones linger at once (past that, one closes at once),
  // so refused connections cannot take the served ones' room.
  bool shut = false;
  bool refused = false;  // refused at --max-sessions (never served)
  bool resetting = false;  // a reset in pieces is under way (Server::resets_): its later lines wait
  std::chrono::steady_clock::time_point linger_until{};
};

constexpr auto kLinger = std::chrono::seconds(2);

// Whether `in` may hold a line to answer without reading more: bytes not yet searched for a
// newline, or any bytes once the client sent its last.
bool lines_left(const Conn& c) { return c.scanned < c.in.size() || (c.eof && !c.in.empty()); }

class Server {
 public:
  explicit Server(const ServeOptions& opt) : opt_(opt) {
    if (opt.max_buffered_bytes >= 0 && opt.max_buffered_bytes - 2 < opt.max_message_bytes)  // (no overflow)
      throw Error(str("--max-buffered-bytes ", opt.max_buffered_bytes, ": less than --max-message-bytes ",
                      opt.max_message_bytes, " + 2 (a request line of that length and its \"\\r\\n\" must fit); "
                      "expected at least --max-message-bytes + 2"));
    TT_CHECK(opt.reset_piece_rows >= 1, "--reset-piece-rows ", opt.reset_piece_rows, ": expected at least 1");
    fit_descriptors();
    budget_ = opt.max_buffered_bytes >= 0
                  ? opt.max_buffered_bytes
                  : std::min<int64_t>(opt.max_message_bytes, std::numeric_limits<int64_t>::max() / 16) * 16;
    budget_from_ = opt.max_buffered_bytes >= 0 ? "--max-buffered-bytes" : "16 x --max-message-bytes";
    dir_ = resolve_checkpoint(opt.checkpoint);
    cfg_ = read_checkpoint_config(dir_);
    if (!cfg_.vision.enabled())
      throw Error(str(dir_, "/config.json: a text model (no vision_config); serve needs a VLA checkpoint"));
    window_ = opt.window >= 0 ? opt.window : checkpoint_history_window(dir_);
    seg_ = checkpoint_segments(dir_);  // on: sessions run the segment operator as training did
    // Images a step the policy was trained with (treetrain's checkpoints of episode data say;
    // others do not, and any count is taken, the same in every step of a session).
    if (const fs::path state = fs::path(dir_) / "trainer_state.json"; fs::exists(state)) {
      cameras_ = read_trainer_state(state.string()).cameras;
      cameras_from_ = str(state.string(), "'s data.cameras");
    }
    context_ = std::min<int64_t>(cfg_.max_position_embeddings, 1 << 14);
    const fs::path bins = fs::path(dir_) / "action_bins.json";
    std::string tokens_from;  // what set the number of action tokens, for the context check
    if (opt.action_first >= 0) {
      if (fs::exists(bins))
        throw Error(str("--action-ids ", opt.action_first, ":", opt.action_end, ": the checkpoint has ", bins.string(),
                        " (continuous actions, decoded through its bins); leave --action-ids and --action-tokens "
                        "out for it (they are for checkpoints trained on discrete action ids)"));
      tokens_ = opt.action_tokens > 0 ? opt.action_tokens : 1;
      first_ = opt.action_first;
      end_ = opt.action_end;
      TT_CHECK(tokens_ >= 1 && first_ < end_ && end_ <= cfg_.vocab_size, "--action-ids ", first_, ":", end_,
               " and --action-tokens ", tokens_, ": expected ids inside the vocabulary of ", cfg_.vocab_size);
      tokens_from = str("--action-tokens ", tokens_);
    } else if (fs::exists(bins)) {
      bins_ = data::ActionBins::from_json(read_text(bins.string(), "the action bins"), bins.string());
      if (bins_.vocab_size != cfg_.vocab_size)
        throw Error(str(bins.string(), ": vocab_size ", bins_.vocab_size, ", but the model's config.json has vocab_size ",
                        cfg_.vocab_size, "; expected the same (the bins are the vocabulary's last ", bins_.bins, " ids)"));
      if (opt.action_tokens > 0 && opt.action_tokens != bins_.dims())  // 0: the flag was left out
        throw Error(str("--action-tokens ", opt.action_tokens, ": the checkpoint's action_bins.json decodes ", bins_.dims(),
                        " tokens (one per action dimension); leave the flag out (it is for --action-ids) or pass ",
                        bins_.dims()));
      continuous_ = true;
      tokens_ = bins_.dims();
      first_ = bins_.first_id();
      end_ = (int32_t)bins_.vocab_size;
      tokens_from = str(bins.string(), "'s ", tokens_, " action dimensions");
    } else {
      throw Error(str(dir_, ": no action_bins.json (continuous actions); for discrete actions pass --action-ids "
                            "FIRST:END and --action-tokens N"));
    }
    // The first step's rows: at least one instruction token, one frame (and the state row), and
    // the action tokens fed back (all but the last); positions stay below the context.
    step_rows_ = cfg_.vision.tokens_per_frame() + (cfg_.vision.state_dim > 0 ? 1 : 0);
    max_instruction_ = context_ - step_rows_ - (tokens_ - 1);
    if (max_instruction_ < 1)
      throw Error(str(tokens_from, ": one step's ", step_rows_, " observation rows and ", tokens_,
                      " action tokens do not fit the context of ", context_,
                      " rows (min(max_position_embeddings, 16384)) beside an instruction; expected at most ",
                      context_ - step_rows_, " action tokens"));
    // With segments positions stay below segments.length + tail however long the path: the
    // instruction has no bound (the context bounds one step's rows, the ring SegmentedPath keeps).
    if (seg_.enabled()) max_instruction_ = std::numeric_limits<int64_t>::max();
    model_ = load_inference_model<Exec>(cfg_, dir_);
    // One session's context, as every reset makes it (its buffers are reserved, not yet touched).
    const int64_t each = fresh_bytes_ = Session(*model_, window_, context_, seg_).policy.bytes();
    if (opt.max_cache_bytes >= 0) {
      cache_budget_ = opt.max_cache_bytes;
      cache_budget_from_ = "--max-cache-bytes";
    } else {
      const auto [avail, from] = memory_available();
      cache_budget_ = avail / 4 * 3;
      cache_budget_from_ = str("3/4 of the ", avail, " bytes ", from, " at startup; --max-cache-bytes sets it");
    }
    if (cache_budget_ < each)
      throw Error(str("serve: the sessions' contexts may hold ", cache_budget_, " bytes (", cache_budget_from_,
                      "), less than one session's ", each, " bytes (", context_, " rows of context",
                      seg_.enabled() ? ", a segment's ring" : "", "); expected at least that"));
    spdlog::info("serve: a session's context takes {} bytes; the sessions' contexts {} bytes together at most ({}): "
                 "{} sessions of that size (--max-sessions {})",
                 each, cache_budget_, cache_budget_from_, cache_budget_ / each, opt_.max_sessions);
  }

  // The memory the process may still take: /proc/meminfo's MemAvailable, or less where the
  // cgroup's memory.max (minus memory.current) says so; and where that was read.
  static std::pair<int64_t, std::string> memory_available() {
    int64_t avail = -1;
    std::string from;
    if (FILE* f = std::fopen("/proc/meminfo", "r")) {
      char line[256];
      long long kb = 0;
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
          avail = (int64_t)kb * 1024;
          from = "available (/proc/meminfo MemAvailable)";
          break;
        }
      std::fclose(f);
    }
    if (avail < 0) {
      avail = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
      from = "of physical memory";
    }
    auto read_num = [](const std::string& path) -> int64_t {
      long long v = -1;
      if (FILE* f = std::fopen(path.c_str(), "r")) {
        if (std::fscanf(f, "%lld", &v) != 1) v = -1;  // "max": no limit
        std::fclose(f);
      }
      return (int64_t)v;
    };
    // The process's own memory cgroup and the root one, v2 (memory.max) or v1 (memory.limit_in_bytes).
    std::vector<std::pair<std::string, std::string>> groups = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"}};
    if (FILE* f = std::fopen("/proc/self/cgroup", "r")) {
      char line[4096];
      while (std::fgets(line, sizeof line, f)) {
        std::string l(line);
        if (!l.empty() && l.back() == '\n') l.pop_back();
        if (l.rfind("0::", 0) == 0 && l.size() > 4) {
          groups.push_back({"/sys/fs/cgroup" + l.substr(3) + "/memory.max", "/sys/fs/cgroup" + l.substr(3) + "/memory.current"});
        } else if (const size_t at = l.find(":memory:"); at != std::string::npos) {
          const std::string dir = "/sys/fs/cgroup/memory" + l.substr(at + 8);
          groups.push_back({dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes"});
        }
      }
      std::fclose(f);
    }
    for (const auto& [limit_file, usage_file] : groups) {
      const int64_t max = read_num(limit_file), cur = read_num(usage_file);
      if (max > 0 && cur >= 0 && max - cur < avail) {
        avail = std::max<int64_t>(0, max - cur);
        from = str("left under the cgroup's limit (", limit_file, ")");
      }
    }
    return {avail, from};
  }

  // Each of --max-sessions connections may be served, linger after its last reply, and linger
  // refused: about 3 descriptors a session. The soft RLIMIT_NOFILE (1,024 by default on many
  // systems) is raised toward the hard one; where that is still short, --max-sessions is lowered
  // (a warning), so a client over it is refused with a reply instead of waiting in the backlog.
  void fit_descriptors() {
    constexpr int64_t kSpare = 64;  // the listener, the model's files, logs
    const int64_t want = 3 * (int64_t)opt_.max_sessions + kSpare;
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
    if (r.rlim_cur != RLIM_INFINITY && (int64_t)r.rlim_cur < want) {
      rlimit up = r;
      up.rlim_cur = r.rlim_max == RLIM_INFINITY ? (rlim_t)want : std::min<rlim_t>(r.rlim_max, (rlim_t)want);
      if (setrlimit(RLIMIT_NOFILE, &up) == 0) r = up;
    }
    if (r.rlim_cur == RLIM_INFINITY || (int64_t)r.rlim_cur >= want) return;
    const int64_t fit = ((int64_t)r.rlim_cur - kSpare) / 3;
    if (fit < 1)
      throw Error(str("serve: the process may open ", (int64_t)r.rlim_cur, " files (ulimit -n), too few to serve a "
                      "connection (expected at least ", 3 + kSpare, ")"));
    spdlog::warn("serve: --max-sessions {} needs about {} file descriptors, but the process may open {} (ulimit -n; "
                 "hard limit {}): serving at most {} sessions",
                 opt_.max_sessions, want, (int64_t)r.rlim_cur,
                 r.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string((int64_t)r.rlim_max), fit);
    opt_.max_sessions = (int)fit;
  }

  int64_t run() {
    const int lfd = listen_on(opt_.host, opt_.port);
    if (fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL, 0) | O_NONBLOCK) != 0)
      throw Error(str("serve: cannot make the listening socket non-blocking: ", std::strerror(errno)));
    sockaddr_in a{};
    socklen_t len = sizeof a;
    getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    std::cout << "listening on " << opt_.host << ":" << ntohs(a.sin_port) << std::endl;
    spdlog::info("serve: {} ({} history, {} action token(s) among ids {}..{}{}) on {}:{}", dir_,
                 window_ == 0 ? std::string("full") : str("window ", window_), tokens_, first_, end_ - 1,
                 continuous_ ? ", continuous via action_bins.json" : "", opt_.host, ntohs(a.sin_port));
    std::vector<Conn> conns;
    int64_t answered = 0;
    // Out of descriptors (EMFILE): the listener stays readable, so it is left out of the poll for
    // a moment (not polled in a busy loop); the waiting clients stay in its queue until then.
    auto listener_rests_until = std::chrono::steady_clock::now();
    // Past max_requests only the resets under way go on, until each is answered (an eviction's
    // reply may have taken the count meanwhile).
    while (opt_.max_requests < 0 || answered < opt_.max_requests || !resets_.empty()) {
      const bool resting = std::chrono::steady_clock::now() < listener_rests_until;
      std::vector<pollfd> fds = {{lfd, (short)(resting ? 0 : POLLIN), 0}};
      // A connection with lines left from its last turn is not read (its socket holds the rest)
      // and the poll does not wait for it.
      bool turn_now = false;
      auto linger_ends = std::chrono::steady_clock::time_point::max();
      for (const Conn& c : conns) {
        const bool more = !c.closing && lines_left(c);
        // A closing connection with its replies out (an eviction's, sent at once) lingers from the
        // next turn: that turn comes without waiting.
        turn_now |= more || c.resetting || (c.closing && c.out.empty() && !c.shut);
        if (c.shut) linger_ends = std::min(linger_ends, c.linger_until);
        fds.push_back({c.fd, (short)((c.shut ? POLLIN : 0) | (c.closing || c.eof || more ? 0 : POLLIN) |
                                     (c.out.empty() ? 0 : POLLOUT)),
                       0});
      }
      // Woken for the next idle session to close, if any, when the listener's rest ends, or when
      // a lingering connection's time is up.
      int wait_ms = close_idle_sessions();
      if (resting) wait_ms = wait_ms < 0 ? 100 : std::min(wait_ms, 100);
      if (linger_ends != std::chrono::steady_clock::time_point::max()) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(linger_ends -
                                                                                std::chrono::steady_clock::now());
        const int ms = (int)std::max<int64_t>(0, left.count() + 1);
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
      }
      if (turn_now) wait_ms = 0;
      if (poll(fds.data(), fds.size(), wait_ms) < 0) {
        if (errno == EINTR) continue;
        throw Error(str("serve: poll: ", std::strerror(errno)));
      }
      std::vector<Conn> keep;
      const auto now = std::chrono::steady_clock::now();
      for (size_t i = 0; i < conns.size(); ++i) {  // the connections polled (fds[i + 1])
        Conn& c = conns[i];
        const short ev = fds[i + 1].revents;
        if (c.shut) {  // lingering: the client's bytes dropped until it closes or the time is up
          bool done = (ev & (POLLERR | POLLNVAL)) || now >= c.linger_until;
          if (!done && (ev & (POLLIN | POLLHUP))) {
            char junk[1 << 16];  // one read a turn, as a live connection gets
            const ssize_t n = recv(c.fd, junk, sizeof junk, 0);
            done = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
          }
          if (done) {
            close(c.fd);
            --lingering_[c.refused];
          } else {
            keep.push_back(std::move(c));
          }
          continue;
        }
        bool open = !(ev & (POLLERR | POLLNVAL)) && !(c.closing && (ev & POLLHUP));
        if (open && (ev & POLLOUT)) open = flush(c);
        const bool limit = opt_.max_requests >= 0 && answered >= opt_.max_requests;
        if (open && !limit && !c.closing && !c.eof && !lines_left(c) && (ev & (POLLIN | POLLHUP)))
          open = read_requests(c);
        if (open && c.resetting) open = continue_reset(c, answered);
        if (open && !limit && !c.closing && !c.resetting) open = answer_lines(c, answered);
        if (open && c.closing && c.out.empty()) open = linger(c, now);  // its last reply is out
        if (open) {
          keep.push_back(std::move(c));
        } else {
          drop_reset(c, "its connection closed");
          drop_requests(c);
          close(c.fd);
        }
      }
      if (fds[0].revents & POLLIN) {  // a new connection joins the next poll
        sockaddr_in peer{};
        socklen_t plen = sizeof peer;
        // Non-blocking: a peer that resets between poll and accept leaves nothing to wait for.
        const int fd = accept4(lfd, reinterpret_cast<sockaddr*>(&peer), &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        const int64_t live = std::count_if(keep.begin(), keep.end(), [](const Conn& k) { return !k.shut; });
        if (fd >= 0 && live >= opt_.max_sessions) {
          // At most --max-sessions connections (each may buffer --max-message-bytes): told, then
          // closed as a served one is (lingering: a request it sent at once cannot turn the
          // close into a reset that discards the reply).
          const std::string no = dump(json{{"error", str("the server holds ", live, " connections, its limit ",
                                                         "(--max-sessions ", opt_.max_sessions,
                                                         "); try again when one closes")}}) + "\n";
          (void)!send(fd, no.data(), no.size(), MSG_NOSIGNAL);
          Conn refused{fd, "refused"};
          refused.refused = refused.closing = true;
          if (linger(refused, std::chrono::steady_clock::now()))
            keep.push_back(std::move(refused));
          else
            close(fd);
          spdlog::warn("serve: refused a connection: {} open, the limit (--max-sessions {})", live, opt_.max_sessions);
        } else if (fd >= 0) {
          char host[INET_ADDRSTRLEN] = "?";
          inet_ntop(AF_INET, &peer.sin_addr, host, sizeof host);
          keep.push_back(Conn{fd, str(host, ":", ntohs(peer.sin_port))});
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          spdlog::warn("serve: cannot accept a connection ({}; {} open): new clients wait until some close",
                       std::strerror(errno), conns.size());
          listener_rests_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        }
      }
      conns = std::move(keep);
      if (out_of_room_) {
        out_of_room_ = false;
        evict_largest(conns, answered);
      }
    }
    drain(conns);
    for (const Conn& c : conns) close(c.fd);
    close(lfd);
    return answered;
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct Session {
    model::VlaPolicy<Exec> policy;
    int64_t steps = 0;
    int64_t cameras = 0;                    // images a step, from its first step (0: none yet)
    Clock::time_point used = Clock::now();  // its last request
    Session(model::Decoder<Exec>& m, int window, int64_t capacity, const model::SegmentConfig& seg)
        : policy(m, window, capacity, seg) {}
  };

  static int listen_on(const std::string& host, int port) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    TT_CHECK(fd >= 0, "serve: socket: ", std::strerror(errno));
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) throw Error(str("--host ", host, ": not an IPv4 address"));
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 64) != 0)
      throw Error(str("serve: cannot listen on ", host, ":", port, ": ", std::strerror(errno)));
    return fd;
  }

  // Sends what the socket takes now; false when the client went away (its problem, not the server's).
  static bool flush(Conn& c) {
    size_t off = 0;
    while (off < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + off, c.out.size() - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) return false;
      off += (size_t)n;
    }
    c.out.erase(0, off);
    return true;
  }

  // Queues a reply line and sends what the socket takes; false when the connection is to close:
  // the client went away, or its unsent replies passed max_message_bytes (it sends requests but
  // does not read the answers; the server never waits on one client).
  bool reply(Conn& c, const std::string& text) {
    c.out += text;
    c.out += '\n';
    if (!flush(c)) return false;
    if ((int64_t)c.out.size() > opt_.max_message_bytes) {
      spdlog::warn("serve: closing the connection from {}: {} bytes of replies unsent (it does not read them; "
                   "the limit is --max-message-bytes {})",
                   c.peer, c.out.size(), opt_.max_message_bytes);
      return false;
    }
    return true;
  }

  // Reads what the socket holds into the connection's buffer (answer_lines answers it), at most
  // what the budget has room for; with none, nothing is read and out_of_room_ is set (run() then
  // evicts a connection: evict_largest). False when the connection is to close.
  bool read_requests(Conn& c) {
    char buf[1 << 16];
    const int64_t room = budget_ - buffered_;
    if (room <= 0) {
      out_of_room_ = true;
      return true;
    }
    const ssize_t n = recv(c.fd, buf, (size_t)std::min<int64_t>((int64_t)sizeof buf, room), 0);
    if (n == 0) {  // the client sends no more: what it sent is answered, its replies still go out
      c.eof = true;
      return true;
    }
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.in.append(buf, (size_t)n);
    buffered_ += n;
    return true;
  }

  // With the budget full and a connection waiting to read, the connection holding the longest
  // unfinished line (no whole line waiting: those are answered and freed in their turns) gets an
  // error reply naming the limit and is closed, its bytes dropped (the stream cannot be
  // resynchronised): a few clients holding long partial lines cannot shut the others out.
  void evict_largest(std::vector<Conn>& conns, int64_t& answered) {
    Conn* big = nullptr;
    // (A connection behind a reset under way holds all its bytes until the reset is through.)
    for (Conn& c : conns)
      if (!c.closing && (c.resetting || !lines_left(c)) && (!big || c.in.size() > big->in.size())) big = &c;
    if (!big || big->in.empty()) return;
    const char* what = big->resetting ? "requests waiting behind its reset were the most bytes"
                                      : "unfinished line was the longest";
    spdlog::warn("serve: closing the connection from {}: the requests buffered across all connections reached {} "
                 "bytes ({}) with another waiting to read, and its {} ({} bytes)",
                 big->peer, budget_, budget_from_, what, big->in.size());
    if (!close_with_error(*big, answered, str("the requests buffered across all connections reached the server's "
                                              "limit of ", budget_, " bytes (", budget_from_, ") and this "
                                              "connection's ", what, "; closing the connection")))
      big->out.clear();  // past its reply buffer: it closes with nothing more to send
  }

  // The connection's unanswered request bytes dropped (it closes, or will never be read on).
  void drop_requests(Conn& c) {
    buffered_ -= (int64_t)c.in.size();
    c.in.clear();
    c.scanned = 0;
  }

  // A connection whose last reply is out shuts its sending side and lingers (Conn::shut); true
  // when it is kept to linger, false (the caller closes it) when --max-sessions of its kind (served,
  // refused) already linger.
  bool linger(Conn& c, std::chrono::steady_clock::time_point now) {
    if (lingering_[c.refused] >= opt_.max_sessions) return false;
    ++lingering_[c.refused];
    shutdown(c.fd, SHUT_WR);
    c.shut = true;
    c.linger_until = now + kLinger;
    return true;
  }

  // An error reply that ends the connection (a request stream that cannot be resynchronised): its
  // unanswered bytes dropped, the reply counted; false as reply() is.
  bool close_with_error(Conn& c, int64_t& answered, const std::string& why) {
    drop_reset(c, "its connection is closed");
    drop_requests(c);
    c.closing = true;
    ++answered;
    return reply(c, dump(json{{"error", why}}));
  }

  // Answers the connection's next lines, at most kLinesPerTurn (the rest wait for its next turn);
  // once the client sent its last, the bytes after the last newline are a line too. A line's "\r"
  // before its newline is dropped, and an empty line is skipped. False when the connection is to
  // close.
  bool answer_lines(Conn& c, int64_t& answered) {
    size_t start = 0;  // what the answered lines took is erased once, not line by line
    bool open = true;
    for (int lines = 0; open && lines < kLinesPerTurn;) {
      // Resets under way count: each is answered before the server stops.
      if (opt_.max_requests >= 0 && answered + (int64_t)resets_.size() >= opt_.max_requests) break;
      size_t nl = c.in.find('\n', std::max(start, c.scanned));
      if (nl == std::string::npos) {
        c.scanned = c.in.size();
        if ((int64_t)(c.in.size() - start) > opt_.max_message_bytes) {
          open = close_with_error(c, answered, str("message longer than ", opt_.max_message_bytes,
                                                   " bytes without a newline; closing the connection"));
          start = 0;  // all of `in` is dropped, the lines answered before it too
          break;
        }
        if (!c.eof || start == c.in.size()) break;
        nl = c.in.size();  // the last line, sent without its newline
      }
      if ((int64_t)(nl - start) > opt_.max_message_bytes + (nl > start && c.in[nl - 1] == '\r' ? 1 : 0)) {
        // Longer than the limit however the stream was split into reads.
        open = close_with_error(c, answered, str("message longer than ", opt_.max_message_bytes,
                                                 " bytes; closing the connection"));
        start = 0;
        break;
      }
      std::string line = c.in.substr(start, nl - start);
      start = std::min(nl + 1, c.in.size());
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      ++lines;
      const std::string r = handle(line, c);
      if (c.resetting) {  // its first piece now; answered once its last is in, the lines after it wait
        open = continue_reset(c, answered);
        if (c.resetting) break;
        continue;
      }
      ++answered;
      open = reply(c, r);
    }
    c.in.erase(0, start);
    buffered_ -= (int64_t)start;
    c.scanned = c.scanned > start ? c.scanned - start : 0;
    if (c.eof && c.in.empty() && !c.resetting) c.closing = true;
    if (c.closing) drop_requests(c);  // what is left is never answered
    return open;
  }

  // At exit (max_requests answered): what the clients still read is sent, waiting at most a
  // second for a socket that takes nothing.
  static void drain(std::vector<Conn>& conns) {
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Conn*> pending;
      for (Conn& c : conns)
        if (!c.out.empty()) {
          fds.push_back({c.fd, POLLOUT, 0});
          pending.push_back(&c);
        }
      if (fds.empty() || poll(fds.data(), fds.size(), 1000) <= 0) return;
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents && !flush(*pending[i])) pending[i]->out.clear();
    }
  }

  // A request's boolean field ("reset", "close"): false when absent.
  static bool flag(const json& j, const char* key) {
    if (!j.contains(key)) return false;
    if (!j.at(key).is_boolean())
      throw Error(str("\"", key, "\" is ", j.at(key).type_name(), " ", dump(j.at(key)).substr(0, 64),
                      ", expected the boolean true"));
    return j.at(key).get<bool>();
  }

  // Throws for a key outside `known` (a request of `kind`).
  static void check_keys(const json& j, const std::string& kind, const std::vector<std::string>& known) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + ("\"" + k + "\"");
      throw Error(str("unknown key \"", it.key().substr(0, 64), "\" beside \"", kind, "\" (expected ", list, ")"));
    }
  }

  // One request line -> one reply (never throws).
  std::string handle(const std::string& line, Conn& c) {
    std::string session;
    try {
      json j;
      try {
        j = parse_json_strict(line);
      } catch (const std::exception& e) {  // invalid JSON, or a key named twice
        const std::string what = e.what();
        throw Error(str("malformed JSON: ", what.size() > kMaxQuote ? what.substr(0, kMaxQuote) + "..." : what));
      }
      if (!j.is_object() || !j.contains("session") || !j.at("session").is_string())
        throw Error("expected a JSON object with a \"session\" string");
      const std::string& name = j.at("session").get_ref<const std::string&>();
      if (name.empty())
        throw Error(str("\"session\" must be a non-empty string (at most ", kMaxSessionName, " bytes)"));
      if (name.size() > kMaxSessionName)
        throw Error(str("\"session\" of ", name.size(), " bytes, expected at most ", kMaxSessionName));
      session = name;
      const bool reset = flag(j, "reset"), close = flag(j, "close"), step = j.contains("images");
      if (reset + close + step != 1) {
        std::string keys;
        for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key().substr(0, 64);
        throw Error(str(reset + close + step == 0 ? "a request without" : "a request with more than one of",
                        " \"reset\": true, \"images\" or \"close\": true (its keys: ", keys, ")"));
      }
      if (reset) {
        check_keys(j, "reset", {"session", "reset", "instruction", "close"});
        if (!j.contains("instruction") || !j.at("instruction").is_array() || j.at("instruction").empty())
          throw Error("reset needs \"instruction\": a non-empty list of token ids");
        std::vector<int32_t> ins;
        for (const json& t : j.at("instruction")) {
          if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= cfg_.vocab_size)
            throw Error(str("instruction holds ", dump(t).substr(0, 64), ", expected token ids in [0, ",
                            cfg_.vocab_size, ")"));
          ins.push_back(t.get<int32_t>());
        }
        if ((int64_t)ins.size() > max_instruction_)
          throw Error(str("instruction of ", ins.size(), " tokens exceeds the policy's context: ", context_,
                          " rows (min(max_position_embeddings, 16384)) hold at most ", max_instruction_,
                          " instruction tokens beside one step's ", step_rows_, " observation rows and ", tokens_,
                          " action token(s)"));
        close_idle_sessions();  // one past its time makes room even before the next poll
        if (const auto other = pending_names_.find(session); other != pending_names_.end())
          throw Error(str("session \"", session, "\" is being reset by another request (", other->second,
                          "); wait for its reply (the later reset of a name would be overwritten by the earlier)"));
        if (!sessions_.count(session) && open_names() >= opt_.max_sessions)
          throw Error(str("too many sessions (", opt_.max_sessions, ", --max-sessions); close one first",
                          opt_.session_idle_s > 0 ? str(", or wait for one to go unused for ", opt_.session_idle_s,
                                                        " s (--session-idle-s)")
                                                  : std::string()));
        // A fresh session takes the name only once its reset is through: a failed reset leaves an
        // existing session as it was and creates none. Its instruction goes in --reset-piece-rows
        // rows a turn (the first here), the other clients' requests answered between pieces.
        check_cache_budget(session, fresh_bytes_ - replaced_bytes(session), "reset");  // before allocating
        auto fresh = std::make_unique<Session>(*model_, window_, context_, seg_);
        fresh->policy.begin_reset(ins);
        pending_names_[session] = str(ins.size(), " instruction tokens, from ", c.peer);
        resets_[c.fd] = PendingReset{session, std::move(fresh), (int64_t)ins.size(), 0, Clock::now()};
        c.resetting = true;
        return std::string();
      }
      check_keys(j, close ? "close" : "images", close ? std::vector<std::string>{"session", "close", "reset"}
                                                      : std::vector<std::string>{"session", "images", "state", "reset",
                                                                                 "close"});
      auto it = sessions_.find(session);
      if (it == sessions_.end()) {
        const auto idle = closed_idle_.find(session);
        if (idle != closed_idle_.end())
          throw Error(str("session \"", session, "\" was closed after ", idle->second.idle_s, " s unused (--session-idle-s ",
                          opt_.session_idle_s, "); reset it"));
        throw Error(str("unknown session \"", session, "\" (reset it first)"));
      }
      it->second->used = Clock::now();
      if (close) {
        sessions_.erase(it);
        return dump(json{{"session", session}, {"ok", true}});
      }
      if (!j.at("images").is_array() || j.at("images").empty())
        throw Error("expected \"images\": a non-empty list of base64 PNG or JPEG images (or reset / close)");
      // One image a camera, as many as the policy was trained with, and the same in every step.
      const int64_t images = (int64_t)j.at("images").size();
      if (cameras_ > 0 && images != cameras_)
        throw Error(str(images, " images, expected ", cameras_, " (one a camera, as the policy was trained: ",
                        cameras_from_, ")"));
      if (it->second->cameras > 0 && images != it->second->cameras)
        throw Error(str(images, " images, but this session's earlier steps had ", it->second->cameras,
                        " (one a camera); reset the session to change cameras"));
      const int S = (int)cfg_.vision.image_size;
      const int64_t P = cfg_.vision.tokens_per_frame();
      if (images * P >= context_)
        throw Error(str(images, " images take ", images * P,
                        " rows, more than the policy's context of ", context_, " rows beside the instruction"));
      model::Observation obs;
      for (size_t k = 0; k < j.at("images").size(); ++k) {
        const json& im = j.at("images")[k];
        const std::string what = str("images[", k, "]");
        if (!im.is_string()) throw Error(str(what, ": expected a base64 string"));
        const std::string bytes = base64_decode(im.get<std::string>(), what);
        // The size from the header first: a wrong one is refused before its pixels are decoded.
        const data::ImageSize size = data::image_size_bytes(bytes, what);
        if (size.width != S || size.height != S)
          throw Error(str(what, ": ", size.width, " x ", size.height, " pixels, expected ", S, " x ", S,
                          " (the tower's vision.image_size)"));
        const data::Image img = data::decode_image_bytes(bytes, what);
        const data::FrameSpec fs;  // the tower's normalisation, as training frames get it
        obs.frames.push_back(data::tower_pixels(img, S, fs.mean, fs.std));
      }
      if (j.contains("state")) {
        const json& state = j.at("state");
        if (!state.is_array()) throw Error("\"state\" must be a list of numbers");
        for (size_t k = 0; k < state.size(); ++k) {
          if (!state[k].is_number())
            throw Error(str("\"state\"[", k, "] is ", state[k].type_name(), ", expected a number"));
          // Checked as a float, the policy's type: 1e39 is a finite double but an infinite float.
          const double v = state[k].get<double>();
          if (!(std::fabs(v) <= (double)std::numeric_limits<float>::max()))
            throw Error(str("\"state\"[", k, "] = ", v, ", expected a finite 32-bit float (|x| <= ",
                            std::numeric_limits<float>::max(), ")"));
          obs.state.push_back((float)v);
        }
      }
      if ((int64_t)obs.state.size() != cfg_.vision.state_dim)
        throw Error(str("\"state\" has ", obs.state.size(), " values, expected vision.state_dim = ",
                        cfg_.vision.state_dim));
      Session& s = *it->second;
      check_cache_budget(session, 0, "step");  // the retrieval pool grows with the episode
      const std::vector<int32_t> tokens = s.policy.act(obs, tokens_, first_, end_);
      s.cameras = images;
      json out = {{"session", session}, {"step", s.steps++}, {"tokens", tokens}};
      if (continuous_) {
        out["action"] = bins_.decode(tokens);
      } else {
        out["action_ids"] = tokens;
      }
      return dump(out);
    } catch (const std::bad_alloc&) {
      return out_of_memory(session);
    } catch (const std::exception& e) {
      return error_reply(session, e.what());
    }
  }

  static std::string error_reply(const std::string& session, const std::string& what) {
    json err = {{"error", what}};
    if (!session.empty()) err["session"] = session;
    return dump(err);
  }

  // A session's cache past the machine's memory.
  std::string out_of_memory(const std::string& session) const {
    return error_reply(session, str("out of memory with ", sessions_.size(), " sessions open (each one's cache grows "
                                    "with its context, up to ", context_, " rows); close sessions, or lower "
                                    "--max-sessions or --max-cache-bytes"));
  }

  // The session takes the name (replacing one of that name): its reset is through.
  void install(const std::string& name, std::unique_ptr<Session> fresh) {
    fresh->used = Clock::now();  // its idle time from its reply
    auto it = sessions_.find(name);
    if (it == sessions_.end()) {
      sessions_.emplace(name, std::move(fresh));
    } else {
      it->second = std::move(fresh);
    }
    closed_idle_.erase(name);
  }

  // Sessions open and names a reset under way will open: what --max-sessions bounds.
  int64_t open_names() const {
    int64_t n = (int64_t)sessions_.size();
    for (const auto& [name, what] : pending_names_) n += sessions_.count(name) ? 0 : 1;
    return n;
  }

  // The bytes of the open session a reset of `name` replaces (0: none open).
  int64_t replaced_bytes(const std::string& name) const {
    const auto it = sessions_.find(name);
    return it == sessions_.end() ? 0 : it->second->policy.bytes();
  }

  // The memory the sessions' contexts hold, with the resets under way: each counts what its fresh
  // context holds past the one it replaces (freed once it is through; until then both are held,
  // one extra context at most for each reset under way).
  int64_t cache_bytes() const {
    int64_t n = 0;
    for (const auto& [name, s] : sessions_) n += s->policy.bytes();
    for (const auto& [fd, r] : resets_) n += std::max<int64_t>(0, r.fresh->policy.bytes() - replaced_bytes(r.session));
    return n;
  }

  // Throws unless the sessions' contexts (cache_bytes) and `more` bytes fit --max-cache-bytes (a
  // reset's `more`: its fresh context less the one it replaces).
  void check_cache_budget(const std::string& session, int64_t more, const char* what) const {
    const int64_t held = cache_bytes();
    if (held + more <= cache_budget_) return;
    throw Error(str(what, " of session \"", session.substr(0, 64), "\" refused: the sessions' contexts hold ", held,
                    " bytes (", sessions_.size(), " sessions open, ", resets_.size(), " resets under way)",
                    more > 0 ? str(" and this one's takes ", more, " more") : std::string(), ", past the limit of ",
                    cache_budget_, " bytes (", cache_budget_from_, "); close sessions, or raise --max-cache-bytes"));
  }

  // The next piece of the connection's reset: once it is all in, the session takes its name and
  // the reset is answered (or its error is). False when the connection is to close.
  bool continue_reset(Conn& c, int64_t& answered) {
    PendingReset& r = resets_.at(c.fd);
    std::string text;
    try {
      const bool done = r.fresh->policy.reset_piece(opt_.reset_piece_rows);
      ++r.pieces;
      // With retrieval the fresh context grows with the instruction: stopped once the contexts are
      // past the limit while it holds more than the one it replaces (one that shrinks goes on).
      if (const int64_t held = cache_bytes();
          held > cache_budget_ && r.fresh->policy.bytes() > replaced_bytes(r.session)) {
        const std::string why =
            str("reset of session \"", r.session.substr(0, 64), "\" stopped after ", r.fresh->policy.reset_done(),
                " of its ", r.tokens, " instruction tokens: the sessions' contexts hold ", held,
                " bytes with it (with retrieval a context grows with its path), past the limit of ", cache_budget_,
                " bytes (", cache_budget_from_, "); close sessions, shorten the instruction or raise --max-cache-bytes");
        spdlog::warn("serve: {}", why);
        throw Error(why);
      }
      if (!done) return true;
      const double s = std::chrono::duration<double>(Clock::now() - r.started).count();
      if (r.pieces > 1)
        spdlog::info("serve: session {} reset: {} instruction tokens in {} pieces of --reset-piece-rows {}, {:.2f} s",
                   quoted(std::as_const(r.session)), r.tokens, r.pieces, opt_.reset_piece_rows, s);
      install(r.session, std::move(r.fresh));
      text = dump(json{{"session", r.session}, {"ok", true}});
    } catch (const std::bad_alloc&) {
      text = out_of_memory(r.session);
    } catch (const std::exception& e) {
      text = error_reply(r.session, e.what());
    }
    end_reset(c);
    ++answered;
    return reply(c, text);
  }

  void end_reset(Conn& c) {
    const auto it = resets_.find(c.fd);
    pending_names_.erase(it->second.session);
    resets_.erase(it);
    c.resetting = false;
  }

  // A reset under way whose connection closes is dropped (a log line): no one is told it is through.
  void drop_reset(Conn& c, const char* why) {
    if (!c.resetting) return;
    const PendingReset& r = resets_.at(c.fd);
    spdlog::warn("serve: session {}'s reset dropped after {} of its {} instruction tokens: {}", quoted(r.session),
                 r.fresh->policy.reset_done(), r.tokens, why);
    end_reset(c);
  }

  // Closes the sessions unused for session_idle_s (their names kept, a bounded number, for the
  // error a later request gets); returns poll()'s timeout in ms until the next one is due (-1:
  // none is).
  int close_idle_sessions() {
    if (opt_.session_idle_s <= 0 || sessions_.empty()) return -1;
    const Clock::time_point now = Clock::now();
    const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt_.session_idle_s));
    Clock::duration next = Clock::duration::max();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      const Clock::duration idle = now - it->second->used;
      if (idle < limit) {
        next = std::min(next, limit - idle);
        ++it;
        continue;
      }
      const double idle_s = std::round(std::chrono::duration<double>(idle).count() * 10) / 10;
      spdlog::info("serve: session {} closed after {} s unused (--session-idle-s {}); its {} steps' context freed",
                   quoted(it->first), idle_s, opt_.session_idle_s, it->second->steps);
      if (closed_idle_.size() >= kMaxClosedNames && !closed_idle_.count(it->first))
        closed_idle_.erase(std::min_element(closed_idle_.begin(), closed_idle_.end(), [](const auto& a, const auto& b) {
          return a.second.order < b.second.order;
        }));
      closed_idle_[it->first] = {idle_s, closed_count_++};
      it = sessions_.erase(it);
    }
    if (next == Clock::duration::max()) return -1;
    return (int)std::min<int64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(next).count() + 1, 1 << 30);
  }

  ServeOptions opt_;
  int64_t budget_ = 0;       // request bytes buffered across all connections, at most
  std::string budget_from_;  // the option that set it, for the error
  int64_t buffered_ = 0;     // the bytes in all connections' `in`
  int64_t lingering_[2] = {};  // connections lingering (Conn::shut), served and refused: each at most --max-sessions
  bool out_of_room_ = false;  // a connection found the budget full this turn
  std::string dir_;
  model::ModelConfig cfg_;
  int window_ = 0;
  model::SegmentConfig seg_;
  int64_t cameras_ = 0;       // images a step the policy was trained with (0: not known)
  std::string cameras_from_;  // where that was read
  int64_t context_ = 0;          // a session's KV cache rows: its positions stay below max_position_embeddings
  int64_t step_rows_ = 0;        // one frame's rows and the state row
  int64_t max_instruction_ = 0;  // tokens leaving room for the first step
  bool continuous_ = false;
  data::ActionBins bins_;
  int tokens_ = 1;
  int32_t first_ = 0, end_ = 0;
  std::unique_ptr<model::Decoder<Exec>> model_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  // Resets under way, by connection (its descriptor): a fresh session filled a piece a turn.
  struct PendingReset {
    std::string session;
    std::unique_ptr<Session> fresh;
    int64_t tokens = 0;  // the instruction's
    int64_t pieces = 0;  // in so far
    Clock::time_point started;
  };
  std::map<int, PendingReset> resets_;
  std::map<std::string, std::string> pending_names_;  // session name -> its reset under way (for the error)
  int64_t fresh_bytes_ = 0;  // a fresh session's context (every reset's, before its pieces)
  int64_t cache_budget_ = 0;                  // bytes the sessions' contexts may hold together
  std::string cache_budget_from_;             // what set it, for the error
  // Sessions closed for going unused: name -> seconds unused (the newest kMaxClosedNames; a reset
  // of the name forgets it).
  static constexpr size_t kMaxClosedNames = 4096;
  struct Closed {
    double idle_s = 0;
    uint64_t order = 0;  // the oldest goes first at the cap
  };
  std::map<std::string, Closed> closed_idle_;
  uint64_t closed_count_ = 0;
};

}  // namespace

int64_t run_serve(const ServeOptions& opt) {
  Server s(opt);
  return s.run();
}

}  // namespace tt::trainer
