// The VLA input stage's media part (issue 16): a SigLIP vision tower, the LLaVA projector and the
// state projection, which replace the decoder input rows of frame slots and state rows.
//
//   per unique frame f of the batch (pixels (3, S, S), S = vision.image_size, patch p):
//     x_f = patchify(pixels_f) W_pe^T + b_pe + pos          (P = (S / p)^2 tokens, D wide; no CLS)
//     per tower layer: x += attn(LN1 x) ; x += MLP(LN2 x)    (SiglipAttentionKind, SiglipMlpKind)
//     tokens_f = linear_2(act(linear_1(x_f)))                (P, C): LLaVA's multi_modal_projector
//   every frame slot (s rows [r, r + P) showing frame f):  x0[r + i] = tokens_f[i]
//     (a part of a slot, rows [r, r + n) showing tokens [t0, t0 + n): x0[r + i] = tokens_f[t0 + i])
//   every state row r with values u:                        x0[r] = u W_s^T + b_s
// The projector reads hidden_states[vision_feature_layer] as LLaVA does (-1: the last encoder
// layer's output; -2: the one before, LLaVA-1.5's choice), without SigLIP's post_layernorm (LLaVA
// never applies it, so the model has none). The layers after the one read keep their tensors
// (checkpoints round-trip them) but never run and are frozen (transformers gives them no gradient,
// so its optimizer skips them).
// A frame shown by several slots runs the tower once and its tokens' gradient is the sum over the
// slots (ops/cpu/vision.h sum_rows, in slot order); the embedding of the placeholder ids at media
// rows gets no gradient (those rows of dx are cleared before the token embedding's backward).
//
// Tower attention: every image is a one-node tree of P tokens in the one attention primitive's
// bidirectional visibility mode (ops/cpu/attention.h AttnLayout::bidirectional), NKV = NH, with
// q/k/v/out biases, scale head_dim^-1/2.
//
// Parameters (LlavaForConditionalGeneration names):
//   model.vision_tower.vision_model.embeddings.{patch_embedding.{weight (D, 3, p, p), bias (D)},
//       position_embedding.weight (P, D)}
//   model.vision_tower.vision_model.encoder.layers.<l>.{layer_norm1, layer_norm2}.{weight, bias} (D),
//       self_attn.{q_proj, k_proj, v_proj, out_proj}.{weight (D, D), bias (D)},
//       mlp.{fc1.weight (I, D), fc1.bias (I), fc2.weight (D, I), fc2.bias (D)}
//   model.multi_modal_projector.{linear_1.weight (C, D), linear_1.bias (C), linear_2.weight (C, C),
//       linear_2.bias (C)}
//   model.state_projector.{weight (C, state_dim), bias (C)} (ours; only with vision.state_dim > 0)
// vision.freeze: the tower's tensors are frozen (ParamInfo::trainable false): the tower runs without
// saving, backward stops at the projector's input.
// Both backends (E::kVisionOps); on CUDA the tower's head dim must be 64, 128 or 256 (check_model).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

// Tower layer l's attention block: x_out = x_in + out_proj(attn(q, k, v)), q/k/v = proj(LN1(x_in)).
class SiglipAttentionKind final : public LayerKind {
 public:
  SiglipAttentionKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b);
  std::string kind() const override { return "siglip_attention"; }
  Flops flops(const Work& w, Pass p) const override;  // per Work::frames

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

 private:
  template <class E>
  struct Saved;
  template <class E>
  struct Scratch;
  int D_, H_, HS_, P_;
  double eps_;
  int64_t ln_w_, ln_b_, wq_, bq_, wk_, bk_, wv_, bv_, wo_, bo_;
};

// Tower layer l's MLP block: x_out = x_in + fc2(act(fc1(LN2(x_in)))).
class SiglipMlpKind final : public LayerKind {
 public:
  SiglipMlpKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b);
  std::string kind() const override { return "siglip_mlp"; }
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

 private:
  template <class E>
  struct Saved;
  template <class E>
  struct Scratch;
  int D_, I_, P_;
  double eps_;
  bool tanh_;
  int64_t ln_w_, ln_b_, w1_, b1_, w2_, b2_;
};

