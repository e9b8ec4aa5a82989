// The star rendezvous (see rendezvous.h).
//
// Wire format: every message is a 24-byte header {magic, op, collective number, payload bytes}
// followed by the payload, in host byte order (all ranks of a job run the same build on the same
// architecture). The hello payload is "<rank> <world_size> <host>".
#include "distributed/rendezvous.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "base/check.h"

namespace tt::distributed {
namespace {

constexpr uint32_t kMagic = 0x50447454;  // "TtDP"
constexpr uint64_t kMaxBlob = uint64_t(1) << 30;

struct Header {
  uint32_t magic;
  uint32_t op;
  uint64_t seq;
  uint64_t bytes;
};
static_assert(sizeof(Header) == 24, "the wire header is 24 bytes");

std::string seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str() + " s";
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
      if (op_ == Op::kHello || op_ == Op::kWelcome)
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

void Rendezvous::send(int peer, const void* data, size_t bytes) {
  net::Socket& s = link(peer);
  const Header h{kMagic, (uint32_t)op_, seq_, (uint64_t)bytes};
  std::string err;
  net::IoStatus st = net::send_all(s, &h, sizeof(h), deadline_, &err);
  if (st == net::IoStatus::kOk && bytes > 0) st = net::send_all(s, data, bytes, deadline_, &err);
  if (st != net::IoStatus::kOk) fail_io(peer, st, "take data", err);
}

uint64_t Rendezvous::recv_header(int peer) {
  net::Socket& s = link(peer);
  Header h{};
  std::string err;
  const net::IoStatus st = net::recv_all(s, &h, sizeof(h), deadline_, &err);
  if (st != net::IoStatus::kOk) fail_io(peer, st, "send", err);
  const std::string who = str("rank ", peer, " (host ", hosts_[peer], ")");
  if (h.magic != kMagic || h.bytes > kMaxBlob)
    throw Error(str(tag(), ": ", who, " sent a message that is not treetrain's protocol"));
  if (h.op == (uint32_t)Op::kReject) {
    std::string why(std::min<uint64_t>(h.bytes, 4096), '\0');
    net::recv_all(s, why.data(), why.size(), deadline_, &err);
    throw Error(str(tag(), ": rejected by rank 0: ", why));
  }
  if (h.op != (uint32_t)op_ || h.seq != seq_)
    throw Error(str(tag(), ": collective mismatch with ", who, ": it is in ", op_name((Op)h.op), " #", h.seq,
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
    throw Error(str(tag(), ": rank ", peer, " (host ", hosts_[peer], ") sent ", got, " bytes for ", current(),
                    ", expected ", bytes, " (buffers of different sizes on different ranks?)"));
  recv_payload(peer, data, bytes);
}

void Rendezvous::send_blob(int peer, const std::string& blob) {
  TT_CHECK(blob.size() <= kMaxBlob, tag(), ": blob of ", blob.size(), " bytes is larger than 1 GiB");
  send(peer, blob.data(), blob.size());
}

std::string Rendezvous::recv_blob(int peer) {
  std::string blob(recv_header(peer), '\0');
  recv_payload(peer, blob.data(), blob.size());
  return blob;
}

void Rendezvous::connect_root(net::Socket listener) {
  const int world = world_size();
  const net::Deadline deadline = net::deadline_after(options_.timeout_s);
  op_ = Op::kHello;
  seq_ = 0;
  int joined = 1;
  while (joined < world) {
    net::Socket s = net::accept_until(listener, deadline);
    if (!s.valid()) {
      std::vector<int> missing;
      for (int r = 1; r < world; ++r)
        if (!links_[r].valid()) missing.push_back(r);
      std::ostringstream m;
      for (size_t i = 0; i < missing.size(); ++i) m << (i ? ", " : "") << missing[i];
      throw Error(str(tag(), ": only ", joined, " of ", world, " ranks joined within ", seconds(options_.timeout_s),
                      " on port ", env_.master_port, " (missing rank", missing.size() > 1 ? "s " : " ", m.str(),
                      "); did they start, and can they reach MASTER_ADDR=", env_.master_addr, "?"));
    }
    net::configure(s, options_.timeout_s);
    // The hello must follow the connection promptly; a silent connection is dropped.
    const net::Deadline hello_deadline = std::min(deadline, net::deadline_after(std::min(options_.timeout_s, 10.0)));
    Header h{};
    std::string err;
    if (net::recv_all(s, &h, sizeof(h), hello_deadline, &err) != net::IoStatus::kOk || h.magic != kMagic ||
        h.op != (uint32_t)Op::kHello || h.bytes > 4096)
      continue;  // not a treetrain rank (a port scan, a health check): ignore it
    std::string text(h.bytes, '\0');
    if (net::recv_all(s, text.data(), text.size(), hello_deadline, &err) != net::IoStatus::kOk) continue;
    std::istringstream in(text);
    int peer = -1, peer_world = -1;
    std::string peer_host;
    in >> peer >> peer_world >> peer_host;
    std::string problem;
    if (!in || peer_host.empty()) {
      problem = "a malformed hello";
    } else if (peer_world != world) {
      problem = str("rank ", peer, " on host ", peer_host, " has world size ", peer_world, ", rank 0 has ", world);
    } else if (peer < 1 || peer >= world) {
      problem = str("host ", peer_host, " claims rank ", peer, ", outside 1..", world - 1);
    } else if (links_[peer].valid()) {
      problem = str("rank ", peer, " joined twice (from host ", hosts_[peer], " and host ", peer_host, ")");
    }
    if (!problem.empty()) {
      const Header r{kMagic, (uint32_t)Op::kReject, 0, problem.size()};
      net::send_all(s, &r, sizeof(r), hello_deadline, &err);
      net::send_all(s, problem.data(), problem.size(), hello_deadline, &err);
      throw Error(str(tag(), ": bad rendezvous: ", problem, " (check RANK/WORLD_SIZE or the srun task count)"));
    }
    hosts_[peer] = peer_host;
    links_[peer] = std::move(s);
    ++joined;
  }
  // Welcome: the host table, one name per line.
  op_ = Op::kWelcome;
  deadline_ = net::deadline_after(options_.timeout_s);
  std::string table;
  for (const std::string& h : hosts_) table += h + "\n";
  for (int r = 1; r < world; ++r) send_blob(r, table);
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
  send_blob(0, str(rank(), " ", world_size(), " ", env_.host));
  op_ = Op::kWelcome;
  const std::string table = recv_blob(0);
  std::istringstream in(table);
  for (int r = 0; r < world_size(); ++r) {
    std::string h;
    std::getline(in, h);
    if (!h.empty()) hosts_[r] = h;
  }
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
    std::string packed;
    for (const std::string& b : all) {
      const uint64_t n = b.size();
      packed.append(reinterpret_cast<const char*>(&n), sizeof(n));
      packed += b;
    }
    for (int r = 1; r < world_size(); ++r) send_blob(r, packed);
  } else {
    send_blob(0, blob);
    const std::string packed = recv_blob(0);
    size_t at = 0;
    for (int r = 0; r < world_size(); ++r) {
      uint64_t n = 0;
      TT_CHECK(at + sizeof(n) <= packed.size(), tag(), ": truncated all_gather reply");
      std::memcpy(&n, packed.data() + at, sizeof(n));
      at += sizeof(n);
      TT_CHECK(at + n <= packed.size(), tag(), ": truncated all_gather reply");
      all[r] = packed.substr(at, n);
      at += n;
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
