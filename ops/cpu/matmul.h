// Dense projection out = x W^T with W in Hugging Face Linear layout (OC, IC), CPU reference.
// Rows are parallel over OpenMP threads; each output element has one writer, so results are
// deterministic. Gradient contract: out is overwritten; dx and dw are accumulated (+=).
#pragma once

namespace tt::cpu {

// out (N, OC) = x (N, IC) @ w (OC, IC)^T.
template <class T>
void matmul_forward(T* out, const T* x, const T* w, int N, int IC, int OC);

// dx (N, IC) += dout @ w; dw (OC, IC) += dout^T @ x. Either may be null to skip it.
template <class T>
void matmul_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, int N, int IC, int OC);

}  // namespace tt::cpu
