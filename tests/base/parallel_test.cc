// base/parallel.h: a serial loop's results and first error from several threads, items past a
// failure skipped, threads that cannot start (an allocation failing) never aborting the process,
// and the thread count of a host's ranks.
#include "base/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/base/alloc_faults.h"

namespace tt {
namespace {

using testing::fail_allocation;  // tests/base/alloc_faults.h

TEST(ParallelFor, EveryItemOnceWithoutErrors) {
  for (int threads : {1, 2, 8, 64}) {
    std::vector<std::atomic<int>> seen(1000);
    const auto [i, e] = parallel_for_first_error(1000, [&](int64_t k) { seen[k].fetch_add(1); }, threads);
    EXPECT_EQ(i, -1);
    EXPECT_FALSE(e);
    for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k].load(), 1) << "item " << k << ", " << threads << " threads";
  }
  int calls = 0;
  parallel_for(0, [&](int64_t) { ++calls; }, 4);
  EXPECT_EQ(calls, 0);
}

// Whatever the threads' timing, the error returned is the smallest failing item's, and every item
// before it ran: what a serial loop would have done.
TEST(ParallelFor, FirstErrorIsTheSmallestFailingItem) {
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    const int n = 500;
    std::vector<char> fails(n, 0);
    int first = n;
    for (int j = 0; j < 5; ++j) {
      const int k = (int)(rng() % n);
      fails[k] = 1;
      first = std::min(first, k);
    }
    std::vector<std::atomic<int>> ran(n);
    const auto [i, e] = parallel_for_first_error(n, [&](int64_t k) {
      ran[k].store(1);
      if (fails[k]) throw std::runtime_error("item " + std::to_string(k));
    }, 8);
    ASSERT_EQ(i, first) << "round " << round;
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const std::runtime_error& x) {
      EXPECT_EQ(std::string(x.what()), "item " + std::to_string(first));
    }
    for (int k = 0; k <= first; ++k) ASSERT_EQ(ran[k].load(), 1) << "item " << k << " before the failure did not run";
  }
  // One thread: nothing past the failure runs.
  int last = -1;
  EXPECT_THROW(parallel_for(100, [&](int64_t k) {
    last = (int)k;
    if (k == 10) throw std::runtime_error("ten");
  }, 1), std::runtime_error);
  EXPECT_EQ(last, 10);
}

// An allocation failing while the threads start (their vector, a thread's state) either throws
// std::bad_alloc before any item ran or leaves the work to the threads that did start: never
// std::terminate (a destroyed, joinable std::thread), never an item lost.
TEST(ParallelFor, AllocationFailuresWhileStartingThreads) {
  for (int k = 0; k < 12; ++k) {
    std::vector<std::atomic<int>> seen(1000);
    std::atomic<int> total{0};
    const auto item = [&](int64_t i) {
      seen[i].fetch_add(1);
      total.fetch_add(1);
    };
    const bool threw = fail_allocation(k, [&] { parallel_for(1000, item, 8); }).threw;
    if (threw) {
      EXPECT_EQ(total.load(), 0) << "allocation " << k << " failed after items ran";
    } else {
      EXPECT_EQ(total.load(), 1000) << "allocation " << k;
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << "item " << i << ", allocation " << k;
    }
  }
}

TEST(HostThreads, RanksOfAHostShareItsCpus) {
  EXPECT_EQ(host_threads_for(64, 8), 8);
  EXPECT_EQ(host_threads_for(128, 1), 16);  // at most 16
  EXPECT_EQ(host_threads_for(2, 1), 2);
  EXPECT_EQ(host_threads_for(2, 8), 1);  // at least 1
  EXPECT_EQ(host_threads_for(1, 0), 1);
  EXPECT_GE(host_threads(), 1);
  EXPECT_LE(host_threads(), 16);
}

}  // namespace
}  // namespace tt
