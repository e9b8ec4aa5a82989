// The VLA media stage: the SigLIP tower's layer kinds, the projector and the state projection (see
// vision.h). Written over the op vocabulary; instantiated for every backend.
#include "model/vision.h"

#include <algorithm>
#include <numeric>

#include "base/check.h"
#include "model/carve.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"

namespace tt::model {
namespace {

const char* const kTower = "model.vision_tower.vision_model.";

std::string layer_prefix(int l) { return str(kTower, "encoder.layers.", l, "."); }

}  // namespace

// ---- SiglipAttentionKind ----

SiglipAttentionKind::SiglipAttentionKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b)
    : LayerKind(layer, ParamSlice{}),
      D_((int)cfg.vision.hidden_size),
      H_((int)cfg.vision.num_attention_heads),
      HS_((int)cfg.vision.head_dim()),
      P_((int)cfg.vision.tokens_per_frame()),
      eps_(cfg.vision.layer_norm_eps) {
  const std::string pre = layer_prefix(layer);
  const int64_t D = D_;
  b.begin_block(pre + "self_attn");
  const int first = b.add(pre + "layer_norm1.weight", {D}, ParamRole::kNormWeight);
  ln_w_ = b.offset(first);
  ln_b_ = b.offset(b.add(pre + "layer_norm1.bias", {D}, ParamRole::kBias));
  int64_t* w[4] = {&wq_, &wk_, &wv_, &wo_};
  int64_t* bias[4] = {&bq_, &bk_, &bv_, &bo_};
  const char* names[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
  int last = first;
  for (int i = 0; i < 4; ++i) {
    *w[i] = b.offset(b.add(str(pre, "self_attn.", names[i], ".weight"), {D, D}, ParamRole::kMatrix));
    last = b.add(str(pre, "self_attn.", names[i], ".bias"), {D}, ParamRole::kBias);
    *bias[i] = b.offset(last);
  }
  b.end_block();
  slice_ = ParamSlice{pre + "self_attn", first, last + 1};
}

Flops SiglipAttentionKind::flops(const Work& w, Pass p) const {
  const double tokens = (double)w.frames * P_, pairs = (double)w.frames * P_ * P_;
  const double f = pass_factor(p) * (4.0 * ((double)D_ * D_ + D_) * tokens + 2.0 * D_ * pairs);
  return Flops{f, f};
}

template <class E>
struct SiglipAttentionKind::Saved {
  using Act = typename E::Act;
  Act *n, *q, *k, *v, *att;            // (N, D)
  typename E::Stat *mean, *rstd, *lse;  // (N), (N), (N, H)
  size_t bytes;
  Saved(const SiglipAttentionKind& m, int N, char* base) {
    const int64_t n = N, D = m.D_;
    Carver c{base};
    this->n = c.take<Act>(n * D);
    q = c.take<Act>(n * D);
    k = c.take<Act>(n * D);
    v = c.take<Act>(n * D);
    att = c.take<Act>(n * D);
    mean = c.take<typename E::Stat>(n);
    rstd = c.take<typename E::Stat>(n);
    lse = c.take<typename E::Stat>(n * m.H_);
    bytes = c.bytes();
  }
};

template <class E>
struct SiglipAttentionKind::Scratch {
  using Act = typename E::Act;
  Act *datt, *dq, *dk, *dv, *dn;  // (N, D)
  size_t bytes;
  Scratch(const SiglipAttentionKind& m, int N, char* base) {
    const int64_t n = (int64_t)N * m.D_;
    Carver c{base};
    datt = c.take<Act>(n);
    dq = c.take<Act>(n);
    dk = c.take<Act>(n);
    dv = c.take<Act>(n);
    dn = c.take<Act>(n);
    bytes = c.bytes();
  }
};

template <class E>
size_t SiglipAttentionKind::saved_bytes(int N) const {
  return Saved<E>(*this, N, nullptr).bytes;
}
template <class E>
size_t SiglipAttentionKind::scratch_bytes(int N) const {
  return Scratch<E>(*this, N, nullptr).bytes;
}

template <class E>
void SiglipAttentionKind::forward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, D = D_;
  const Saved<E> s(*this, N, c.saved);
  const auto* w = c.w;
  e.layernorm_forward(s.n, s.mean, s.rstd, c.x_in, w + ln_w_, w + ln_b_, N, D, eps_);
  typename E::Act* qkv[3] = {s.q, s.k, s.v};
  const int64_t wo[3] = {wq_, wk_, wv_}, bo[3] = {bq_, bk_, bv_};
  for (int i = 0; i < 3; ++i) {
    e.linear(qkv[i], s.n, w + wo[i], N, D, D);
    e.bias_add(qkv[i], w + bo[i], N, D);
  }
  e.attention_forward(s.att, s.lse, s.q, s.k, s.v, c.batch->layout, nullptr, 0, N, H_, H_, HS_);
  e.linear(c.sum, s.att, w + wo_, N, D, D);
  e.bias_add(c.sum, w + bo_, N, D);
  e.residual_add(c.x_out, c.x_in, c.sum, (int64_t)N * D);
}

