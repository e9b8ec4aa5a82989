// Collectives of a data-parallel job: the interface the trainer uses, and its CPU implementation
// over the rendezvous's TCP star (the NCCL one is in nccl_communicator.h).
//
// Contract of every implementation:
//  - all_reduce_sum leaves on every rank the same values: the sum over ranks, in place.
//  - Buffers live where device_buffers() says: host memory (cpu) or device memory (nccl).
//  - Ordering: CPU collectives complete when they return. NCCL collectives are enqueued on the
//    communicator's own stream after the work already enqueued on the compute stream, and wait()
//    makes the compute stream wait for them (events, no host sync); call wait() before reading a
//    reduced buffer. Code written against this contract runs unchanged on both.
//  - all_reduce_host and barrier are host operations that return when complete (the loss
//    normaliser and metrics need their values on the host).
//  - Every error is a tt::Error tagged with host and rank (tag()).
//
// The CPU implementation is a star: rank 0 receives each chunk from every rank, sums it in rank
// order with fp64 accumulation (x0 + x1 + ... + x(W-1)), rounds once to the buffer's type and
// sends the same bytes back to everyone. The result is identical on all ranks and deterministic:
// it depends only on the values and the world size, not on timing. Chunks go in lockstep (a rank
// sends chunk c, then waits for its sum), so buffers of any size never fill the sockets both ways.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/rendezvous.h"

namespace tt::distributed {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;  // "cpu" | "nccl"
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string tag() const = 0;  // "rank 1/2 on host b (local rank 1)"
  virtual bool device_buffers() const = 0;

  virtual void all_reduce_sum(float* data, int64_t n) = 0;   // (n) summed over ranks, in place
  virtual void all_reduce_sum(double* data, int64_t n) = 0;  // (n)
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void wait() = 0;  // started collectives are visible to the compute stream (cpu: no-op)

  virtual void all_reduce_host(double* values, int64_t n) = 0;  // (n) host values, sum, blocking
  virtual void barrier() = 0;
  // Every rank's blob, by rank (host, blocking): fingerprints that must agree across ranks.
  virtual std::vector<std::string> all_gather_host(const std::string& blob) = 0;
};

// The CPU communicator over a connected rendezvous (which it owns).
std::unique_ptr<Communicator> make_cpu_communicator(std::unique_ptr<Rendezvous> rendezvous);

}  // namespace tt::distributed
