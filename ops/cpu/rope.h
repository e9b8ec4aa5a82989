// Rotary position embedding, Hugging Face "rotate_half" convention, CPU reference.
// Element d < HS/2 pairs with d + HS/2; angle = pos * theta^(-2d/HS), computed in double.
// Positions are tree depths (data/packing.h), not packed indices. In place; the backward is the
// inverse rotation applied to the gradient in place.
#pragma once
#include <cstdint>

namespace tt::cpu {

// x (N, H, HS) rotated in place by pos (N). rotary_dim > 0: only the first rotary_dim dims of
// each head rotate, pairing d with d + rotary_dim / 2 at theta^(-2d/rotary_dim) (HF's partial
// RoPE, Qwen3-Next / Qwen3.5); the rest pass through. 0: all HS.
template <class T>
void rope_forward(T* x, const int32_t* pos, int N, int H, int HS, double theta, int rotary_dim = 0);

// dx (N, H, HS): gradient w.r.t. the rotated output in, gradient w.r.t. the input out.
template <class T>
void rope_backward(T* dx, const int32_t* pos, int N, int H, int HS, double theta, int rotary_dim = 0);

}  // namespace tt::cpu
