// Layer kind "swiglu_mlp" (Llama, Qwen3): the MLP block of a decoder layer.
//
//   x_out = x_in + down_proj(silu(gate_proj(n)) * up_proj(n)),   n = post_attention_layernorm(x_in)
//
// Parameters (HF names under model.layers.<l>.): post_attention_layernorm.weight (C),
// mlp.{gate_proj (I, C), up_proj (I, C), down_proj (C, I)}.weight.
// Saved (training forward): n (N,C), rstd (N), gate, up, h = swiglu(gate, up) (N,I). A backend
// whose backward consumes saved activations writes the gate/up gradients over gate and up.
// Backward overwrites dx with d x_in and adds parameter gradients. No carry.
#pragma once

#include <string>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

class MlpKind final : public LayerKind {
 public:
  // Adds the layer's tensors to the table (a block slice "model.layers.<l>.mlp").
  MlpKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b);

  std::string kind() const override { return "swiglu_mlp"; }
  Flops flops(const Work& w, Pass p) const override;

  template <class E>
  size_t saved_bytes(int N) const;
  template <class E>
  size_t scratch_bytes(int N) const;
  template <class E>
  void forward(E& e, const BlockCall<E>& c) const;
  template <class E>
  void backward(E& e, const BlockCall<E>& c) const;
  // Nothing crosses a cut from an MLP: the layer's entry is left as the mixer made it.
  template <class E>
  void export_carry(const char*, int, LayerCarry<E>&) const {}
  int64_t carry_row_elems() const { return 0; }

 private:
  template <class E>
  struct Saved;
  template <class E>
  struct Scratch;

  int C_, I_;
  double eps_;
  double norm_offset_;  // 1: Qwen3.5's zero-centred norm weight
  int64_t norm_, wg_, wu_, wd_;  // offsets in the flat buffers
};

}  // namespace tt::model
