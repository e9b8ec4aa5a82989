// Gradient buckets (see buckets.h).
#include "distributed/buckets.h"

#include <algorithm>

#include "base/check.h"

namespace tt::distributed {

std::vector<Bucket> plan_buckets(const std::vector<ParamRange>& params, int64_t bucket_bytes) {
  TT_CHECK(bucket_bytes > 0, "bucket size must be positive, got ", bucket_bytes, " bytes");
  for (size_t i = 0; i < params.size(); ++i) {
    TT_CHECK(params[i].numel > 0, "parameter ", i, " has ", params[i].numel, " values");
    if (i > 0 && params[i].offset != params[i - 1].offset + params[i - 1].numel)
      throw Error(str("gradient buckets: parameter ", i, " starts at ", params[i].offset, ", expected ",
                      params[i - 1].offset + params[i - 1].numel, " (parameters must tile the flat buffer)"));
  }
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / (int64_t)sizeof(float));  // values per bucket
  std::vector<Bucket> out;
  for (int i = (int)params.size() - 1; i >= 0; --i) {
    // Walking backwards, a bucket grows downwards: its range starts at the newest parameter.
    if (out.empty() || out.back().numel + params[i].numel > cap) out.emplace_back();
    Bucket& b = out.back();
    b.offset = params[i].offset;
    b.numel += params[i].numel;
    b.params.push_back(i);
  }
  return out;
}

GradBuckets::GradBuckets(const std::vector<ParamRange>& params, int64_t bucket_bytes)
    : buckets_(plan_buckets(params, bucket_bytes)), bucket_of_(params.size()), ready_(params.size(), 0) {
  for (int b = 0; b < (int)buckets_.size(); ++b)
    for (int p : buckets_[b].params) bucket_of_[p] = b;
  missing_.assign(buckets_.size(), 0);
}

void GradBuckets::begin(float* grads, Communicator& comm) {
  grads_ = grads;
  comm_ = &comm;
  next_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = (int)buckets_[b].params.size();
}

void GradBuckets::mark_ready(int index) {
  TT_CHECK(comm_ != nullptr, "GradBuckets::mark_ready before begin()");
  TT_CHECK(index >= 0 && index < (int)ready_.size(), "parameter index ", index, " out of range [0, ", ready_.size(), ")");
  TT_CHECK(!ready_[index], "parameter ", index, " marked ready twice in one step");
  ready_[index] = 1;
  --missing_[bucket_of_[index]];
  start_due();
}

void GradBuckets::start_due() {
  while (next_ < (int)buckets_.size() && missing_[next_] == 0) {
    const Bucket& b = buckets_[next_];
    comm_->all_reduce_sum(grads_ + b.offset, b.numel);
    ++next_;
  }
}

void GradBuckets::finish() {
  TT_CHECK(comm_ != nullptr, "GradBuckets::finish before begin()");
  for (; next_ < (int)buckets_.size(); ++next_) {
    const Bucket& b = buckets_[next_];
    comm_->all_reduce_sum(grads_ + b.offset, b.numel);
  }
  comm_->wait();
  comm_ = nullptr;
}

}  // namespace tt::distributed
