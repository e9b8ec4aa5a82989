// SwiGLU activation out = silu(gate) * up, CUDA, bf16 in and out with fp32 math.
// Gradient contract (as ops/cpu/swiglu.h): forward overwrites out; backward overwrites dgate and dup.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::cuda {

// out, gate, up: (n) elements.
void swiglu_forward(bf16* out, const bf16* gate, const bf16* up, int64_t n, cudaStream_t stream);

// dgate, dup (n) overwritten from dout, gate, up (n). dgate/dup may alias gate/up (in place).
void swiglu_backward(bf16* dgate, bf16* dup, const bf16* dout, const bf16* gate, const bf16* up, int64_t n,
                     cudaStream_t stream);

}  // namespace tt::cuda
