#include "tests/base/alloc_faults.h"

#include <omp.h>

#include <cstdlib>
#include <new>

namespace tt::testing {

std::atomic<int64_t> fail_after{-1};
std::atomic<int64_t> failed_in_region{0};

namespace {

// False when this allocation is the one to fail.
bool may_allocate() {
  if (fail_after.load(std::memory_order_relaxed) < 0 || fail_after.fetch_sub(1) != 0) return true;
  if (omp_in_parallel()) failed_in_region.fetch_add(1);
  return false;
}

void* allocate(std::size_t n) {
  if (!may_allocate()) throw std::bad_alloc();
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}

void* allocate_nothrow(std::size_t n) noexcept { return may_allocate() ? std::malloc(n ? n : 1) : nullptr; }

}  // namespace
}  // namespace tt::testing

void* operator new(std::size_t n) { return tt::testing::allocate(n); }
void* operator new[](std::size_t n) { return tt::testing::allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return tt::testing::allocate_nothrow(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return tt::testing::allocate_nothrow(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