template <class E>
void SiglipAttentionKind::backward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, D = D_;
  const Saved<E> s(*this, N, c.saved);
  const Scratch<E> t(*this, N, c.scratch);
  const auto* w = c.w;
  auto* g = c.g;
  e.linear_dx(t.datt, c.dx, w + wo_, N, D, D, /*accumulate=*/false);
  e.linear_dw(g + wo_, c.dx, s.att, N, D, D);
  e.bias_backward(g + bo_, c.dx, N, D);
  e.attention_backward(t.dq, t.dk, t.dv, t.datt, s.att, s.lse, s.q, s.k, s.v, c.batch->layout, nullptr, 0, N, H_, H_,
                       HS_);
  typename E::Act* d[3] = {t.dq, t.dk, t.dv};
  const int64_t wo[3] = {wq_, wk_, wv_}, bo[3] = {bq_, bk_, bv_};
  for (int i = 0; i < 3; ++i) {
    e.linear_dw(g + wo[i], d[i], s.n, N, D, D);
    e.bias_backward(g + bo[i], d[i], N, D);
    e.linear_dx(t.dn, d[i], w + wo[i], N, D, D, /*accumulate=*/i > 0);
  }
  e.layernorm_backward(c.dx, g + ln_w_, g + ln_b_, t.dn, c.x_in, w + ln_w_, s.mean, s.rstd, N, D);
}

// ---- SiglipMlpKind ----

SiglipMlpKind::SiglipMlpKind(const ModelConfig& cfg, int layer, ParamTable::Builder& b)
    : LayerKind(layer, ParamSlice{}),
      D_((int)cfg.vision.hidden_size),
      I_((int)cfg.vision.intermediate_size),
      P_((int)cfg.vision.tokens_per_frame()),
      eps_(cfg.vision.layer_norm_eps),
      tanh_(cfg.vision.hidden_act == "gelu_pytorch_tanh") {
  const std::string pre = layer_prefix(layer);
  const int64_t D = D_, I = I_;
  b.begin_block(pre + "mlp");
  const int first = b.add(pre + "layer_norm2.weight", {D}, ParamRole::kNormWeight);
  ln_w_ = b.offset(first);
  ln_b_ = b.offset(b.add(pre + "layer_norm2.bias", {D}, ParamRole::kBias));
  w1_ = b.offset(b.add(pre + "mlp.fc1.weight", {I, D}, ParamRole::kMatrix));
  b1_ = b.offset(b.add(pre + "mlp.fc1.bias", {I}, ParamRole::kBias));
  w2_ = b.offset(b.add(pre + "mlp.fc2.weight", {D, I}, ParamRole::kMatrix));
  const int last = b.add(pre + "mlp.fc2.bias", {D}, ParamRole::kBias);
  b2_ = b.offset(last);
  b.end_block();
  slice_ = ParamSlice{pre + "mlp", first, last + 1};
}

