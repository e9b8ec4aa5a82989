// Host-side parallel loops for start-up work (reading data, planning trees): independent items
// on a few threads, with the results and the errors of a serial loop.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace tt {

// Threads for parallel_for: the hardware's, at most 16 (start-up work on a host shared by the
// ranks of a node).
inline int host_threads() { return (int)std::min(16u, std::max(1u, std::thread::hardware_concurrency())); }

// Runs fn(i) for every i in [0, n) on up to `threads` threads (0: host_threads()), items handed out
// in order. An exception from fn stops no other item; once all are done the one of the smallest i
// is rethrown, the error a serial loop would have stopped at. fn must be safe to call
// concurrently for distinct i.
template <class F>
void parallel_for(int64_t n, F&& fn, int threads = 0) {
  if (n <= 0) return;
  const int64_t t = std::min<int64_t>(n, threads > 0 ? threads : host_threads());
  std::vector<std::exception_ptr> error((size_t)n);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        error[(size_t)i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t k = 1; k < t; ++k) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : error)
    if (e) std::rethrow_exception(e);
}

}  // namespace tt
