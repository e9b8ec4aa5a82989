// The CPU communicator and gradient buckets: all-reduce is exact on integer-valued data, and on
// real data it is deterministic and equal on every rank to the fp64 sum in rank order rounded
// once; broadcast, host reductions, size mismatches; buckets start in bucket order whatever the
// order backward marks parameters in, and bucketed reduction equals one whole-buffer reduction.
#include "distributed/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "distributed/buckets.h"
#include "base/check.h"
#include "tests/distributed/test_util.h"

namespace tt::distributed {
namespace {

using namespace testing;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Three chunks and a bit (the star moves 2^16 values per chunk).
constexpr int64_t kN = 3 * (int64_t(1) << 16) + 123;

TEST(CpuCommunicatorTest, AllReduceOfIntegerValuedDataIsExact) {
  const int world = 3;
  auto comms = loopback_world(world, short_timeouts());
  expect_no_errors(on_ranks(world, [&](int r) {
    std::vector<float> f(kN);
    std::vector<double> d(kN);
    for (int64_t i = 0; i < kN; ++i) {
      f[i] = (float)((r + 1) * (i % 1000) - 7 * r);
      d[i] = (double)(r + 1) * (double)i;
    }
    comms[r]->all_reduce_sum(f.data(), kN);
    comms[r]->wait();
    comms[r]->all_reduce_sum(d.data(), kN);
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(f[i], (float)(6 * (i % 1000) - 21)) << "rank " << r << " i " << i;  // sum over r of (r+1)x - 7r
      ASSERT_EQ(d[i], 6.0 * (double)i) << "rank " << r << " i " << i;
    }
  }));
}

// Seeded values of rank r: wide magnitudes and both signs, so the order of a float sum matters.
std::vector<float> values(int r, int64_t n) {
  std::mt19937_64 gen(1000 + r);
  std::uniform_real_distribution<double> mant(-1, 1);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = (float)std::ldexp(mant(gen), expo(gen));
  return v;
}

TEST(CpuCommunicatorTest, AllReduceIsTheFp64SumInRankOrderOnEveryRank) {
  const int world = 4;
  std::vector<float> want(kN);
  std::vector<std::vector<float>> in(world);
  for (int r = 0; r < world; ++r) in[r] = values(r, kN);
  for (int64_t i = 0; i < kN; ++i) {
    double acc = in[0][i];
    for (int r = 1; r < world; ++r) acc += (double)in[r][i];
    want[i] = (float)acc;
  }
  for (int trial = 0; trial < 2; ++trial) {  // a fresh world each time: the result does not depend on timing
    auto comms = loopback_world(world, short_timeouts());
    std::vector<std::vector<float>> got = in;
    expect_no_errors(on_ranks(world, [&](int r) { comms[r]->all_reduce_sum(got[r].data(), kN); }));
    for (int r = 0; r < world; ++r)
      ASSERT_EQ(std::memcmp(got[r].data(), want.data(), kN * sizeof(float)), 0) << "trial " << trial << " rank " << r;
  }
}

TEST(CpuCommunicatorTest, BroadcastHostReductionsAndBarrier) {
  const int world = 3;
  auto comms = loopback_world(world, short_timeouts());
  expect_no_errors(on_ranks(world, [&](int r) {
    Communicator& c = *comms[r];
    EXPECT_EQ(c.name(), "cpu");
    EXPECT_FALSE(c.device_buffers());
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.world_size(), world);
    std::vector<int32_t> buf(1000, r);
    if (r == 2)
      for (int i = 0; i < 1000; ++i) buf[i] = 3 * i;
    c.broadcast(buf.data(), (int64_t)(buf.size() * sizeof(int32_t)), 2);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(buf[i], 3 * i) << "rank " << r;
    double host[3] = {1.0, (double)r, 0.5};
    c.all_reduce_host(host, 3);
    EXPECT_EQ(host[0], 3.0);
    EXPECT_EQ(host[1], 3.0);
    EXPECT_EQ(host[2], 1.5);
    c.all_reduce_sum(static_cast<float*>(nullptr), 0);
    c.barrier();
    EXPECT_EQ(c.all_gather_host(std::to_string(r)), (std::vector<std::string>{"0", "1", "2"}));
  }));
}

TEST(CpuCommunicatorTest, BuffersOfDifferentSizesAreAnError) {
  const int world = 2;
  auto comms = loopback_world(world, short_timeouts());
  const auto errors = on_ranks(world, [&](int r) {
    std::vector<float> v(r == 0 ? 20 : 10, 1.0f);
    try {
      comms[r]->all_reduce_sum(v.data(), (int64_t)v.size());
    } catch (...) {
      comms[r].reset();
      throw;
    }
  });
  EXPECT_TRUE(has(errors[0], "rank 0/2 on host host0 (local rank 0): rank 1 (host host1) sent 40 bytes for "
                             "all_reduce #1, expected 80 (buffers of different sizes on different ranks?)"))
      << errors[0];
  EXPECT_TRUE(has(errors[1], "lost rank 0")) << errors[1];
}