Flops SiglipMlpKind::flops(const Work& w, Pass p) const {
  const double f = pass_factor(p) * (2.0 * D_ * I_ + I_ + D_) * (double)w.frames * P_;
  return Flops{f, f};
}

template <class E>
struct SiglipMlpKind::Saved {
  using Act = typename E::Act;
  Act* n;                          // (N, D)
  Act *h, *a;                      // (N, I) fc1 output, activation
  typename E::Stat *mean, *rstd;  // (N)
  size_t bytes;
  Saved(const SiglipMlpKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    this->n = c.take<Act>(n * m.D_);
    h = c.take<Act>(n * m.I_);
    a = c.take<Act>(n * m.I_);
    mean = c.take<typename E::Stat>(n);
    rstd = c.take<typename E::Stat>(n);
    bytes = c.bytes();
  }
};

template <class E>
struct SiglipMlpKind::Scratch {
  using Act = typename E::Act;
  Act *da, *dh;  // (N, I)
  Act* dn;       // (N, D)
  size_t bytes;
  Scratch(const SiglipMlpKind& m, int N, char* base) {
    const int64_t n = N;
    Carver c{base};
    da = c.take<Act>(n * m.I_);
    dh = c.take<Act>(n * m.I_);
    dn = c.take<Act>(n * m.D_);
    bytes = c.bytes();
  }
};

template <class E>
size_t SiglipMlpKind::saved_bytes(int N) const {
  return Saved<E>(*this, N, nullptr).bytes;
}
template <class E>
size_t SiglipMlpKind::scratch_bytes(int N) const {
  return Scratch<E>(*this, N, nullptr).bytes;
}

template <class E>
void SiglipMlpKind::forward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, D = D_, I = I_;
  const Saved<E> s(*this, N, c.saved);
  const auto* w = c.w;
  e.layernorm_forward(s.n, s.mean, s.rstd, c.x_in, w + ln_w_, w + ln_b_, N, D, eps_);
  e.linear(s.h, s.n, w + w1_, N, D, I);
  e.bias_add(s.h, w + b1_, N, I);
  e.gelu_forward(s.a, s.h, (int64_t)N * I, tanh_);
  e.linear(c.sum, s.a, w + w2_, N, I, D);
  e.bias_add(c.sum, w + b2_, N, D);
  e.residual_add(c.x_out, c.x_in, c.sum, (int64_t)N * D);
}

template <class E>
void SiglipMlpKind::backward(E& e, const BlockCall<E>& c) const {
  const int N = c.batch->N, D = D_, I = I_;
  const Saved<E> s(*this, N, c.saved);
  const Scratch<E> t(*this, N, c.scratch);
  const auto* w = c.w;
  auto* g = c.g;
  e.linear_dx(t.da, c.dx, w + w2_, N, I, D, /*accumulate=*/false);
  e.linear_dw(g + w2_, c.dx, s.a, N, I, D);
  e.bias_backward(g + b2_, c.dx, N, D);
  e.zero(t.dh, sizeof(typename E::Act) * (size_t)N * I);
  e.gelu_backward(t.dh, t.da, s.h, (int64_t)N * I, tanh_);  // dh += gelu'(h) da
  e.linear_dw(g + w1_, t.dh, s.n, N, D, I);
  e.bias_backward(g + b1_, t.dh, N, I);
  e.linear_dx(t.dn, t.dh, w + w1_, N, D, I, /*accumulate=*/false);
  e.layernorm_backward(c.dx, g + ln_w_, g + ln_b_, t.dn, c.x_in, w + ln_w_, s.mean, s.rstd, N, D);
}

// ---- VisionKind ----

