// Bucketed gradient all-reduce: overlaps the gradient sum with the rest of backward.
//
// The flat gradient buffer (model::param_table layout: parameter i at [offset_i, offset_i +
// numel_i)) is cut into buckets of whole parameters, about bucket_bytes each, walking the table
// backwards: backward produces the last layers' gradients first, so the first bucket is ready
// first. A bucket is one contiguous range of the buffer, so its all-reduce is a single call.
//
// During the LAST backward of an optimizer step (earlier micro-batches only accumulate), the
// backend calls mark_ready(i) once parameter i's gradient is final. A bucket is started when all
// its parameters are ready AND every earlier bucket has been started: buckets start strictly in
// bucket order on every rank, which NCCL requires (ranks must issue collectives in the same
// order), whatever order backward marks parameters in. finish() starts the remaining buckets
// in order and calls Communicator::wait(), after which the reduced gradients may be read (on the
// compute stream, for NCCL).
//
// With the CPU communicator every start completes at once; with NCCL it is enqueued on the
// communication stream behind the compute work that produced the bucket (communicator.h).
#pragma once

#include <cstdint>
#include <vector>

#include "distributed/communicator.h"

namespace tt::distributed {

struct ParamRange {
  int64_t offset = 0;  // into the flat buffer
  int64_t numel = 0;
};

struct Bucket {
  int64_t offset = 0;  // the bucket's range of the flat buffer
  int64_t numel = 0;
  std::vector<int> params;  // parameter indices, in the order backward produces them
};

// Buckets of about bucket_bytes (a parameter larger than that is a bucket of its own) over
// parameters that tile the buffer (offset_{i+1} = offset_i + numel_i); throws tt::Error otherwise.
std::vector<Bucket> plan_buckets(const std::vector<ParamRange>& params, int64_t bucket_bytes);

class GradBuckets {
 public:
  static constexpr int64_t kDefaultBucketBytes = int64_t(25) << 20;  // 25 MiB, as is common for DDP

  GradBuckets(const std::vector<ParamRange>& params, int64_t bucket_bytes = kDefaultBucketBytes);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Starts a step's reduction: nothing ready, nothing started.
  void begin(float* grads, Communicator& comm);
  // Parameter `index` has its final gradient; starts every bucket that is now due.
  void mark_ready(int index);
  // Starts what remains, in order, and waits (Communicator::wait()).
  void finish();
  int started() const { return next_; }  // buckets started so far this step

 private:
  void start_due();

  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;    // (#params) bucket of each parameter
  std::vector<char> ready_;       // (#params) this step
  std::vector<int> missing_;      // (#buckets) parameters not yet ready
  int next_ = 0;                  // the next bucket to start
  float* grads_ = nullptr;
  Communicator* comm_ = nullptr;
};

}  // namespace tt::distributed
