// Qwen3.5's gated attention (CPU reference): q_proj gives, per head, the query and an output
// gate; the attention output is multiplied by sigmoid(gate) before o_proj.
#pragma once

#include <cstdint>

namespace tt::cpu {

// ab (N, H, 2D) per head [a_h (D) | b_h (D)] -> a, b (N, H, D); merge_heads is the reverse
// (overwrites ab).
template <class T>
void split_heads(T* a, T* b, const T* ab, int N, int H, int D);
template <class T>
void merge_heads(T* ab, const T* a, const T* b, int N, int H, int D);

// y = x sigmoid(gate) (n elements); backward: dx = dy sigmoid(gate), dgate = dy x s (1 - s)
// (both overwritten).
template <class T>
void sigmoid_gate_forward(T* y, const T* x, const T* gate, int64_t n);
template <class T>
void sigmoid_gate_backward(T* dx, T* dgate, const T* dy, const T* x, const T* gate, int64_t n);

}  // namespace tt::cpu