VisionKind::VisionKind(const ModelConfig& cfg, ParamTable::Builder& b)
    : C_((int)cfg.hidden_size),
      D_((int)cfg.vision.hidden_size),
      L_((int)cfg.vision.num_hidden_layers),
      P_((int)cfg.vision.tokens_per_frame()),
      S_((int)cfg.vision.image_size),
      p_((int)cfg.vision.patch_size),
      K_(3 * p_ * p_),
      Sd_((int)cfg.vision.state_dim),
      freeze_(cfg.vision.freeze),
      proj_tanh_(cfg.vision.projector_hidden_act == "gelu_pytorch_tanh") {
  const int64_t C = C_, D = D_, p = p_;
  const std::string emb = str(kTower, "embeddings.");
  b.begin_block(emb.substr(0, emb.size() - 1));
  begin_ = b.add(emb + "patch_embedding.weight", {D, 3, p, p}, ParamRole::kMatrix);
  pe_w_ = b.offset(begin_);
  pe_b_ = b.offset(b.add(emb + "patch_embedding.bias", {D}, ParamRole::kBias));
  pos_ = b.offset(b.add(emb + "position_embedding.weight", {(int64_t)P_, D}, ParamRole::kMatrix));
  b.end_block();
  // Layers past hidden_states[vision_feature_layer]: their tensors only (frozen, never run).
  const int used = (int)cfg.vision.feature_layers();
  int first_unused = -1;
  for (int l = 0; l < L_; ++l) {
    if (l == used) first_unused = b.size();
    auto& kinds = l < used ? tower_ : unused_;
    kinds.push_back(std::make_unique<SiglipAttentionKind>(cfg, l, b));
    kinds.push_back(std::make_unique<SiglipMlpKind>(cfg, l, b));
  }
  if (first_unused >= 0) b.freeze_from(first_unused);
  if (freeze_) b.freeze_from(begin_);
  const std::string mm = "model.multi_modal_projector";
  b.begin_block(mm);
  l1_w_ = b.offset(b.add(mm + ".linear_1.weight", {C, D}, ParamRole::kMatrix));
  l1_b_ = b.offset(b.add(mm + ".linear_1.bias", {C}, ParamRole::kBias));
  l2_w_ = b.offset(b.add(mm + ".linear_2.weight", {C, C}, ParamRole::kMatrix));
  end_ = b.add(mm + ".linear_2.bias", {C}, ParamRole::kBias) + 1;
  l2_b_ = b.offset(end_ - 1);
  b.end_block();
  if (Sd_ > 0) {
    b.begin_block("model.state_projector");
    st_w_ = b.offset(b.add("model.state_projector.weight", {C, (int64_t)Sd_}, ParamRole::kMatrix));
    end_ = b.add("model.state_projector.bias", {C}, ParamRole::kBias) + 1;
    st_b_ = b.offset(end_ - 1);
    b.end_block();
  }
}

Flops VisionKind::flops(const Work& w, Pass p) const {
  const Pass tower = freeze_ ? Pass::kForward : p;
  Flops f;
  for (const auto& k : tower_) f += k->flops(w, tower);
  const double rows = (double)w.frames * P_;
  const bool train = p == Pass::kTrain;
  // Patch embedding: no gradient into the pixels (4 in training), none at all when frozen.
  const double pe = (train && !freeze_ ? 4.0 : 2.0) * ((double)K_ * D_ + D_) * rows;
  // linear_1 takes no input gradient when the tower is frozen.
  const double l1 = (train ? (freeze_ ? 4.0 : 6.0) : 2.0) * ((double)D_ * C_ + C_) * rows;
  const double l2 = pass_factor(p) * ((double)C_ * C_ + C_) * rows;
  const double st = (train ? 4.0 : 2.0) * ((double)Sd_ * C_ + C_) * (double)w.state_rows;
  const double x = pe + l1 + l2 + st;
  f += Flops{x, x};
  return f;
}

