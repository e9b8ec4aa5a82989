// The star rendezvous (see rendezvous.h; the wire format is wire.h).
#include "distributed/rendezvous.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include <spdlog/spdlog.h>

#include "base/check.h"
#include "distributed/auth.h"
#include "distributed/wire.h"

namespace tt::distributed {
namespace {

std::string seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str() + " s";
}

std::string job_name(const std::string& id, const std::string& var) {
  return id.empty() ? std::string("none (no TT_JOB_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID)")
                    : str("'", id, "' (", var.empty() ? "?" : var, ")");
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::kHello: return "hello";
    case Op::kWelcome: return "welcome";
    case Op::kBroadcast: return "broadcast";
    case Op::kAllGather: return "all_gather";
    case Op::kBarrier: return "barrier";
    case Op::kAllReduce: return "all_reduce";
    case Op::kReject: return "reject";
    case Op::kChallenge: return "challenge";
  }
  return "unknown";
}

Rendezvous::Rendezvous(const DistEnv& env, const RendezvousOptions& options)
    : env_(env), options_(options), hosts_(env.world_size), links_(env.world_size) {
  if (env_.host.empty()) env_.host = hostname();
  hosts_[env_.rank] = env_.host;
  TT_CHECK(options_.timeout_s > 0 && options_.collective_timeout_s > 0, "distributed timeouts must be positive");
}

Rendezvous::~Rendezvous() = default;

std::unique_ptr<Rendezvous> Rendezvous::connect(const DistEnv& env, const RendezvousOptions& options) {
  std::unique_ptr<Rendezvous> r(new Rendezvous(env, options));
  if (env.world_size == 1) return r;
  if (env.rank == 0) {
    r->connect_root(net::listen_on(env.master_port, r->tag()));
  } else {
    r->connect_worker();
  }
  return r;
}

std::unique_ptr<Rendezvous> Rendezvous::connect_with_listener(const DistEnv& env, const RendezvousOptions& options,
                                                              net::Socket listener) {
  TT_CHECK(env.rank == 0, "only rank 0 listens");
  std::unique_ptr<Rendezvous> r(new Rendezvous(env, options));
  if (env.world_size > 1) r->connect_root(std::move(listener));
  return r;
}

net::Socket& Rendezvous::link(int peer) {
  TT_CHECK(peer >= 0 && peer < world_size() && peer != rank() && (rank() == 0 || peer == 0), tag(),
           ": no link to rank ", peer, " (the rendezvous is a star around rank 0)");
  return links_[peer];
}

std::string Rendezvous::current() const { return str(op_name(op_), " #", seq_); }

void Rendezvous::fail_io(int peer, net::IoStatus status, const std::string& what, const std::string& err) const {
  const std::string who = str("rank ", peer, " (host ", hosts_[peer].empty() ? "?" : hosts_[peer], ")");
  switch (status) {
    case net::IoStatus::kClosed:
      throw Error(str(tag(), ": lost ", who, " during ", current(), ": ", err,
                      " (it exited or crashed, or its host is unreachable; see its log)"));
    case net::IoStatus::kTimeout:
      if (op_ == Op::kHello || op_ == Op::kWelcome || op_ == Op::kChallenge)
        throw Error(str(tag(), ": ", who, " did not complete the rendezvous within ", seconds(options_.timeout_s),
                        " (distributed.timeout_s); did every rank start?"));
      throw Error(str(tag(), ": ", who, " did not ", what, " within ", seconds(options_.collective_timeout_s), " during ",
                      current(), " (distributed.collective_timeout_s); is it hung, or still in an earlier step?"));
    default:
      throw Error(str(tag(), ": socket error with ", who, " during ", current(), ": ", err));
  }
}

uint64_t Rendezvous::begin(Op op) {
  op_ = op;
  ++seq_;
  deadline_ = net::deadline_after(options_.collective_timeout_s);
  return seq_;
}

std::string Rendezvous::peer_name(int peer) const {
  return str("rank ", peer, " (host ", hosts_[peer].empty() ? "?" : hosts_[peer], ")");
}

