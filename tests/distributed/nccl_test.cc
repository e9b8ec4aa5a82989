// The NCCL communicator on real GPUs (tagged "gpu"; needs 2 visible GPUs, else it skips): two
// forked ranks, one GPU each, joined by the TCP rendezvous on loopback. All-reduce of integer-
// valued fp32/fp64 device buffers is exact; broadcast; host reductions; bucketed all-reduce on
// the communication stream equals a whole-buffer one; a rank that exits makes the other fail
// within the timeout instead of hanging.
#include "distributed/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "distributed/buckets.h"
#include "base/check.h"
#include "tests/distributed/test_util.h"

namespace tt::distributed {
namespace {

using namespace testing;

// CUDA does not survive fork(): a child of a process that has initialised CUDA cannot use it. So
// the GPUs are counted in a child of their own, and this process, which forks the ranks, never
// touches CUDA.
int visible_gpus() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    ::_exit(std::min(n, 100));
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// Runs body(rank) in two forked processes; returns their exit codes (0: body returned).
std::vector<int> two_processes(const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(body(r));
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

// Exit codes of the children: 0 ok, 1 wrong values, 2 an error (printed).
int run_rank(int rank, int port, const std::function<bool(Communicator&, cudaStream_t)>& check) {
  try {
    TT_CHECK(cudaSetDevice(rank) == cudaSuccess, "cudaSetDevice");
    cudaStream_t compute;
    TT_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess, "stream");
    auto comm = make_nccl_communicator(Rendezvous::connect(loopback_env(rank, 2, port), short_timeouts(10, 10)),
                                       rank, compute);
    return check(*comm, compute) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}

TEST(NcclCommunicatorTest, CollectivesAreExactOnIntegerValuedData) {
  if (const int n = visible_gpus(); n < 2) GTEST_SKIP() << "needs 2 GPUs, cudaGetDeviceCount sees " << n;
  int port;
  {
    Listener l = bind_free_port();
    port = l.port;
  }
  const int64_t n = (int64_t(1) << 22) + 17;
  const auto codes = two_processes([&](int r) {
    return run_rank(r, port, [&](Communicator& c, cudaStream_t s) {
      std::vector<float> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = (float)((r + 1) * (i % 4096));
      float* d = nullptr;
      cudaMalloc(&d, n * sizeof(float));
      cudaMemcpyAsync(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
      c.all_reduce_sum(d, n);
      c.wait();
      cudaMemcpyAsync(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      for (int64_t i = 0; i < n; ++i)
        if (h[i] != (float)(3 * (i % 4096))) return false;
      // Broadcast from rank 1, through the same stream ordering.
      std::vector<double> b(1000, r == 1 ? 2.5 : 0.0);
      double* db = nullptr;
      cudaMalloc(&db, b.size() * sizeof(double));
      cudaMemcpyAsync(db, b.data(), b.size() * sizeof(double), cudaMemcpyHostToDevice, s);
      c.broadcast(db, (int64_t)(b.size() * sizeof(double)), 1);
      c.wait();
      cudaMemcpyAsync(b.data(), db, b.size() * sizeof(double), cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      for (double v : b)
        if (v != 2.5) return false;
      double host[2] = {1.0, (double)r};
      c.all_reduce_host(host, 2);
      c.barrier();
      return host[0] == 2.0 && host[1] == 1.0;
    });
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(NcclCommunicatorTest, BucketedAllReduceEqualsWholeBuffer) {
  if (const int n = visible_gpus(); n < 2) GTEST_SKIP() << "needs 2 GPUs, cudaGetDeviceCount sees " << n;
  int port;
  {
    Listener l = bind_free_port();
    port = l.port;
  }
  std::vector<ParamRange> params;
  int64_t total = 0;
  for (int64_t k : {1000, 300000, 7, 2000000, 123456}) {
    params.push_back({total, k});
    total += k;
  }
  const auto codes = two_processes([&](int r) {
    return run_rank(r, port, [&](Communicator& c, cudaStream_t s) {
      std::vector<float> h(total);
      for (int64_t i = 0; i < total; ++i) h[i] = (float)((r + 1) * (i % 977));
      float* d = nullptr;
      cudaMalloc(&d, total * sizeof(float));
      cudaMemcpyAsync(d, h.data(), total * sizeof(float), cudaMemcpyHostToDevice, s);
      GradBuckets b(params, 1 << 20);
      b.begin(d, c);
      for (int p : {4, 3, 2, 1, 0}) b.mark_ready(p);
      b.finish();
      cudaMemcpyAsync(h.data(), d, total * sizeof(float), cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      for (int64_t i = 0; i < total; ++i)
        if (h[i] != (float)(3 * (i % 977))) return false;
      return true;
    });
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(NcclCommunicatorTest, ARankThatExitsFailsTheOtherWithinTheTimeout) {
  if (const int n = visible_gpus(); n < 2) GTEST_SKIP() << "needs 2 GPUs, cudaGetDeviceCount sees " << n;
  int port;
  {
    Listener l = bind_free_port();
    port = l.port;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto codes = two_processes([&](int r) {
    return run_rank(r, port, [&](Communicator& c, cudaStream_t s) {
      if (r == 1) return true;  // leaves right after setup
      float* d = nullptr;
      cudaMalloc(&d, 1024 * sizeof(float));
      c.all_reduce_sum(d, 1024);
      c.wait();
      cudaStreamSynchronize(s);  // returns once the watchdog has aborted the communicator
      c.all_reduce_host(nullptr, 0);  // throws the recorded error, or the lost-peer error
      return false;
    });
  });
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[0], 2);  // an error, not a hang
  EXPECT_LT(seconds_since(t0), 60.0);
}

}  // namespace
}  // namespace tt::distributed