void VisionKind::check_batch(const data::PackedBatch& b) const {
  if (!b.slot_row.empty()) {
    TT_CHECK(b.tokens_per_frame == P_, "model: the batch's frame slots are ", b.tokens_per_frame,
             " rows each, the vision tower gives ", P_, " tokens per frame ((vision.image_size / vision.patch_size)^2)");
  }
  if (!b.frames.empty()) {
    TT_CHECK(b.image_size == S_, "model: the batch's frames are ",
             b.image_size == 0 ? std::string("not loaded") : str(b.image_size, " x ", b.image_size), ", the tower reads ",
             S_, " x ", S_, " (data::load_frames with vision.image_size)");
  }
  if (!b.state_row.empty()) {
    TT_CHECK(Sd_ > 0, "model: the batch has ", b.state_row.size(), " state rows, but vision.state_dim is 0");
    TT_CHECK(b.state_dim == Sd_, "model: the batch's states have ", b.state_dim, " values, vision.state_dim is ", Sd_);
  }
}

// The stage's regions in one buffer: metadata (one host image), then activations and scratch.
template <class E>
struct VisionKind::Acts {
  using Act = typename E::Act;
  int32_t *node_start, *node_len, *node_parent;  // (F) one bidirectional node per frame
  int32_t *subtree_end, *key_lo;                 // (M) each token's frame end and start
  int32_t *dst_rows, *src_rows;                  // (moves) decoder row <- tower row
  int32_t *tok_off, *tok_src;                    // (M + 1), (moves) per tower row: its decoder rows
  int32_t *state_rows, *state_src;               // (n_state) decoder row, 0..n_state-1
  int32_t* iota;                                 // (max(moves, n_state)) 0, 1, ...: stash rows
  float* pixels;                                 // (F, 3, S, S)
  Act* state_in;                                 // (n_state, Sd)
  size_t meta_bytes;
  char* layout;                // the tower's attention layout (E::layout_bytes)
  Act* patches;                // (M, K)
  std::vector<Act*> xs;        // tower residual stream: training 2 L + 1, else 2 in turn
  std::vector<char*> saved;    // per tower block (else one shared region)
  Act *h1, *a1, *h2;           // (M, C) projector
  Act* state_out;              // (n_state, C)
  Act *dh, *da1, *dxv;         // (M, C), (M, C), (M, D)
  typename E::Acc* sum;        // (M, D) the tower blocks' Acc buffer
  char* block_scratch;
  Act* dstate;                 // (n_state, C)
  size_t bytes;

  // moves: the decoder rows the frames' tokens go to (every slot's rows; P a whole slot).
  Acts(const VisionKind& v, const std::vector<std::unique_ptr<Block<E>>>& tower, Mode mode, int F, int64_t moves,
       int n_state, char* base) {
    const int64_t M = (int64_t)F * v.P_;
    const bool train = mode == Mode::kTrain && !v.freeze_;
    Carver c{base};
    node_start = c.take<int32_t>(F);
    node_len = c.take<int32_t>(F);
    node_parent = c.take<int32_t>(F);
    subtree_end = c.take<int32_t>(M);
    key_lo = c.take<int32_t>(M);
    dst_rows = c.take<int32_t>(moves);
    src_rows = c.take<int32_t>(moves);
    tok_off = c.take<int32_t>(M + 1);
    tok_src = c.take<int32_t>(moves);
    state_rows = c.take<int32_t>(n_state);
    state_src = c.take<int32_t>(n_state);
    iota = c.take<int32_t>(std::max<int64_t>(moves, n_state));
    pixels = c.take<float>((int64_t)F * 3 * v.S_ * v.S_);
    state_in = c.take<Act>((int64_t)n_state * v.Sd_);
    meta_bytes = c.bytes();
    layout = c.take_bytes(E::layout_bytes((int)M));
    patches = c.take<Act>(M * v.K_);
    const int B = (int)tower.size();
    for (int i = 0; i < (train ? B + 1 : 2); ++i) xs.push_back(c.take<Act>(M * v.D_));
    size_t most = 0, scratch = 0;
    for (const auto& b : tower) {
      most = std::max(most, b->saved_bytes((int)M));
      scratch = std::max(scratch, b->scratch_bytes((int)M));
    }
    if (train) {
      for (const auto& b : tower) saved.push_back(c.take_bytes(b->saved_bytes((int)M)));
    } else {
      saved.assign(B, c.take_bytes(most));
    }
    h1 = c.take<Act>(M * v.C_);
    a1 = c.take<Act>(M * v.C_);
    h2 = c.take<Act>(M * v.C_);
    state_out = c.take<Act>((int64_t)n_state * v.C_);
    const bool grads = mode == Mode::kTrain;
    dh = c.take<Act>(grads ? M * v.C_ : 0);
    da1 = c.take<Act>(grads ? M * v.C_ : 0);
    dxv = c.take<Act>(train ? M * v.D_ : 0);
    sum = c.take<typename E::Acc>(M * v.D_);
    block_scratch = c.take_bytes(train ? scratch : 0);
    dstate = c.take<Act>(grads ? (int64_t)n_state * v.C_ : 0);
    bytes = c.bytes();
  }
};

