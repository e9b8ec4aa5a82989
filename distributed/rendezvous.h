// A small TCP rendezvous: connects the ranks of a job in a star around rank 0 and moves small
// blobs (the NCCL unique id, fingerprints, host names) and, for the CPU communicator, buffers.
//
// Rank 0 listens on every interface at MASTER_PORT; the others connect to MASTER_ADDR:MASTER_PORT,
// retrying until options.timeout_s. Each sends a hello (rank, world size, host, job id); rank 0
// checks it (the job's secret, rank in range, not taken, same world size) and, once all have arrived, sends everyone
// the host table. Every failure is a tt::Error tagged with this process's rank and host, e.g.
//   "rank 3/4 on host gpu07 (local rank 3): cannot connect to master 10.0.0.1:29500 within 60 s
//    (last error: Connection refused)".
//
// Only ranks that prove the job's secret join (TT_JOB_SECRET, env.h; the challenge, hello and
// welcome of auth.h): rank 0 refuses any other hello naming the claimed rank and host, and keeps
// waiting, so a process that knows only the job id cannot take a rank's place; a worker refuses a
// rank 0 whose welcome does not prove it.
// Only ranks of one job join (DistEnv::job_id, env.h): rank 0 refuses a hello with another job id,
// telling that peer both ids (it fails at once: "rejected by rank 0: job id mismatch: ..."), and
// keeps waiting for its own ranks. Rank 0 reads the hellos of all pending connections at once, so
// a connection that is not a rank of this job (silent, garbage, a port scan, another job) never
// delays the others; each is dropped after min(timeout_s, 10 s) of silence, at its first bad
// bytes or at its refusal, and the error of a rendezvous that does not complete names them.
// Every message length is bounded (wire.h: 64 MiB, a hello 4 KiB): a longer length prefix is an
// error naming the peer, never an allocation, and a blob's buffer grows only as its bytes arrive.
//
// Collectives (broadcast, all_gather, barrier, and the communicator's all-reduce) are numbered;
// each message carries its collective's kind and number, so ranks that call different
// collectives fail with a message naming both instead of exchanging garbage.
//
// Failure never hangs: a peer that exits closes its connection and the ranks waiting on it fail at
// once ("lost rank 1 (host b) during all_reduce #7: connection closed"); rank 0 failing closes
// every connection, so the others follow. A dead host (no FIN ever comes) is found by TCP
// keepalive within about timeout_s on an idle connection (with data in flight: by TCP's
// retransmission limit, about 15 minutes, or collective_timeout_s); a live peer that never joins
// a collective (hung) fails it after collective_timeout_s, which must exceed the longest
// legitimate wait (how much later than the others a slow rank reaches the collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/env.h"
#include "distributed/net.h"

namespace tt::distributed {

struct RendezvousOptions {
  double timeout_s = 60;               // connecting; detecting a lost peer host
  double collective_timeout_s = 1800;  // the longest wait inside one collective
};

// Kinds of messages; a mismatch names both.
enum class Op : uint32_t { kHello = 1, kWelcome, kBroadcast, kAllGather, kBarrier, kAllReduce, kReject, kChallenge };
const char* op_name(Op op);

class Rendezvous {
 public:
  // Connects the world described by env (world_size 1: nothing to connect). Throws tt::Error.
  static std::unique_ptr<Rendezvous> connect(const DistEnv& env, const RendezvousOptions& options);
  // Rank 0 only: listens on an already bound socket (tests bind port 0 to get a free port).
  static std::unique_ptr<Rendezvous> connect_with_listener(const DistEnv& env, const RendezvousOptions& options,
                                                           net::Socket listener);
  ~Rendezvous();

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  const DistEnv& env() const { return env_; }
  const RendezvousOptions& options() const { return options_; }
  const std::string& host_of(int rank) const { return hosts_.at(rank); }
  // "rank 1/2 on host b (local rank 1)": the prefix of every error.
  std::string tag() const { return env_.describe(); }

  // Every rank gets root's blob (the argument is read on root only).
  std::string broadcast(const std::string& blob, int root = 0);
  // Every rank gets all blobs, by rank.
  std::vector<std::string> all_gather(const std::string& blob);
  void barrier();

  // The star's framed links, for collectives built on top (the CPU communicator): rank 0 talks to
  // every rank, the others to rank 0. begin() starts collective `op` and returns its number; the
  // messages of that collective then carry (op, number) and must arrive before its deadline.
  uint64_t begin(Op op);
  void send(int peer, const void* data, size_t bytes);
  void recv(int peer, void* data, size_t bytes);  // exactly `bytes`, else an error
  void send_blob(int peer, const std::string& blob);
  std::string recv_blob(int peer);

 private:
  Rendezvous(const DistEnv& env, const RendezvousOptions& options);
  void connect_root(net::Socket listener);
  void connect_worker();
  net::Socket& link(int peer);
  uint64_t recv_header(int peer);  // checks the protocol and the collective; returns payload bytes
  void recv_payload(int peer, void* data, size_t bytes);
  std::string peer_name(int peer) const;  // "rank 1 (host b)"
  [[noreturn]] void fail_io(int peer, net::IoStatus status, const std::string& what, const std::string& err) const;
  std::string current() const;  // "all_reduce #7"

  DistEnv env_;
  RendezvousOptions options_;
  std::vector<std::string> hosts_;  // (world_size) host of each rank
  std::vector<net::Socket> links_;  // (world_size) rank 0: one per rank; others: [0]
  Op op_ = Op::kHello;
  uint64_t seq_ = 0;
  net::Deadline deadline_;
};

}  // namespace tt::distributed