// Records the collectives it is asked for.
class RecordingCommunicator : public Communicator {
 public:
  std::string name() const override { return "recording"; }
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string tag() const override { return "test"; }
  bool device_buffers() const override { return false; }
  void all_reduce_sum(float* data, int64_t n) override { calls.push_back({data - base, n}); }
  void all_reduce_sum(double*, int64_t) override {}
  void broadcast(void*, int64_t, int) override {}
  void wait() override { ++waits; }
  void all_reduce_host(double*, int64_t) override {}
  void barrier() override {}
  std::vector<std::string> all_gather_host(const std::string& b) override { return {b}; }

  const float* base = nullptr;
  std::vector<std::pair<int64_t, int64_t>> calls;  // (offset, n)
  int waits = 0;
};

// Parameters of 100, 300, 50, 400 and 200 values tiling a buffer of 1050.
std::vector<ParamRange> five_params() {
  std::vector<ParamRange> p;
  int64_t off = 0;
  for (int64_t n : {100, 300, 50, 400, 200}) {
    p.push_back({off, n});
    off += n;
  }
  return p;
}

TEST(GradBucketsTest, BucketsAreWholeParametersFromTheLastBackwards) {
  // 2000 bytes = 500 floats per bucket: {4 (200)}, {3 (400)} would overflow with 4, so
  // [4], [3, 2], [1, 0] -> walking backwards: 200 | 400 + 50 | 300 + 100.
  const std::vector<Bucket> b = plan_buckets(five_params(), 2000);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<int>{4}));
  EXPECT_EQ(b[0].offset, 850);
  EXPECT_EQ(b[0].numel, 200);
  EXPECT_EQ(b[1].params, (std::vector<int>{3, 2}));
  EXPECT_EQ(b[1].offset, 400);
  EXPECT_EQ(b[1].numel, 450);
  EXPECT_EQ(b[2].params, (std::vector<int>{1, 0}));
  EXPECT_EQ(b[2].offset, 0);
  EXPECT_EQ(b[2].numel, 400);
  // A parameter larger than a bucket is a bucket of its own; one huge bucket holds everything.
  EXPECT_EQ(plan_buckets(five_params(), 4).size(), 5u);
  EXPECT_EQ(plan_buckets(five_params(), 1 << 20).size(), 1u);
  std::vector<ParamRange> gap = five_params();
  gap[2].offset += 1;
  EXPECT_THROW(plan_buckets(gap, 2000), Error);
}

TEST(GradBucketsTest, BucketsStartInBucketOrderWhateverTheReadyOrder) {
  std::vector<float> grads(1050);
  RecordingCommunicator comm;
  comm.base = grads.data();
  GradBuckets buckets(five_params(), 2000);
  buckets.begin(grads.data(), comm);
  buckets.mark_ready(0);  // bucket 2 complete? no: param 1 missing
  buckets.mark_ready(1);  // bucket 2 complete, but buckets 0 and 1 have not started: wait
  EXPECT_TRUE(comm.calls.empty());
  buckets.mark_ready(2);
  EXPECT_TRUE(comm.calls.empty());
  buckets.mark_ready(4);  // bucket 0 starts
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0], (std::pair<int64_t, int64_t>{850, 200}));
  buckets.mark_ready(3);  // bucket 1, then the waiting bucket 2
  ASSERT_EQ(comm.calls.size(), 3u);
  EXPECT_EQ(comm.calls[1], (std::pair<int64_t, int64_t>{400, 450}));
  EXPECT_EQ(comm.calls[2], (std::pair<int64_t, int64_t>{0, 400}));
  EXPECT_EQ(comm.waits, 0);
  buckets.finish();
  EXPECT_EQ(comm.calls.size(), 3u);
  EXPECT_EQ(comm.waits, 1);

  // A step where backward never marks: finish() starts every bucket, in order.
  comm.calls.clear();
  buckets.begin(grads.data(), comm);
  buckets.mark_ready(4);
  EXPECT_THROW(buckets.mark_ready(4), Error);  // twice in one step
  buckets.finish();
  ASSERT_EQ(comm.calls.size(), 3u);
  EXPECT_EQ(comm.calls[2], (std::pair<int64_t, int64_t>{0, 400}));
}

TEST(GradBucketsTest, BucketedReductionEqualsOneWholeBufferReduction) {
  const int world = 3;
  auto comms = loopback_world(world, short_timeouts());
  std::vector<std::vector<float>> whole(world), bucketed(world);
  for (int r = 0; r < world; ++r) whole[r] = bucketed[r] = values(r, 1050);
  expect_no_errors(on_ranks(world, [&](int r) {
    comms[r]->all_reduce_sum(whole[r].data(), 1050);
    GradBuckets b(five_params(), 2000);
    b.begin(bucketed[r].data(), *comms[r]);
    // Each rank marks in its own order; the buckets still start in the same order everywhere.
    std::vector<int> order = {3, 4, 2, 0, 1};
    std::rotate(order.begin(), order.begin() + r, order.end());
    for (int p : order) b.mark_ready(p);
    b.finish();
  }));
  for (int r = 0; r < world; ++r) EXPECT_EQ(bucketed[r], whole[0]) << "rank " << r;
}

}  // namespace
}  // namespace tt::distributed
