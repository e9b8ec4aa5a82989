// Host-side parallel loops for start-up work (reading data, planning trees): independent items
// on a few threads, with the results and the errors of a serial loop. And OmpErrors, which
// carries an exception out of an OpenMP parallel region (the CPU reference ops).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "base/omp_env.h"

namespace tt {

// Threads for parallel_for: the CPUs this process may run on (its affinity: a SLURM task's
// share), divided among the ranks of its host (LOCAL_WORLD_SIZE, as base/omp_env.h divides
// OpenMP's threads; a rank bound to its own CPUs counts those), at most 16.
inline int host_threads_for(int cpus, int local_world_size) {
  return std::min(16, std::max(1, cpus / std::max(1, local_world_size)));
}
inline int host_threads() {
  // Ranks of one host each bound to a CPU set of their own see only theirs: no division then.
  const int n = available_cpus();
  const unsigned all = std::thread::hardware_concurrency();
  return host_threads_for(n, all > 0 && (unsigned)n < all ? 1 : local_world_size_env());
}

// Runs fn(i) for every i in [0, n) on up to `threads` threads (0: host_threads()), items handed out
// in order, and returns {i, the exception} for the smallest i whose fn threw, or {-1, null} when
// none did: a serial loop's first error. Items past a failed one are skipped (a serial loop would
// never have reached them); every item before it runs. fn must be safe to call concurrently for
// distinct i. Threads that cannot be started (no resources, no memory) leave their share to the
// others; nothing escapes while a thread runs.
template <class F>
std::pair<int64_t, std::exception_ptr> parallel_for_first_error(int64_t n, F&& fn, int threads = 0) {
  if (n <= 0) return {-1, nullptr};
  const int64_t t = std::min<int64_t>(n, threads > 0 ? threads : host_threads());
  std::vector<std::exception_ptr> error((size_t)n);
  std::atomic<int64_t> next{0}, failed{n};  // failed: the smallest index that threw so far
  auto work = [&]() noexcept {
    for (int64_t i; (i = next.fetch_add(1)) < n && i < failed.load();) {
      try {
        fn(i);
      } catch (...) {
        error[(size_t)i] = std::current_exception();
        for (int64_t f = failed.load(); i < f && !failed.compare_exchange_weak(f, i);) {
        }
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve((size_t)(t - 1));  // may throw, before any thread runs
  try {
    for (int64_t k = 1; k < t; ++k) pool.emplace_back(work);
  } catch (...) {  // std::system_error or std::bad_alloc: the threads started (and this one) do it all
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

// Whether an OpenMP region of the CPU ops is worth a team of threads: below omp_min_work() units of
// work (multiply-adds or element updates) it runs on the calling thread (an `if` clause). Waking
// a team costs tens of microseconds of futex calls a region, which dominated small batches: a
// policy server's step on the nav quickstart model took 6.5 ms on 2 threads and 0.8 ms on one (0.9
// with this threshold; closed-loop eval of 10 episodes 3.5 s -> 0.49 s; training unchanged).
// Results do not depend on it (the regions' items are independent; each is summed by one thread).
// Tests of the regions themselves set it to 0.
inline std::atomic<int64_t>& omp_min_work() {
  static std::atomic<int64_t> work{int64_t{1} << 18};
  return work;
}
inline bool omp_worth(int64_t work) { return work >= omp_min_work().load(std::memory_order_relaxed); }

// The first exception thrown on the threads of an OpenMP parallel region, rethrown after it. An
// exception must not leave a region or an iteration of a worksharing loop (the process would end
// in std::terminate), so a region runs its per-thread setup (scratch allocations) through run(),
// and so does every iteration that may throw or reads that setup: the first exception is kept,
// later run() calls on every thread return at once, and rethrow() after the region throws the
// kept one to the caller. Every thread still reaches every worksharing loop and barrier, as
// OpenMP requires; outputs are then partly written. A run() costs an atomic load and a try (free
// until something throws): call it per thread or per work item, not in inner loops. Which of
// several failing threads wins is timing, unlike parallel_for's first error.
class OmpErrors {
 public:
  template <class F>
  void run(F&& f) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      f();
    } catch (...) {
      if (!failed_.exchange(true)) error_ = std::current_exception();
    }
  }
  // After the region: its closing barrier makes error_ visible here.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace tt
