// Allocation failures on demand, for tests of what a failing allocation leaves behind. Linking
// //tests/base:alloc_faults replaces the global allocation functions (all through malloc and
// free, so every form pairs with its release under the sanitizers too): with fail_after = k >= 0,
// the (k + 1)-th plain or array allocation from now, on any thread, throws std::bad_alloc (a
// nothrow one returns null), once; -1: none. failed_in_region counts the failures injected inside
// an active OpenMP parallel region.
#pragma once

#include <atomic>
#include <cstdint>

namespace tt::testing {

extern std::atomic<int64_t> fail_after;
extern std::atomic<int64_t> failed_in_region;

}  // namespace tt::testing
