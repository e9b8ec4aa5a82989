// Host-side parallel loops for start-up work (reading data, planning trees): independent items
// on a few threads, with the results and the errors of a serial loop.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace tt {

// Threads for parallel_for: the CPUs this process may run on (its affinity: a SLURM task's
// share), at most 16 (start-up work on a host shared by the ranks of a node).
inline int host_threads() {
  cpu_set_t set;
  int n = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  return std::min(16, std::max(1, n));
}

// Runs fn(i) for every i in [0, n) on up to `threads` threads (0: host_threads()), items handed out
// in order. An exception from fn stops no other item; the first (smallest i) is returned once all
// are done: {i, the exception}, or {-1, null} when none threw. fn must be safe to call
// concurrently for distinct i.
template <class F>
std::pair<int64_t, std::exception_ptr> parallel_for_first_error(int64_t n, F&& fn, int threads = 0) {
  if (n <= 0) return {-1, nullptr};
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
  try {
    for (int64_t k = 1; k < t; ++k) pool.emplace_back(work);
  } catch (const std::system_error&) {  // no more threads: the ones started (and this one) do it all
  }
  work();
  for (std::thread& th : pool) th.join();
  for (int64_t i = 0; i < n; ++i)
    if (error[(size_t)i]) return {i, error[(size_t)i]};
  return {-1, nullptr};
}

// The same, rethrowing the first error: the one a serial loop would have stopped at.
template <class F>
void parallel_for(int64_t n, F&& fn, int threads = 0) {
  const auto [i, e] = parallel_for_first_error(n, std::forward<F>(fn), threads);
  if (e) std::rethrow_exception(e);
}

}  // namespace tt
