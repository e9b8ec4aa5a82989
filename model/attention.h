// Layer kind "full_attention" (Llama, Qwen3): the mixer block of a decoder layer.
//
//   x_out = x_in + o_proj(attn(rope(qk_norm(q_proj(n))), rope(qk_norm(k_proj(n))), v_proj(n))),
//   n = input_layernorm(x_in)
// with Qwen3's per-head RMSNorm of q and k (qk_norm; Llama has none) and the tree attention
// primitive over the batch's DFS layout and the layer's carry (external KV prefixes: partition
// gateways, carried tails). Position ids are tree depths.
//
// Parameters (HF names under model.layers.<l>.): input_layernorm.weight (C),
// self_attn.{q_proj (NH HS, C), k_proj (NKV HS, C), v_proj (NKV HS, C), o_proj (C, NH HS)}.weight,
// and with qk_norm self_attn.{q_norm, k_norm}.weight (HS).
// Saved (training forward): n (N,C), rstd (N), [q_pre (N,NH,HS), k_pre (N,NKV,HS) before the norm,
// q_rstd (N,NH), k_rstd (N,NKV)], q, k after norm and RoPE, v, att (N,NH,HS), lse (N,NH).
// Qwen3.5 (qwen3_5_text; CPU backend): q_proj is (2 NH HS, C), per head [q_h | gate_h], o_proj
// reads att sigmoid(gate); the norms apply 1 + w; RoPE covers the first rotary_dim dims. Saved in
// addition: qg (N, 2 NH HS), gate and the gated output (N, NH, HS).
// Carry: the layer's K/V rows as attention reads them (after norm and RoPE), (N, NKV, HS) each.
// Backward overwrites dx with d x_in (+= of the residual path) and adds parameter gradients.
#pragma once

#include <string>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

class AttentionKind final : public LayerKind {
 public:
  // Adds the layer's tensors to the table (a block slice "model.layers.<l>.self_attn").
  AttentionKind(const ModelConfig& cfg, const LayerSpec& spec, int layer, ParamTable::Builder& b);

  std::string kind() const override { return "full_attention"; }
  Flops flops(const Work& w, Pass p) const override;
  bool qk_norm() const { return qk_norm_; }
  int head_dim() const { return HS_; }

  template <class E>
  size_t saved_bytes(int N) const;
  template <class E>
  size_t scratch_bytes(int N) const;
  template <class E>
  void forward(E& e, const BlockCall<E>& c) const;
  template <class E>
  void backward(E& e, const BlockCall<E>& c) const;
  template <class E>
  void export_carry(const char* saved, int N, LayerCarry<E>& out) const;
  int64_t carry_row_elems() const { return (int64_t)NKV_ * HS_; }

 private:
  template <class E>
  struct Saved;
  template <class E>
  struct Scratch;

  int C_, NH_, NKV_, HS_;
  double eps_;
  bool qk_norm_;
  bool gate_;           // Qwen3.5's output gate (LayerSpec::output_gate)
  double norm_offset_;  // 1: Qwen3.5's zero-centred input, q and k norm weights
  // Offsets of the tensors in the flat buffers.
  int64_t in_norm_, wq_, wk_, wv_, wo_, q_norm_ = -1, k_norm_ = -1;
};

}  // namespace tt::model