template <class E>
size_t VisionKind::bytes(const std::vector<std::unique_ptr<Block<E>>>& tower, Mode mode, int F, int64_t moves,
                         int n_state) const {
  return Acts<E>(*this, tower, mode, F, moves, n_state, nullptr).bytes;
}

namespace {

// The frames as the tower's blocks read them: F one-node trees of P rows, bidirectional.
template <class E, class A>
BatchView<E> tower_view(E& e, int F, int P, const A& a) {
  BatchView<E> tv;
  tv.N = F * P;
  tv.layout = e.make_layout(tv.N, F, a.node_start, a.node_len, a.node_parent, a.subtree_end, P == 1, a.layout,
                            a.key_lo);
  return tv;
}

}  // namespace

template <class E>
void VisionKind::forward(E& e, const VisionCall<E>& c, const data::PackedBatch& batch, char* buf) const {
  const int F = (int)batch.frames.size(), n_slots = (int)batch.slot_row.size(), n_state = (int)batch.state_row.size();
  const int M = F * P_, C = C_, D = D_;
  const int64_t moves = batch.media_slot_rows();
  const Acts<E> a(*this, *c.tower, c.mode, F, moves, n_state, buf);
  {  // the metadata's host image, one upload
    std::vector<char> staging(a.meta_bytes);
    const Acts<E> h(*this, *c.tower, c.mode, F, moves, n_state, staging.data());
    for (int f = 0; f < F; ++f) {
      h.node_start[f] = f * P_;
      h.node_len[f] = P_;
      h.node_parent[f] = -1;
      for (int i = 0; i < P_; ++i) {
        h.subtree_end[f * P_ + i] = (f + 1) * P_;
        h.key_lo[f * P_ + i] = f * P_;
      }
    }
    // Slot s's rows show its frame's tokens [t0, t0 + n) (the whole frame unless a segment
    // boundary cut the slot: data::plan_segments).
    int64_t m = 0;
    for (int s = 0; s < n_slots; ++s) {
      const int n = batch.slot_rows(s), t0 = batch.slot_first_token(s);
      for (int i = 0; i < n; ++i, ++m) {
        h.dst_rows[m] = batch.slot_row[s] + i;
        h.src_rows[m] = batch.slot_frame[s] * P_ + t0 + i;
      }
    }
    // The reverse map in CSR (slot order within a tower row): the backward's gather-sum.
    std::fill(h.tok_off, h.tok_off + M + 1, 0);
    for (int64_t j = 0; j < moves; ++j) ++h.tok_off[h.src_rows[j] + 1];
    for (int t = 0; t < M; ++t) h.tok_off[t + 1] += h.tok_off[t];
    std::vector<int32_t> next(h.tok_off, h.tok_off + M);  // next free entry of each tower row
    for (int64_t j = 0; j < moves; ++j) h.tok_src[next[h.src_rows[j]]++] = h.dst_rows[j];
    for (int r = 0; r < n_state; ++r) {
      h.state_rows[r] = batch.state_row[r];
      h.state_src[r] = r;
    }
    std::iota(h.iota, h.iota + std::max<int64_t>(moves, n_state), 0);
    if (F) std::copy(batch.pixels.begin(), batch.pixels.end(), h.pixels);
    for (size_t i = 0; i < batch.state.size(); ++i) h.state_in[i] = (typename E::Act)batch.state[i];
    e.upload(buf, staging.data(), a.meta_bytes);
  }
  const auto* w = c.w;
  if (F > 0) {
    // Patch embedding and learned positions (a (P D) bias on each frame's rows).
    e.patchify(a.patches, a.pixels, F, S_, p_);
    e.linear(a.xs[0], a.patches, w + pe_w_, M, K_, D);
    e.bias_add(a.xs[0], w + pe_b_, M, D);
    e.bias_add(a.xs[0], w + pos_, F, P_ * D);
    *c.tower_view = tower_view(e, F, P_, a);
    const BatchView<E>& tv = *c.tower_view;
    const bool train = c.mode == Mode::kTrain && !freeze_;
    const int B = (int)c.tower->size();
    for (int b = 0; b < B; ++b) {
      BlockCall<E> bc;
      bc.mode = train ? Mode::kTrain : Mode::kNoGrad;
      bc.batch = &tv;
      bc.w = w;
      bc.saved = a.saved[b];
      bc.x_in = a.xs[train ? b : b % 2];
      bc.x_out = a.xs[train ? b + 1 : (b + 1) % 2];
      bc.sum = a.sum;
      (*c.tower)[b]->forward(e, bc);
    }
    const typename E::Act* feat = a.xs[train ? B : B % 2];
    e.linear(a.h1, feat, w + l1_w_, M, D, C);
    e.bias_add(a.h1, w + l1_b_, M, C);
    e.gelu_forward(a.a1, a.h1, (int64_t)M * C, proj_tanh_);
    e.linear(a.h2, a.a1, w + l2_w_, M, C, C);
    e.bias_add(a.h2, w + l2_b_, M, C);
    e.copy_rows(c.x, a.dst_rows, a.h2, a.src_rows, moves, C);
  }
  if (n_state > 0) {
    e.linear(a.state_out, a.state_in, w + st_w_, n_state, Sd_, C);
    e.bias_add(a.state_out, w + st_b_, n_state, C);
    e.copy_rows(c.x, a.state_rows, a.state_out, a.state_src, n_state, C);
  }
}

