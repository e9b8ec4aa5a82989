// Layer kind "linear_attention": a Gated DeltaNet mixer block (Qwen3-Next / Qwen3.5's linear
// attention; ../shared/research/anchors-ssm-vla.md section 1.4) whose conv window and recurrent
// state follow the tree:
//
//   n = input_layernorm(x_in);  qkv = in_proj_qkv(n), z = in_proj_z(n), b = in_proj_b(n), a = in_proj_a(n)
//   u = silu(conv1d(qkv)) along root-to-token paths (the window crosses ancestors; ops/cpu/gdn.h)
//   q, k, v = split(u) (nk dk | nk dk | nv dv);  q, k L2-normalised per head (eps 1e-6)
//   beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   o = the gated delta rule (scale dk^-1/2; a node starts from its parent's end state)
//   x_out = x_in + out_proj(gated_rmsnorm(o, z) per value head, weight norm.weight)
//
// Parameters (Qwen3.5's split projections, HF names under model.layers.<l>.):
// input_layernorm.weight (C), linear_attn.{in_proj_qkv (2 nk dk + nv dv, C), in_proj_z (nv dv, C),
// in_proj_b (nv, C), in_proj_a (nv, C)}.weight, linear_attn.conv1d.weight (2 nk dk + nv dv, 1, K),
// linear_attn.A_log (nv), linear_attn.dt_bias (nv), linear_attn.norm.weight (dv),
// linear_attn.out_proj.weight (C, nv dv). Under qwen3_next the four input projections are two,
// linear_attn.in_proj_qkvz (2 nk dk + 2 nv dv, C) and in_proj_ba (2 nv, C), their rows grouped per
// key head g (r = nv / nk): [q_g (dk) | k_g (dk) | v_g (r dv) | z_g (r dv)] and [b_g (r) | a_g (r)];
// the layer computes them fused and moves the columns to the flat layout (and the gradients back).
// Under qwen3_5_text and qwen3_next input_layernorm is zero-centred (the layer applies 1 + w, as
// HF's); the gated norm's weight is plain (HF's one exception).
// Saved (training forward): n, rstd, qkv (pre-conv), z, a, b, u, q, k (pre-norm), their rstds, qn,
// kn, v, g, beta, o, y, y's rstd, and the batch's path_prev rows. The log decay g and the
// gradients dg, dbeta are E::Acc (fp32 on the GPU, as transformers computes g: the delta rule sums
// g over a chunk, and dA_log / ddt_bias sum dg over every row with cancellation).
// Carry (model/block.h): a forward reads each root's recurrent state and conv context from the
// carry's state slots (the conv runs over the context rows chained before the root, so windows
// cross the cut). A no-grad forward stores each root's end state and conv tail through the
// CacheWrite (the inference cache: prompts, then one-token decode rows). A partition piece's
// training forward offers the end states and conv tails of the nodes its child pieces hang from;
// its backward adds the gradients those readers left there (the end-state gradient enters the
// delta rule's backward, the tail gradient the conv's inputs) and adds its own roots' init-state
// and context gradients into the slots it read (fp32 or wider): partitioned training of a hybrid
// equals unpartitioned training. Runs on both backends (E::kHybridOps): the CPU backend keeps the
// carried context in host vectors (Recurrent, E::kHostRecurrent), the CUDA backend in device
// buffers (DeviceContext), its conv backward over the context rows placed before their roots (a
// DFS layout of its own, so the descendant gather reaches them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

class GdnKind final : public LayerKind {
 public:
  // Adds the layer's tensors to the table (a block slice "model.layers.<l>.linear_attn").
  GdnKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b);

  std::string kind() const override { return "linear_attention"; }
  Flops flops(const Work& w, Pass p) const override;

  template <class E>
  size_t saved_bytes(int N) const;
  template <class E>
  size_t scratch_bytes(int N) const;
  template <class E>
  void forward(E& e, const BlockCall<E>& c) const;
  template <class E>
  void backward(E& e, const BlockCall<E>& c) const;
  template <class E>
  void export_carry(const char*, int, LayerCarry<E>&) const {}
  int64_t carry_row_elems() const { return 0; }
  int64_t recurrent_state_elems() const override { return (int64_t)nv_ * dk_ * dv_; }
  int64_t conv_context_elems() const override { return (int64_t)(K_ - 1) * CD_; }

 private:
  template <class E>
  struct Saved;
  template <class E>
  struct Recurrent;
  template <class E>
  Recurrent<E> recurrent_begin(const BlockCall<E>& c, const typename E::Act* qkv, const int32_t* prev, bool carried,
                               bool outputs) const;
  template <class E>
  void recurrent_write(const BlockCall<E>& c, const Recurrent<E>& r, int node, typename E::Acc* state,
                       typename E::Act* conv) const;
  template <class E>
  void recurrent_store(const BlockCall<E>& c, const Recurrent<E>& r) const;
  template <class E>
  void check_carry(const BlockCall<E>& c) const;
  // The device-memory counterpart of Recurrent for backends without host carries (the CUDA
  // backend): a no-grad forward's carried context (context rows, links, init states from the
  // cache's slots) and the stores of end states and conv tails into them.
  template <class E>
  struct DeviceContext;
  template <class E>
  void device_begin(E& e, const BlockCall<E>& c, const typename E::Act* qkv, bool carried, bool ends,
                    DeviceContext<E>& d) const;
  template <class E>
  void device_write(E& e, DeviceContext<E>& d, const typename E::Act* qkv, const std::vector<int>& nodes,
                    const std::vector<int64_t>& slots, typename E::Acc* state, typename E::Act* conv) const;
  template <class E>
  void device_conv_backward(E& e, const BlockCall<E>& c, DeviceContext<E>& d, const typename E::Act* du,
                            typename E::Act* dx, bool carried) const;
  template <class E>
  struct Scratch;
  // qwen3_next: the fused outputs (grouped per key head) to the flat qkv, z, b, a (to_flat), or
  // the flat gradients back into the grouped buffers.
  template <class E>
  void regroup(E& e, bool to_flat, typename E::Act* qkvz, typename E::Act* ba, typename E::Act* qkv,
               typename E::Act* z, typename E::Act* b, typename E::Act* a, int N) const;

  int C_, nk_, nv_, dk_, dv_, K_;
  int KD_, VD_, CD_;  // nk dk, nv dv, 2 KD + VD (the conv channels)
  double eps_;
  double norm_offset_;  // input_layernorm: 1 under qwen3_5_text and qwen3_next (zero-centred)
  bool fused_;          // qwen3_next: in_proj_qkvz (at w_qkv_) and in_proj_ba (at w_b_)
  int64_t in_norm_, w_qkv_, w_z_ = -1, w_b_, w_a_ = -1, conv_, a_log_, dt_bias_, norm_, w_out_;
};

}  // namespace tt::model