void Rendezvous::send(int peer, const void* data, size_t bytes) {
  net::Socket& s = link(peer);
  TT_CHECK(bytes <= wire::kMaxMessageBytes, tag(), ": a message of ", bytes, " bytes to ", peer_name(peer), " during ",
           current(), " is larger than the protocol's maximum of ", wire::kMaxMessageBytes, " bytes");
  char h[wire::kHeaderBytes];
  wire::encode_header({wire::kMagic, (uint32_t)op_, seq_, (uint64_t)bytes}, h);
  std::string err;
  net::IoStatus st = net::send_all(s, h, sizeof(h), deadline_, &err);
  if (st == net::IoStatus::kOk && bytes > 0) st = net::send_all(s, data, bytes, deadline_, &err);
  if (st != net::IoStatus::kOk) fail_io(peer, st, "take data", err);
}

uint64_t Rendezvous::recv_header(int peer) {
  net::Socket& s = link(peer);
  char bytes[wire::kHeaderBytes];
  std::string err;
  const net::IoStatus st = net::recv_all(s, bytes, sizeof(bytes), deadline_, &err);
  if (st != net::IoStatus::kOk) fail_io(peer, st, "send", err);
  const wire::Header h = wire::decode_header(bytes);
  const std::string problem = wire::header_problem(h, wire::kMaxMessageBytes);
  if (!problem.empty()) throw Error(str(tag(), ": ", peer_name(peer), " ", problem, " during ", current()));
  if (h.op == (uint32_t)Op::kReject) {
    // Only rank 0 rejects; from another rank it is a peer speaking out of turn.
    if (peer != 0)
      throw Error(str(tag(), ": ", peer_name(peer), " sent a reject message during ", current(),
                      ", which only rank 0 sends (a peer that is not a treetrain rank of this job?)"));
    std::string why(std::min<uint64_t>(h.bytes, wire::kMaxHelloBytes), '\0');
    net::recv_all(s, why.data(), why.size(), deadline_, &err);
    throw Error(str(tag(), ": rejected by rank 0: ", why));
  }
  if (h.op != (uint32_t)op_ || h.seq != seq_)
    throw Error(str(tag(), ": collective mismatch with ", peer_name(peer), ": it is in ", op_name((Op)h.op), " #", h.seq,
                    ", this rank in ", current(), " (every rank must call the same collectives in the same order)"));
  return h.bytes;
}

void Rendezvous::recv_payload(int peer, void* data, size_t bytes) {
  if (bytes == 0) return;
  std::string err;
  const net::IoStatus st = net::recv_all(link(peer), data, bytes, deadline_, &err);
  if (st != net::IoStatus::kOk) fail_io(peer, st, "send", err);
}

void Rendezvous::recv(int peer, void* data, size_t bytes) {
  const uint64_t got = recv_header(peer);
  if (got != bytes)
    throw Error(str(tag(), ": ", peer_name(peer), " sent ", got, " bytes for ", current(), ", expected ", bytes,
                    " (buffers of different sizes on different ranks?)"));
  recv_payload(peer, data, bytes);
}

void Rendezvous::send_blob(int peer, const std::string& blob) { send(peer, blob.data(), blob.size()); }

std::string Rendezvous::recv_blob(int peer) {
  const uint64_t n = recv_header(peer);
  // The buffer grows as the bytes arrive (1 MiB, then doubling), so a length that the peer never
  // sends costs no memory.
  std::string blob;
  while (blob.size() < n) {
    const size_t at = blob.size();
    const size_t len = (size_t)std::min<uint64_t>(n - at, std::max<size_t>(size_t(1) << 20, at));
    blob.resize(at + len);
    recv_payload(peer, blob.data() + at, len);
  }
  return blob;
}

// Connections rank 0 keeps waiting for a hello at once beyond the world's ranks (see connect_root),
// and how long a silent one is kept before it may make room for another.
constexpr int kMaxStrayHellos = 64;
constexpr double kHelloGraceS = 0.2;

