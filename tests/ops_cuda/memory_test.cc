// Caching allocator: size classes, no cudaMalloc after warm-up, peak accounting, reuse, release.
#include "ops/cuda/memory.h"

#include <gtest/gtest.h>

#include <vector>

#include "tests/ops_cuda/test_util.h"

namespace tt::cuda_test {
namespace {

using tt::cuda::AllocatorStats;
using tt::cuda::DeviceAllocator;

class MemoryTest : public GpuTest {};

TEST(AllocatorSizeClass, RoundsUpWithBoundedWaste) {
  EXPECT_EQ(DeviceAllocator::size_class(0), 0u);
  EXPECT_EQ(DeviceAllocator::size_class(1), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(512), 512u);
  EXPECT_EQ(DeviceAllocator::size_class(513), 1024u);
  EXPECT_EQ(DeviceAllocator::size_class(1 << 20), size_t(1) << 20);
  EXPECT_EQ(DeviceAllocator::size_class((1 << 20) + 1), size_t(5) << 18);  // 1.25 MiB
  size_t prev = 0;
  for (size_t b = 1; b < (size_t(1) << 34); b = b * 3 / 2 + 7) {
    const size_t c = DeviceAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_EQ(c % 512, 0u) << b;
    EXPECT_GE(c, prev) << "classes must be monotone at " << b;
    if (b > (size_t(1) << 20)) {
      EXPECT_LE((double)c, 1.25 * (double)b) << b;
    }
    EXPECT_EQ(DeviceAllocator::size_class(c), c) << "a class is its own class: " << c;
    prev = c;
  }
}

TEST_F(MemoryTest, NoCudaMallocAfterWarmup) {
  DeviceAllocator alloc;
  const std::vector<size_t> sizes = {100, 1000, 4096, 3 << 20, (17 << 20) + 5, 1 << 20, 77};
  std::vector<void*> ptrs;
  auto step = [&] {
    ptrs.clear();
    for (size_t s : sizes) {
      void* p = alloc.allocate(s);
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
      ASSERT_EQ(cudaMemset(p, 0x5A, s), cudaSuccess);  // the block is really s bytes of device memory
      ptrs.push_back(p);
    }
    for (void* p : ptrs) alloc.free(p);
  };
  step();
  const AllocatorStats warm = alloc.stats();
  EXPECT_EQ(warm.num_cuda_malloc, (int64_t)sizes.size());
  EXPECT_EQ(warm.bytes_in_use, 0);
  for (int i = 0; i < 20; i++) step();
  const AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.num_cuda_malloc, warm.num_cuda_malloc) << "steady state must not call cudaMalloc";
  EXPECT_EQ(after.bytes_reserved, warm.bytes_reserved);
  EXPECT_EQ(after.num_alloc, 21 * (int64_t)sizes.size());
  EXPECT_EQ(after.bytes_in_use, 0);
  sync_and_check();
}

TEST_F(MemoryTest, PeakAccounting) {
  DeviceAllocator alloc;
  void* a = alloc.allocate(1 << 20);  // class 1 MiB
  void* b = alloc.allocate(2 << 20);  // class 2 MiB
  EXPECT_EQ(alloc.stats().bytes_in_use, 3 << 20);
  EXPECT_EQ(alloc.stats().peak_bytes_in_use, 3 << 20);
  alloc.free(a);
  EXPECT_EQ(alloc.stats().bytes_in_use, 2 << 20);
  void* c = alloc.allocate(300);  // class 512 B
  EXPECT_EQ(alloc.stats().bytes_in_use, (2 << 20) + 512);
  EXPECT_EQ(alloc.stats().peak_bytes_in_use, 3 << 20);
  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_bytes_in_use, (2 << 20) + 512);
  alloc.free(b);
  alloc.free(c);
  EXPECT_EQ(alloc.stats().bytes_in_use, 0);
  EXPECT_EQ(alloc.stats().bytes_reserved, (3 << 20) + 512);
  alloc.release_cached();
  EXPECT_EQ(alloc.stats().bytes_reserved, 0);
  EXPECT_EQ(alloc.stats().num_cuda_free, 3);
}

TEST_F(MemoryTest, LargerCachedBlockServesSmallerRequest) {
  DeviceAllocator alloc;
  void* big = alloc.allocate(2 << 20);
  alloc.free(big);
  void* p = alloc.allocate((3 << 20) / 2);  // class 1.5 MiB: the cached 2 MiB block is within 2x
  EXPECT_EQ(p, big);
  EXPECT_EQ(alloc.stats().num_cuda_malloc, 1);
  EXPECT_EQ(alloc.stats().bytes_in_use, 2 << 20);  // accounted at the block's own class
  void* q = alloc.allocate(512);                    // 4096x smaller: a new block
  EXPECT_NE(q, big);
  EXPECT_EQ(alloc.stats().num_cuda_malloc, 2);
  alloc.free(p);
  alloc.free(q);
}

TEST_F(MemoryTest, FreeOfUnknownPointerThrows) {
  DeviceAllocator alloc;
  int x = 0;
  EXPECT_THROW(alloc.free(&x), tt::Error);
  void* p = alloc.allocate(1000);
  alloc.free(p);
  EXPECT_THROW(alloc.free(p), tt::Error);  // double free
  alloc.free(nullptr);
  EXPECT_EQ(alloc.allocate(0), nullptr);
}

TEST_F(MemoryTest, DestructionReleasesDeviceMemory) {
  size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // context up before measuring
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  {
    DeviceAllocator alloc;
    void* a = alloc.allocate(size_t(512) << 20);
    void* b = alloc.allocate(size_t(256) << 20);
    alloc.free(a);  // one cached, one still in use at destruction
    (void)b;
    ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    EXPECT_GE(free0 - free1, size_t(768) << 20);
  }
  ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
  EXPECT_LE(free0 > free2 ? free0 - free2 : 0, size_t(8) << 20) << "blocks must be cudaFree'd on destruction";
}

TEST_F(MemoryTest, DeviceBufferRoundTripAndMove) {
  DeviceAllocator alloc;
  std::vector<float> h(1000);
  for (size_t i = 0; i < h.size(); i++) h[i] = 0.5f * (float)i - 3.f;
  tt::cuda::DeviceBuffer<float> a(h.size(), &alloc);
  a.copy_from_host(h);
  tt::cuda::DeviceBuffer<float> b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.size(), h.size());
  EXPECT_EQ(b.to_host(), h);
  tt::cuda::DeviceBuffer<float> plain(h.size());  // plain cudaMalloc
  plain.copy_from_host(h);
  EXPECT_EQ(plain.to_host(), h);
  EXPECT_THROW(plain.copy_from_host(h.data(), h.size() + 1), tt::Error);
  b.reset();
  EXPECT_EQ(alloc.stats().bytes_in_use, 0);
}

}  // namespace
}  // namespace tt::cuda_test
