// Carving one buffer into the regions of a layout (saved activations, scratch, batch metadata):
// every region starts on a 256-byte boundary, so the same layout serves host memory and device
// memory (vector loads, TMA and cuBLASLt want aligned operands). With a null base a Carver only
// counts, which is how a layout states its size before the buffer exists.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace tt::model {

constexpr size_t kCarveAlign = 256;

struct Carver {
  char* base = nullptr;
  size_t used = 0;

  // n elements of E (none: a null pointer, no space).
  template <class E>
  E* take(int64_t n) {
    used = (used + kCarveAlign - 1) / kCarveAlign * kCarveAlign;
    E* p = (base && n > 0) ? reinterpret_cast<E*>(base + used) : nullptr;
    used += (size_t)std::max<int64_t>(n, 0) * sizeof(E);
    return p;
  }
  // A sub-region of `bytes` bytes for a nested layout.
  char* take_bytes(size_t bytes) { return take<char>((int64_t)bytes); }
  size_t bytes() const { return (used + kCarveAlign - 1) / kCarveAlign * kCarveAlign; }
};

}  // namespace tt::model
