// Token embedding lookup, CPU reference.
// Gradient contract: embedding_backward accumulates (+=) into dwte.
#pragma once
#include <cstdint>

namespace tt::cpu {

// out (N, C) = wte[tokens[n]] with wte (V, C).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int N, int C);

// dwte (V, C) += scatter of dout (N, C) by tokens.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int N, int C);

}  // namespace tt::cpu
