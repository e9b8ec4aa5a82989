// Caching device allocator: size-class free lists over cudaMalloc (see memory.h).
#include "ops/cuda/memory.h"

#include <algorithm>

namespace tt::cuda {
namespace {

constexpr size_t kMinClass = 512;
constexpr size_t kSmallLimit = size_t(1) << 20;  // power-of-two classes up to 1 MiB
constexpr int kClassesPerOctave = 4;             // above it: p, 1.25p, 1.5p, 1.75p
constexpr size_t kMaxReuseFactor = 2;            // a cached block serves requests down to half its class

static_assert((kMinClass & (kMinClass - 1)) == 0 && kMinClass >= 256,
              "classes must keep cudaMalloc's 256-byte alignment");
static_assert(kSmallLimit % kClassesPerOctave == 0, "octave steps must divide the small limit");

size_t floor_pow2(size_t x) {
  size_t p = 1;
  while (p <= x / 2) p *= 2;
  return p;
}

}  // namespace

size_t DeviceAllocator::size_class(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kMinClass) return kMinClass;
  if (bytes <= kSmallLimit) {
    size_t c = kMinClass;
    while (c < bytes) c *= 2;
    return c;
  }
  const size_t p = floor_pow2(bytes);  // p <= bytes < 2p
  const size_t step = p / kClassesPerOctave;
  return (bytes + step - 1) / step * step;
}

DeviceAllocator::~DeviceAllocator() {
  // No throwing from a destructor: failures here mean the context is already gone.
  for (auto& [cls, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
  for (auto& [p, cls] : in_use_) cudaFree(p);
}

void* DeviceAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_alloc++;
  void* ptr = nullptr;
  size_t got = cls;
  auto it = free_.lower_bound(cls);
  while (it != free_.end() && it->second.empty()) ++it;
  if (it != free_.end() && it->first <= cls * kMaxReuseFactor) {
    got = it->first;
    ptr = it->second.back();
    it->second.pop_back();
  } else {
    cudaError_t err = cudaMalloc(&ptr, cls);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state of the failed call
      release_cached_locked();
      err = cudaMalloc(&ptr, cls);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      const std::string msg = str("DeviceAllocator: cudaMalloc of ", cls, " bytes (request ", bytes, ") failed: ",
                                  cudaGetErrorString(err), "; in use ", stats_.bytes_in_use, " B, reserved ",
                                  stats_.bytes_reserved, " B, peak ", stats_.peak_bytes_in_use, " B");
      if (err == cudaErrorMemoryAllocation) throw OutOfMemoryError(msg);
      throw Error(msg);
    }
    stats_.num_cuda_malloc++;
    stats_.bytes_reserved += (int64_t)cls;
  }
  in_use_.emplace(ptr, got);
  stats_.bytes_in_use += (int64_t)got;
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return ptr;
}

void DeviceAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(ptr);
  TT_CHECK(it != in_use_.end(), "DeviceAllocator::free: pointer ", ptr, " was not allocated here or was freed twice");
  free_[it->second].push_back(ptr);
  stats_.bytes_in_use -= (int64_t)it->second;
  in_use_.erase(it);
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void DeviceAllocator::release_cached_locked() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      TT_CUDA_CHECK(cudaFree(p));
      stats_.num_cuda_free++;
      stats_.bytes_reserved -= (int64_t)cls;
    }
  }
  free_.clear();
}

AllocatorStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

}  // namespace tt::cuda