// What waits on s now, without reading it: bytes (a hello that has arrived but not been read
// yet), nothing, or the end of the stream (the peer closed or reset its end: a rank that joined on
// it is gone; a rank sends nothing between its hello and the welcome).
enum class Peek { kBytes, kNothing, kClosed };
Peek peek(const net::Socket& s) {
  char c;
  const ssize_t n = ::recv(s.fd(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return Peek::kBytes;
  return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ? Peek::kClosed : Peek::kNothing;
}

void Rendezvous::connect_root(net::Socket listener) {
  const int world = world_size();
  const net::Deadline deadline = net::deadline_after(options_.timeout_s);
  const double hello_s = std::min(options_.timeout_s, 10.0);
  op_ = Op::kHello;
  seq_ = 0;
  // Connections whose hello has not fully arrived, read together so none delays another.
  struct Pending {
    net::Socket s;
    std::string from;  // the peer's address
    net::Deadline deadline;
    std::string got;   // the header and then the hello, as they arrive
    net::Clock::time_point since;  // accepted at
    bool evicted;      // dropped at this turn to make room (max_pending)
    std::string nonce;  // the challenge sent to it
  };
  std::vector<Pending> pending;
  // A flood of silent connections must not use up the descriptors real ranks need: at most
  // max_pending wait for a hello. At the cap the oldest one silent past its grace (nothing unread on
  // its socket either) makes room; while none is, the others wait in the listener's queue (a rank
  // sends its hello at once).
  const size_t max_pending = (size_t)world + kMaxStrayHellos;
  const auto grace = std::chrono::duration_cast<net::Clock::duration>(std::chrono::duration<double>(kHelloGraceS));
  std::vector<std::string> dropped;  // "127.0.0.1:4242 sent no hello within 10 s", for the timeout error (8 kept)
  size_t dropped_count = 0;
  auto drop = [&](size_t i, const std::string& why) {
    if (dropped.size() < 8) dropped.push_back(str(pending[i].from, " ", why));
    ++dropped_count;
    pending.erase(pending.begin() + (long)i);
  };
  // A short message to a connection that is not (yet) a rank: a challenge or a refusal, a few
  // bytes into its socket buffer within a second; "" when sent, else why not.
  auto send_now = [](net::Socket& s, Op op, const std::string& payload) {
    char h[wire::kHeaderBytes];
    wire::encode_header({wire::kMagic, (uint32_t)op, 0, payload.size()}, h);
    std::string err;
    const net::Deadline d = net::deadline_after(1);
    net::IoStatus st = net::send_all(s, h, sizeof(h), d, &err);
    if (st == net::IoStatus::kOk) st = net::send_all(s, payload.data(), payload.size(), d, &err);
    return st == net::IoStatus::kOk ? std::string() : err;
  };
  auto refuse = [&](Pending& p, const std::string& why) { send_now(p.s, Op::kReject, why.substr(0, wire::kMaxHelloBytes)); };
  // Per rank, the challenge's nonce and the hello's, which the welcome's proof covers.
  std::vector<std::pair<std::string, std::string>> nonces(world);
  int joined = 1;
  // A joined rank whose connection has closed since its hello (it crashed, it restarts): forgotten,
  // so that it may join again. True when rank r is not (or no longer) joined.
  auto forget_if_gone = [&](int r) {
    if (!links_[r].valid()) return true;
    if (peek(links_[r]) != Peek::kClosed) return false;
    spdlog::warn("{}: rank {} (host {}) closed its connection before the ranks had all joined; waiting for it to "
                 "join again",
                 tag(), r, hosts_[r]);
    links_[r] = net::Socket();
    --joined;
    return true;
  };
  for (;;) {
    if (joined == world) {  // every rank in: unless one has gone since its hello
      for (int r = 1; r < world; ++r) forget_if_gone(r);
      if (joined == world) break;
    }
    const net::Clock::time_point now = net::Clock::now();
    if (pending.size() >= max_pending)  // a rank's hello comes at once, whole: any other stall can go
      for (Pending& p : pending)
        if (!p.evicted && now - p.since >= grace && peek(p.s) != Peek::kBytes) {
          p.evicted = true;
          p.deadline = now;
          break;
        }
    for (size_t i = pending.size(); i-- > 0;) {
      if (now < pending[i].deadline) continue;
      drop(i, pending[i].evicted      ? str("was dropped: ", pending[i].got.empty() ? "silent" : "stalled in its hello",
                                            " for ", seconds(kHelloGraceS), " while ", max_pending,
                                            " connections waited to say hello")
              : pending[i].got.empty() ? str("sent no hello within ", seconds(hello_s))
                                       : str("sent ", pending[i].got.size(), " bytes of a hello, not all of it, within ",
                                             seconds(hello_s)));
    }
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 1; r < world; ++r)
        if (!links_[r].valid()) missing.push_back(r);
      std::ostringstream m;
      for (size_t i = 0; i < missing.size() && i < 16; ++i) m << (i ? ", " : "") << missing[i];
      if (missing.size() > 16) m << " and " << missing.size() - 16 << " more";
      std::ostringstream d;
      for (size_t i = 0; i < dropped.size(); ++i) d << (i ? "; " : "") << dropped[i];
      if (dropped_count > dropped.size()) d << "; and " << dropped_count - dropped.size() << " more";
      throw Error(str(tag(), ": only ", joined, " of ", world, " ranks joined within ", seconds(options_.timeout_s),
                      " on port ", env_.master_port, " (missing rank", missing.size() > 1 ? "s " : " ", m.str(),
                      "); did they start, and can they reach MASTER_ADDR=", env_.master_addr, "?",
                      dropped.empty() ? "" : " Connections refused or dropped: ", d.str()));
    }
    // Wait for a connection or hello bytes, or the next deadline.
    net::Deadline wake = deadline;
    for (const Pending& p : pending) wake = std::min(wake, p.deadline);
    const bool full = pending.size() >= max_pending;  // then the listener waits: its queue holds the rest
    if (full)
      for (const Pending& p : pending)
        if (!p.evicted) wake = std::min(wake, p.since + grace);
    std::vector<pollfd> fds = {{listener.fd(), (short)(full ? 0 : POLLIN), 0}};
    for (const Pending& p : pending) fds.push_back({p.s.fd(), POLLIN, 0});
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - net::Clock::now()).count();
    const int ready = ::poll(fds.data(), fds.size(), (int)std::clamp<long long>(ms + 1, 0, 1 << 30));
    if (ready < 0 && errno != EINTR) throw Error(str(tag(), ": poll() while ranks join: ", std::strerror(errno)));
    if (ready <= 0) continue;
    if (fds[0].revents != 0) {
      while (pending.size() < max_pending) {
        net::Socket s = net::accept_until(listener, net::Clock::now());
        if (!s.valid()) break;
        net::configure(s, options_.timeout_s);
        const std::string from = net::peer_address(s);
        // The challenge: a fresh nonce the hello's proof must cover (a peer whose socket does not
        // take even that is dropped).
        const std::string nonce = auth::nonce();
        const std::string err = send_now(s, Op::kChallenge, nonce);
        if (!err.empty()) {
          if (dropped.size() < 8) dropped.push_back(str(from, " could not be sent a challenge (", err, ")"));
          ++dropped_count;
          continue;
        }
        pending.push_back({std::move(s), from, std::min(deadline, net::deadline_after(hello_s)), "", net::Clock::now(),
                           false, nonce});
      }
    }
    for (size_t i = std::min(fds.size() - 1, pending.size()); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      // The header first, then exactly the payload it announces (nothing beyond the hello).
      size_t want = wire::kHeaderBytes;
      wire::Header h;
      if (p.got.size() >= wire::kHeaderBytes) {
        h = wire::decode_header(p.got.data());
        want += (size_t)h.bytes;
      }
      char buf[4096];
      size_t n = 0;
      std::string err;
      if (net::recv_some(p.s, buf, std::min(sizeof(buf), want - p.got.size()), &n, &err) != net::IoStatus::kOk) {
        drop(i, str("closed the connection (", err, ") after ", p.got.size(), " bytes, before its hello"));
        continue;
      }
      const bool had_header = p.got.size() >= wire::kHeaderBytes;
      p.got.append(buf, n);
      if (!had_header) {  // bytes that cannot begin a hello's magic: dropped now, not at its deadline
        char magic[4];
        const uint32_t m = wire::kMagic;
        std::memcpy(magic, &m, 4);
        const size_t k = std::min<size_t>(p.got.size(), 4);
        if (std::memcmp(p.got.data(), magic, k) != 0) {
          if (k < 4) {
            drop(i, str("sent ", p.got.size(), " byte", p.got.size() == 1 ? "" : "s",
                        " that do not begin treetrain's protocol (not a rank of this job)"));
          } else {
            char whole[wire::kHeaderBytes] = {};
            std::memcpy(whole, p.got.data(), 4);
            drop(i, wire::header_problem(wire::decode_header(whole), wire::kMaxHelloBytes));
          }
          continue;
        }
      }
      if (!had_header && p.got.size() >= wire::kHeaderBytes) {
        h = wire::decode_header(p.got.data());
        std::string problem = wire::header_problem(h, wire::kMaxHelloBytes);
        if (problem.empty() && h.op != (uint32_t)Op::kHello)
          problem = str("sent a message of kind ", op_name((Op)h.op), " instead of a hello");
        if (!problem.empty()) {
          drop(i, problem);
          continue;
        }
      }
      if (p.got.size() < wire::kHeaderBytes || p.got.size() < wire::kHeaderBytes + h.bytes) continue;

      wire::Hello hello;
      try {
        hello = wire::decode_hello(p.got.substr(wire::kHeaderBytes));
      } catch (const Error& e) {
        refuse(p, str("rank 0 got ", e.what()));
        drop(i, str("sent ", e.what()));
        continue;
      }
      if (hello.job_id != env_.job_id) {
        // Another job's rank (two jobs on one master port): refused; this job goes on waiting.
        const std::string why =
            str("job id mismatch: rank ", hello.rank, " on host ", hello.host, " is of job ", job_name(hello.job_id, hello.job_id_var),
                ", rank 0 on host ", env_.host, " of job ", job_name(env_.job_id, env_.job_id_var),
                " (another job's rank 0 on this master port, or a launcher that gave its ranks different ids)");
        refuse(p, why);
        drop(i, str("was refused: ", why));
        continue;
      }
      std::string problem, hint = " (check RANK/WORLD_SIZE or the srun task count)";
      const bool have_secret = !env_.secret.empty();
      if (hello.secret_set != have_secret) {
        problem = str("rank ", hello.rank, " on host ", hello.host, hello.secret_set ? " has" : " has no",
                      " TT_JOB_SECRET and rank 0 on host ", env_.host, have_secret ? " has one" : " has none",
                      " (every rank needs the same one)");
        hint = " (give every rank the same TT_JOB_SECRET)";
      } else if (!auth::same_mac(hello.mac, wire::hello_mac(env_.secret, p.nonce, hello))) {
        problem = str("rank ", hello.rank, " on host ", hello.host,
                      " did not prove rank 0's TT_JOB_SECRET (its secret differs: one of them belongs to another "
                      "attempt of this job, or the peer knows only the job id)");
        hint = "";
      } else if (hello.world_size != world) {
        problem = str("rank ", hello.rank, " on host ", hello.host, " has world size ", hello.world_size, ", rank 0 has ",
                      world);
      } else if (hello.rank < 1 || hello.rank >= world) {
        problem = str("host ", hello.host, " claims rank ", hello.rank, ", outside 1..", world - 1);
      } else if (!forget_if_gone(hello.rank)) {
        problem = str("rank ", hello.rank, " joined twice (from host ", hosts_[hello.rank], " and host ", hello.host, ")");
      }
      if (!problem.empty()) {
        // Refused, and this job goes on waiting: a stray connection that claims a rank must not stop
        // it. A misconfigured rank learns why at once; rank 0's timeout error names it too.
        refuse(p, problem);
        drop(i, str("was refused: ", problem, hint));
        continue;
      }
      hosts_[hello.rank] = hello.host;
      nonces[hello.rank] = {p.nonce, hello.nonce};
      links_[hello.rank] = std::move(p.s);
      pending.erase(pending.begin() + (long)i);
      ++joined;
    }
  }
  // Welcome: the host table.
  op_ = Op::kWelcome;
  deadline_ = net::deadline_after(options_.timeout_s);
  const std::string table = wire::encode_host_table(hosts_);
  for (int r = 1; r < world; ++r)
    send_blob(r, wire::encode_welcome(wire::welcome_mac(env_.secret, nonces[r].first, nonces[r].second, table), table));
}

