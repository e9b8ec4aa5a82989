// Device memory: a caching allocator and a RAII buffer.
//
// DeviceAllocator keeps freed blocks in free lists keyed by size class and hands them out again,
// so a training step that allocates and frees the same sizes each step calls cudaMalloc only while
// warming up. Size classes: a request rounds up to a power of two from 512 B to 1 MiB, and above
// 1 MiB to one of four classes per power of two (p, 1.25p, 1.5p, 1.75p), so at most 25% is
// wasted and batches whose token counts differ a little share blocks. A request takes a cached
// block of its own class, else the smallest cached block of a larger class up to twice its class,
// else a new cudaMalloc; when cudaMalloc runs out of memory the cache is released and the call
// retried once before throwing tt::Error with the allocator's statistics.
//
// Ordering: blocks are stream-ordered by the caller. A block freed after work was enqueued on
// stream S may be reused by later work on S; work on another stream must be synchronised (an event
// or a stream wait) before the block is freed. The allocator is thread-safe (one mutex).
// Destruction cudaFree's every block it holds, in use or cached: it must outlive its buffers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ops/cuda/check.h"

namespace tt::cuda {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // size classes of the blocks handed out now
  int64_t peak_bytes_in_use = 0;  // maximum of bytes_in_use since construction or reset_peak()
  int64_t bytes_reserved = 0;     // held from cudaMalloc: in use plus cached
  int64_t num_cuda_malloc = 0;    // cudaMalloc calls so far
  int64_t num_cuda_free = 0;      // cudaFree calls so far
  int64_t num_alloc = 0;          // allocate() calls so far (non-zero sizes)
};

class DeviceAllocator {
 public:
  DeviceAllocator() = default;
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // A block of at least `bytes` bytes, 256-byte aligned; nullptr for 0 bytes.
  void* allocate(size_t bytes);
  // Returns a block from allocate() to the cache; nullptr is ignored. Throws tt::Error for a
  // pointer this allocator did not hand out.
  void free(void* ptr);
  // cudaFree's every cached (free) block.
  void release_cached();

  AllocatorStats stats() const;
  void reset_peak();

  // The size class a request of `bytes` rounds up to.
  static size_t size_class(size_t bytes);

 private:
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;   // size class -> cached blocks
  std::unordered_map<void*, size_t> in_use_;    // block -> its size class
  AllocatorStats stats_;
  void release_cached_locked();
};

// Owns n elements of device memory, from an allocator or (allocator null) plain cudaMalloc.
// Move-only. Copies to and from the host are synchronous.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, DeviceAllocator* alloc = nullptr) : n_(n), alloc_(alloc) {
    if (n == 0) return;
    if (alloc_) {
      ptr_ = static_cast<T*>(alloc_->allocate(n * sizeof(T)));
    } else {
      void* p = nullptr;
      TT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
      ptr_ = static_cast<T*>(p);
    }
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      swap(o);
    }
    return *this;
  }

  T* data() { return ptr_; }
  const T* data() const { return ptr_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void copy_from_host(const T* src, size_t n) {
    TT_CHECK(n <= n_, "DeviceBuffer::copy_from_host: ", n, " elements into a buffer of ", n_);
    if (n) TT_CUDA_CHECK(cudaMemcpy(ptr_, src, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void copy_from_host(const std::vector<T>& src) { copy_from_host(src.data(), src.size()); }
  void copy_to_host(T* dst, size_t n) const {
    TT_CHECK(n <= n_, "DeviceBuffer::copy_to_host: ", n, " elements from a buffer of ", n_);
    if (n) TT_CUDA_CHECK(cudaMemcpy(dst, ptr_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> to_host() const {
    std::vector<T> out(n_);
    copy_to_host(out.data(), n_);
    return out;
  }
  // Sets every byte (0xFF makes bf16 and fp32 elements NaN: the poison of the tests).
  void fill_bytes(int byte, cudaStream_t stream = nullptr) {
    if (n_) TT_CUDA_CHECK(cudaMemsetAsync(ptr_, byte, bytes(), stream));
  }

  void reset() {
    if (ptr_) {
      if (alloc_) {
        alloc_->free(ptr_);
      } else {
        cudaFree(ptr_);  // no throw from a destructor path; errors surface at the next check
      }
    }
    ptr_ = nullptr;
    n_ = 0;
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    std::swap(alloc_, o.alloc_);
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
  DeviceAllocator* alloc_ = nullptr;
};

}  // namespace tt::cuda
