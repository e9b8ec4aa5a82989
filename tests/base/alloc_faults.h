// Allocation failures on demand, for tests of what a failing allocation leaves behind. Linking
// //tests/base:alloc_faults replaces the global allocation functions (all through malloc and
// free, so every form pairs with its release under the sanitizers too): with fail_after = k >= 0,
// the (k + 1)-th plain or array allocation from now, on any thread, throws std::bad_alloc (a
// nothrow one returns null), once; -1: none. failed_in_region counts the failures injected inside
// an active OpenMP parallel region.
#pragma once

#include <atomic>
#include <cstdint>
#include <new>

namespace tt::testing {

extern std::atomic<int64_t> fail_after;
extern std::atomic<int64_t> failed_in_region;

// What f() did with allocation n + 1 from now failing: whether std::bad_alloc came out of it, and
// whether the failure was injected at all (f made more than n allocations). Disarmed after, also
// when f throws anything else (which passes through).
struct AllocationFault {
  bool threw = false, injected = false;
};
template <class F>
AllocationFault fail_allocation(int64_t n, F&& f) {
  AllocationFault r;
  fail_after.store(n);
  try {
    f();
  } catch (const std::bad_alloc&) {
    r.threw = true;
  } catch (...) {
    fail_after.store(-1);
    throw;
  }
  r.injected = fail_after.exchange(-1) < 0;
  return r;
}

}  // namespace tt::testing