template <class E>
void VisionKind::backward(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state) const {
  const int M = F * P_, C = C_, D = D_;
  const Acts<E> a(*this, *c.tower, Mode::kTrain, F, moves, n_state, buf);
  const auto* w = c.w;
  auto* g = c.g;
  if (n_state > 0) {
    e.copy_rows(a.dstate, a.state_src, c.dx, a.state_rows, n_state, C);
    e.zero_rows(c.dx, a.state_rows, n_state, C);
    e.linear_dw(g + st_w_, a.dstate, a.state_in, n_state, Sd_, C);
    e.bias_backward(g + st_b_, a.dstate, n_state, C);
  }
  if (F == 0) return;
  // d tokens_f = sum over the slots showing f (in slot order); the slot rows' dx then cleared.
  e.sum_rows(a.dh, c.dx, a.tok_off, a.tok_src, M, C);
  e.zero_rows(c.dx, a.dst_rows, moves, C);
  e.bias_backward(g + l2_b_, a.dh, M, C);
  e.linear_dw(g + l2_w_, a.dh, a.a1, M, C, C);
  e.linear_dx(a.da1, a.dh, w + l2_w_, M, C, C, /*accumulate=*/false);
  e.zero(a.dh, sizeof(typename E::Act) * (size_t)M * C);
  e.gelu_backward(a.dh, a.da1, a.h1, (int64_t)M * C, proj_tanh_);  // d h1
  const bool train = !freeze_;
  const int B = (int)c.tower->size();
  const typename E::Act* feat = a.xs[train ? B : B % 2];
  e.bias_backward(g + l1_b_, a.dh, M, C);
  e.linear_dw(g + l1_w_, a.dh, feat, M, D, C);
  if (freeze_) return;
  e.linear_dx(a.dxv, a.dh, w + l1_w_, M, D, C, /*accumulate=*/false);
  const BatchView<E>& tv = *c.tower_view;  // the forward's
  for (int b = B - 1; b >= 0; --b) {
    BlockCall<E> bc;
    bc.mode = Mode::kTrain;
    bc.batch = &tv;
    bc.w = w;
    bc.g = g;
    bc.saved = a.saved[b];
    bc.scratch = a.block_scratch;
    bc.x_in = a.xs[b];
    bc.dx = a.dxv;
    bc.sum = a.sum;
    (*c.tower)[b]->backward(e, bc);
  }
  e.bias_backward(g + pos_, a.dxv, F, P_ * D);
  e.bias_backward(g + pe_b_, a.dxv, M, D);
  e.linear_dw(g + pe_w_, a.dxv, a.patches, M, K_, D);
}