// What one media forward or backward reads: the decoder's input rows and the batch's media.
// Pointers are on the backend's memory except `batch` (the host batch, forward only).
template <class E>
struct VisionCall {
  Mode mode = Mode::kTrain;
  const typename E::Weight* w = nullptr;
  typename E::Param* g = nullptr;
  const std::vector<std::unique_ptr<Block<E>>>* tower = nullptr;  // the tower's blocks on E
  typename E::Act* x = nullptr;   // (N, C) forward: the decoder's input rows (media rows overwritten)
  typename E::Act* dx = nullptr;  // (N, C) backward: d x0 (media rows read, then cleared)
  // The tower's view of the frames (F one-node trees, bidirectional; its layout in the stage's
  // buffer): forward builds it, backward reads it (the tile metadata is built once per batch).
  BatchView<E>* tower_view = nullptr;
};

class VisionKind {
 public:
  VisionKind(const ModelConfig& cfg, ParamTable::Builder& b);

  // The tower's blocks, two per tower layer that runs (attention, MLP; the layers up to
  // hidden_states[vision_feature_layer]), in order.
  const std::vector<std::unique_ptr<LayerKind>>& tower() const { return tower_; }
  // Table indices [begin, end) of every tensor of the media stage (contiguous).
  int begin() const { return begin_; }
  int end() const { return end_; }
  int tokens_per_frame() const { return P_; }
  int image_size() const { return S_; }
  int state_dim() const { return Sd_; }
  bool frozen() const { return freeze_; }
  Flops flops(const Work& w, Pass p) const;

  // Checks that a batch's media fit this stage (tokens per frame, image size, state length);
  // throws tt::Error naming what differs.
  void check_batch(const data::PackedBatch& b) const;

  // The stage's memory for a batch (metadata, pixels, the tower's activations, the projector's,
  // backward's scratch), carved from one buffer; held by the decoder's Activations. moves: the
  // rows the frame slots cover (PackedBatch::media_slot_rows).
  template <class E>
  size_t bytes(const std::vector<std::unique_ptr<Block<E>>>& tower, Mode mode, int F, int64_t moves, int n_state) const;
  // Uploads the batch's media into `buf` (sized by bytes()) and writes the media rows of c.x; the
  // caller has checked the batch (check_batch).
  template <class E>
  void forward(E& e, const VisionCall<E>& c, const data::PackedBatch& batch, char* buf) const;
  // Gradients of the last forward on `buf` (F, moves, n_state as it had), from the media rows of
  // c.dx, which it then clears.
  template <class E>
  void backward(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state) const;
  // A backward that a later one on the same forward follows (segment columns) leaves the tower
  // to the last: stash_grad adds the media rows of c.dx into acc ((moves + n_state) rows of C,
  // the accumulators' precision) and clears them; unstash_grad adds acc back into those rows of
  // c.dx before the last backward reads them (the stage's gradients are linear in them).
  template <class E>
  void stash_grad(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state,
                  typename E::Acc* acc) const;
  template <class E>
  void unstash_grad(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state,
                    const typename E::Acc* acc) const;

 private:
  template <class E>
  struct Acts;
  int C_, D_, L_, P_, S_, p_, K_, Sd_;
  bool freeze_, proj_tanh_;
  int begin_ = 0, end_ = 0;
  int64_t pe_w_, pe_b_, pos_, l1_w_, l1_b_, l2_w_, l2_b_, st_w_ = -1, st_b_ = -1;
  std::vector<std::unique_ptr<LayerKind>> tower_;
  std::vector<std::unique_ptr<LayerKind>> unused_;  // layers past vision_feature_layer: tensors only
};

}  // namespace tt::model
