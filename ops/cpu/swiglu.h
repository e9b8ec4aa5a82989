// SwiGLU activation out = silu(gate) * up, CPU reference. Gradient contract: dgate and dup are
// overwritten.
#pragma once
#include <cstdint>

namespace tt::cpu {

// out, gate, up: (n) elements.
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t n);

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n);

}  // namespace tt::cpu