void Rendezvous::connect_worker() {
  const net::Deadline deadline = net::deadline_after(options_.timeout_s);
  std::string last_error = "none";
  net::Socket s = net::connect_until(env_.master_addr, env_.master_port, deadline, &last_error);
  if (!s.valid())
    throw Error(str(tag(), ": cannot connect to master ", env_.master_addr, ":", env_.master_port, " within ",
                    seconds(options_.timeout_s), " (last error: ", last_error,
                    "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?"));
  net::configure(s, options_.timeout_s);
  links_[0] = std::move(s);
  hosts_[0] = env_.master_addr;
  op_ = Op::kHello;
  seq_ = 0;
  // Rank 0 accepts for timeout_s from its start, which is before this connection: the welcome
  // comes within timeout_s from now, or rank 0 has failed (and closed the connection).
  deadline_ = net::deadline_after(options_.timeout_s + 1);
  // What rank 0 sends is read first (a refusal or a timeout fails there, with its own message),
  // then decoded: a malformed one names rank 0 and the message.
  auto malformed = [&](const Error& e, const std::string& hint) {
    return Error(str(tag(), ": ", peer_name(0), " sent ", e.what(), " during ", current(), hint));
  };
  op_ = Op::kChallenge;
  const std::string challenge = recv_blob(0);
  std::string root_nonce;
  try {
    root_nonce = wire::decode_challenge(challenge);
  } catch (const Error& e) {
    throw malformed(e, " (is something other than treetrain's rank 0 on MASTER_PORT?)");
  }
  wire::Hello hello{rank(), world_size(), env_.host, !env_.secret.empty(), auth::nonce(), "", env_.job_id,
                    env_.job_id_var};
  hello.mac = wire::hello_mac(env_.secret, root_nonce, hello);
  op_ = Op::kHello;
  send_blob(0, wire::encode_hello(hello));
  op_ = Op::kWelcome;
  const std::string blob = recv_blob(0);
  wire::Welcome welcome;
  try {
    welcome = wire::decode_welcome(blob);
    hosts_ = wire::decode_host_table(welcome.table, world_size());
  } catch (const Error& e) {
    throw malformed(e, "");
  }
  if (!auth::same_mac(welcome.mac, wire::welcome_mac(env_.secret, root_nonce, hello.nonce, welcome.table)))
    throw Error(str(tag(), ": the rank 0 at ", env_.master_addr, ":", env_.master_port,
                    " did not prove this rank's TT_JOB_SECRET in its welcome (another job's rank 0 on this port, or "
                    "ranks started with different secrets)"));
}