template <class E>
void VisionKind::stash_grad(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state,
                            typename E::Acc* acc) const {
  const Acts<E> a(*this, *c.tower, Mode::kTrain, F, moves, n_state, buf);
  if (moves > 0) {
    e.add_rows(acc, a.iota, c.dx, a.dst_rows, (int)moves, C_);
    e.zero_rows(c.dx, a.dst_rows, (int)moves, C_);
  }
  if (n_state > 0) {
    e.add_rows(acc + moves * C_, a.iota, c.dx, a.state_rows, n_state, C_);
    e.zero_rows(c.dx, a.state_rows, n_state, C_);
  }
}

template <class E>
void VisionKind::unstash_grad(E& e, const VisionCall<E>& c, char* buf, int F, int64_t moves, int n_state,
                              const typename E::Acc* acc) const {
  const Acts<E> a(*this, *c.tower, Mode::kTrain, F, moves, n_state, buf);
  if (moves > 0) e.add_rows(c.dx, a.dst_rows, acc, a.iota, (int)moves, C_);
  if (n_state > 0) e.add_rows(c.dx, a.state_rows, acc + moves * C_, a.iota, n_state, C_);
}

#define TT_VISION_INSTANTIATE(E)                                                                              \
  template size_t SiglipAttentionKind::saved_bytes<E>(int) const;                                            \
  template size_t SiglipAttentionKind::scratch_bytes<E>(int) const;                                          \
  template void SiglipAttentionKind::forward<E>(E&, const BlockCall<E>&) const;                              \
  template void SiglipAttentionKind::backward<E>(E&, const BlockCall<E>&) const;                             \
  template size_t SiglipMlpKind::saved_bytes<E>(int) const;                                                  \
  template size_t SiglipMlpKind::scratch_bytes<E>(int) const;                                                \
  template void SiglipMlpKind::forward<E>(E&, const BlockCall<E>&) const;                                    \
  template void SiglipMlpKind::backward<E>(E&, const BlockCall<E>&) const;                                   \
  template size_t VisionKind::bytes<E>(const std::vector<std::unique_ptr<Block<E>>>&, Mode, int, int64_t, int)     \
      const;                                                                                                  \
  template void VisionKind::forward<E>(E&, const VisionCall<E>&, const data::PackedBatch&, char*) const;     \
  template void VisionKind::backward<E>(E&, const VisionCall<E>&, char*, int, int64_t, int) const;                \
  template void VisionKind::stash_grad<E>(E&, const VisionCall<E>&, char*, int, int64_t, int, typename E::Acc*)   \
      const;                                                                                                    \
  template void VisionKind::unstash_grad<E>(E&, const VisionCall<E>&, char*, int, int64_t, int,                 \
                                            const typename E::Acc*) const;
TT_VISION_INSTANTIATE(CpuExec<float>)
TT_VISION_INSTANTIATE(CpuExec<double>)
TT_VISION_INSTANTIATE(CudaExec)
#undef TT_VISION_INSTANTIATE

}  // namespace tt::model