std::string Rendezvous::broadcast(const std::string& blob, int root) {
  TT_CHECK(root >= 0 && root < world_size(), tag(), ": broadcast root ", root, " is not a rank");
  if (world_size() == 1) return blob;
  begin(Op::kBroadcast);
  std::string value = blob;
  if (rank() == 0) {
    if (root != 0) value = recv_blob(root);
    for (int r = 1; r < world_size(); ++r)
      if (r != root) send_blob(r, value);
  } else if (rank() == root) {
    send_blob(0, value);
  } else {
    value = recv_blob(0);
  }
  return value;
}

std::vector<std::string> Rendezvous::all_gather(const std::string& blob) {
  if (world_size() == 1) return {blob};
  begin(Op::kAllGather);
  std::vector<std::string> all(world_size());
  if (rank() == 0) {
    all[0] = blob;
    for (int r = 1; r < world_size(); ++r) all[r] = recv_blob(r);
    const std::string packed = wire::pack_blobs(all);
    for (int r = 1; r < world_size(); ++r) send_blob(r, packed);
  } else {
    send_blob(0, blob);
    const std::string packed = recv_blob(0);  // its own errors (a timeout, a lost link) say so
    try {
      all = wire::unpack_blobs(packed, world_size());
    } catch (const Error& e) {
      throw Error(str(tag(), ": ", peer_name(0), " sent ", e.what(), " during ", current()));
    }
  }
  return all;
}

void Rendezvous::barrier() {
  if (world_size() == 1) return;
  begin(Op::kBarrier);
  if (rank() == 0) {
    for (int r = 1; r < world_size(); ++r) recv(r, nullptr, 0);
    for (int r = 1; r < world_size(); ++r) send(r, nullptr, 0);
  } else {
    send(0, nullptr, 0);
    recv(0, nullptr, 0);
  }
}

}  // namespace tt::distributed
