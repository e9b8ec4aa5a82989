// Llama/Qwen3 decoder on the CUDA ops: forward, the LM head with the fused loss in row chunks,
// and the exact reverse of model.cc's layer_backward (see cuda_model.h).
//
// Buffers. A CudaActivations buffer is carved (256-byte aligned regions) into the batch metadata
// first (tokens, pos, subtree_end, head rows, targets: one host image, one copy), the loss, the
// attention's tile metadata, then the saved activations. The model's Scratch holds what one
// backward (or one head chunk) needs at a time: the residual gradient dx, the fp32 sum buffer
// (also the forward's GEMM output before a residual add), the attention and MLP gradients, and the
// head chunk's logits. Each buffer grows to the largest batch seen and is then reused.
//
// In-place reuse (as model.cc): swiglu_backward writes dgate and dup over the layer's saved gate
// and up (backward consumes the activations), and the gradient of the attention output becomes
// that of q_pre once attention_backward has read it.
#include "model/cuda_model.h"

#include <algorithm>
#include <numeric>

#include "model/cuda_model_kernels.h"
#include "model/layout.h"
#include "base/check.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/check.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/swiglu.h"

namespace tt::model {

using cuda::bf16;

namespace {

// Hands out 256-byte aligned regions of a device buffer; with a null base it only counts.
struct Carver {
  char* base;
  size_t used = 0;
  template <class E>
  E* take(int64_t n) {
    used = (used + 255) / 256 * 256;
    E* p = (base && n > 0) ? reinterpret_cast<E*>(base + used) : nullptr;
    used += (size_t)std::max<int64_t>(n, 0) * sizeof(E);
    return p;
  }
  size_t bytes() const { return (used + 255) / 256 * 256; }
};

// Saved activations of one layer.
struct LayerActs {
  bf16* x_in;    // (N, C) residual stream entering the layer
  bf16* n1;      // (N, C)
  float* rstd1;  // (N)
  bf16* q_pre;   // (N, NH, HS) qwen3 only
  bf16* k_pre;   // (N, NKV, HS) qwen3 only
  float* q_rstd; // (N, NH) qwen3 only
  float* k_rstd; // (N, NKV) qwen3 only
  bf16* q;       // (N, NH, HS) after q_norm and RoPE
  bf16* k;       // (N, NKV, HS)
  bf16* v;       // (N, NKV, HS)
  bf16* att;     // (N, NH, HS)
  float* lse;    // (N, NH)
  bf16* x_mid;   // (N, C)
  bf16* n2;      // (N, C)
  float* rstd2;  // (N)
  bf16* gate;    // (N, I); dgate after backward
  bf16* up;      // (N, I); dup after backward
  bf16* h;       // (N, I)
};

// Qwen3 models whose head dim the fused op takes run the q/k norm and the rotation as one op each
// way (cuda::qk_norm_rope_*), reading the batch's rope table; others run them one after the other.
bool fused_qk_rope(const Dims& d) { return d.qk_norm && cuda::qk_norm_rope_supported(d.HS); }

// The layout of a CudaActivations buffer for N rows, n_tgt targets and n_rows head rows.
struct ActsLayout {
  // Metadata: one host image, uploaded in one copy (bytes [0, meta_bytes)).
  int32_t* tokens;       // (N)
  int32_t* pos;          // (N)
  int32_t* subtree_end;  // (N)
  int32_t* head_rows;    // (n_rows) rows that are the source of a target, ascending
  int32_t* tgt_src;      // (n_tgt) index into head_rows, targets stably sorted by it
  int32_t* tgt_tok;      // (n_tgt)
  double* tgt_w;         // (n_tgt)
  size_t meta_bytes;
  double* loss;          // (1) sum_t w_t ce_t
  char* tiles;           // tree_tiles_bytes(N)
  size_t tiles_bytes;
  float2* rope_cs;       // (N, HS/2) rope table, when fused_qk_rope
  std::vector<LayerActs> layers;
  bf16* x_final;  // (N, C)
  bf16* nf;       // (N, C) final norm output
  float* rstd_f;  // (N)
  bf16* dnf;      // (N, C) gradient of nf from the LM head
  size_t total;

  ActsLayout(const ModelConfig& cfg, int N, int n_tgt, int n_rows, char* base) {
    const Dims d = dims_of(cfg, N);
    const int64_t n = N;
    Carver c{base};
    tokens = c.take<int32_t>(n);
    pos = c.take<int32_t>(n);
    subtree_end = c.take<int32_t>(n);
    head_rows = c.take<int32_t>(n_rows);
    tgt_src = c.take<int32_t>(n_tgt);
    tgt_tok = c.take<int32_t>(n_tgt);
    tgt_w = c.take<double>(n_tgt);
    meta_bytes = c.bytes();
    loss = c.take<double>(1);
    tiles_bytes = cuda::tree_tiles_bytes(N);
    tiles = c.take<char>((int64_t)tiles_bytes);
    rope_cs = c.take<float2>(fused_qk_rope(d) ? n * (d.HS / 2) : 0);
    layers.resize(d.L);
    for (LayerActs& a : layers) {
      a.x_in = c.take<bf16>(n * d.C);
      a.n1 = c.take<bf16>(n * d.C);
      a.rstd1 = c.take<float>(n);
      a.q_pre = c.take<bf16>(d.qk_norm ? n * d.QD : 0);
      a.k_pre = c.take<bf16>(d.qk_norm ? n * d.KD : 0);
      a.q_rstd = c.take<float>(d.qk_norm ? n * d.NH : 0);
      a.k_rstd = c.take<float>(d.qk_norm ? n * d.NKV : 0);
      a.q = c.take<bf16>(n * d.QD);
      a.k = c.take<bf16>(n * d.KD);
      a.v = c.take<bf16>(n * d.KD);
      a.att = c.take<bf16>(n * d.QD);
      a.lse = c.take<float>(n * d.NH);
      a.x_mid = c.take<bf16>(n * d.C);
      a.n2 = c.take<bf16>(n * d.C);
      a.rstd2 = c.take<float>(n);
      a.gate = c.take<bf16>(n * d.I);
      a.up = c.take<bf16>(n * d.I);
      a.h = c.take<bf16>(n * d.I);
    }
    x_final = c.take<bf16>(n * d.C);
    nf = c.take<bf16>(n * d.C);
    rstd_f = c.take<float>(n);
    dnf = c.take<bf16>(n * d.C);
    total = c.bytes();
  }
};

// Rows of one LM-head chunk.
int head_chunk_rows(const CudaModelOptions& o, int V) {
  return (int)std::max<int64_t>(1, o.head_chunk_bytes / (2 * (int64_t)V));
}

template <class E>
void ensure(cuda::DeviceBuffer<E>& b, size_t n, cuda::DeviceAllocator* alloc) {
  if (b.size() >= n) return;
  b.reset();
  b = cuda::DeviceBuffer<E>(n, alloc);
}

}  // namespace

// Backward's (and the head's) scratch, sized for n rows.
struct CudaModel::Scratch {
  int n = 0;
  cuda::DeviceBuffer<bf16> dx;      // (N, C) gradient of the residual stream
  cuda::DeviceBuffer<float> sum;    // (N, C) fp32: GEMM output before a residual add, or a summed dx
                                    // (a norm's output gradient, read by rmsnorm_backward in fp32)
  cuda::DeviceBuffer<bf16> datt;    // (N, QD) gradient of the attention output, then of q_pre
  cuda::DeviceBuffer<bf16> dq;      // (N, QD)
  cuda::DeviceBuffer<bf16> dk;      // (N, KD)
  cuda::DeviceBuffer<bf16> dv;      // (N, KD)
  cuda::DeviceBuffer<bf16> dk_pre;  // (N, KD)
  cuda::DeviceBuffer<bf16> dh;      // (N, I)
  // LM head chunk.
  int head_rows = 0;
  cuda::DeviceBuffer<bf16> logits;  // (R, V) logits, then dlogits in place
  cuda::DeviceBuffer<bf16> nf_rows; // (R, C) gathered final-norm rows
  cuda::DeviceBuffer<bf16> dnf_rows;// (R, C)
  cuda::DeviceBuffer<float> ce_lse; // (R)
};

CudaModel::CudaModel(const ModelConfig& cfg, const CudaModelOptions& options) : cfg_(cfg), options_(options) {
  cfg_.validate();
  if (cfg_.head_dim != 64 && cfg_.head_dim != 128)
    throw Error(str("model.head_dim ", cfg_.head_dim, " is not supported on cuda (the tree attention kernels take 64 or 128)"));
  TT_CHECK(options_.head_chunk_bytes > 0, "CudaModelOptions: head_chunk_bytes must be positive");
  info_ = param_table(cfg_);
  n_params_ = info_.empty() ? 0 : info_.back().offset + info_.back().numel;
  TT_CUDA_CHECK(cudaStreamCreate(&stream_));
  alloc_ = std::make_unique<cuda::DeviceAllocator>();
  gemm_ = std::make_unique<cuda::GemmHandle>(stream_);
  gemm_->set_autotune(options_.gemm_autotune);
  params_ = cuda::DeviceBuffer<float>(n_params_, alloc_.get());
  params_bf16_ = cuda::DeviceBuffer<bf16>(n_params_, alloc_.get());
  grads_ = cuda::DeviceBuffer<float>(n_params_, alloc_.get());
  reduce_ = cuda::DeviceBuffer<double>(1, alloc_.get());
  scratch_ = std::make_unique<Scratch>();
  params_.fill_bytes(0, stream_);
  params_bf16_.fill_bytes(0, stream_);
  grads_.fill_bytes(0, stream_);
}

CudaModel::~CudaModel() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& m : marks_) cudaEventDestroy(m.first);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  own_ = CudaActivations();
  scratch_.reset();
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaModel::init(uint64_t seed) {
  for (const ParamInfo& p : info_) {
    float* w = params_.data() + p.offset;
    if (p.shape.size() == 1) {
      detail::fill(w, p.numel, 1.0f, stream_);
    } else {
      detail::init_normal(w, p.numel, param_init_seed(seed, p.name), cfg_.initializer_range, stream_);
    }
  }
  refresh_bf16();
}

void CudaModel::set_params(const float* host) {
  TT_CUDA_CHECK(cudaMemcpyAsync(params_.data(), host, sizeof(float) * n_params_, cudaMemcpyHostToDevice, stream_));
  refresh_bf16();
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::vector<float> CudaModel::params_host() const {
  std::vector<float> out(n_params_);
  TT_CUDA_CHECK(cudaMemcpyAsync(out.data(), params_.data(), sizeof(float) * n_params_, cudaMemcpyDeviceToHost, stream_));
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

std::vector<float> CudaModel::grads_host() const {
  std::vector<float> out(n_params_);
  TT_CUDA_CHECK(cudaMemcpyAsync(out.data(), grads_.data(), sizeof(float) * n_params_, cudaMemcpyDeviceToHost, stream_));
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

void CudaModel::refresh_bf16() { detail::f32_to_bf16(params_bf16_.data(), params_.data(), n_params_, stream_); }

void CudaModel::zero_grad() { grads_.fill_bytes(0, stream_); }

void CudaModel::ensure_workspace(size_t bytes) { ensure(workspace_, bytes, alloc_.get()); }

void CudaModel::ensure_scratch(int N) {
  Scratch& s = *scratch_;
  const Dims d = dims_of(cfg_, N);
  if (N > s.n) {
    const size_t n = (size_t)N;
    cuda::DeviceAllocator* a = alloc_.get();
    ensure(s.dx, n * d.C, a);
    ensure(s.sum, n * d.C, a);
    ensure(s.datt, n * d.QD, a);
    ensure(s.dq, n * d.QD, a);
    ensure(s.dk, n * d.KD, a);
    ensure(s.dv, n * d.KD, a);
    ensure(s.dk_pre, n * d.KD, a);
    ensure(s.dh, n * d.I, a);
    s.n = N;
  }
  const int R = std::min(N, head_chunk_rows(options_, d.V));
  if (R > s.head_rows) {
    cuda::DeviceAllocator* a = alloc_.get();
    ensure(s.logits, (size_t)R * d.V, a);
    ensure(s.nf_rows, (size_t)R * d.C, a);
    ensure(s.dnf_rows, (size_t)R * d.C, a);
    ensure(s.ce_lse, (size_t)R, a);
    s.head_rows = R;
  }
}

double CudaModel::forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReadyFn& on_ready) {
  forward(batch, loss_scale, own_, nullptr);
  backward(own_, nullptr, on_ready);
  return loss(own_);
}

void CudaModel::forward(const data::PackedBatch& batch, double loss_scale, CudaActivations& acts,
                        const CudaLayerPrefixes* prefixes) {
  data::check_packed_batch(batch, cfg_.vocab_size);
  const Dims d0 = dims_of(cfg_, batch.n_tokens);
  const int L = d0.L;
  TT_CHECK(prefixes == nullptr || (int)prefixes->size() == L, "model: external prefixes for ",
           prefixes ? prefixes->size() : 0, " layers, expected one list per layer (", L, ")");
  const int N = batch.n_tokens;
  const int n_tgt = (int)batch.tgt_src.size();

  // Head rows (sources of targets, ascending) and the targets stably sorted by them.
  std::vector<int32_t> head_rows(batch.tgt_src.begin(), batch.tgt_src.end());
  std::sort(head_rows.begin(), head_rows.end());
  head_rows.erase(std::unique(head_rows.begin(), head_rows.end()), head_rows.end());
  const int n_rows = (int)head_rows.size();
  std::vector<int32_t> compact(N, -1);
  for (int r = 0; r < n_rows; ++r) compact[head_rows[r]] = r;
  std::vector<int> order(n_tgt);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return batch.tgt_src[a] < batch.tgt_src[b]; });

  acts.n_ = N;
  acts.n_tgt_ = n_tgt;
  acts.n_rows_ = n_rows;
  acts.loss_scale_ = loss_scale;
  acts.prefixes_ = prefixes;
  acts.pending_ = true;
  mark(Op::kOther);
  const size_t need = ActsLayout(cfg_, N, n_tgt, n_rows, nullptr).total;
  ensure(acts.buf_, std::max<size_t>(need, 1), alloc_.get());
  const ActsLayout a(cfg_, N, n_tgt, n_rows, acts.buf_.data());
  TT_CUDA_CHECK(cudaMemsetAsync(a.loss, 0, sizeof(double), stream_));
  if (N == 0) {
    mark(Op::kEnd);
    return;
  }

  // The metadata's host image, at the same offsets as on the device; one copy.
  {
    const ActsLayout h(cfg_, N, n_tgt, n_rows, nullptr);
    if (staging_.size() < h.meta_bytes) staging_.resize(h.meta_bytes);
    char* base = staging_.data();
    const ActsLayout img(cfg_, N, n_tgt, n_rows, base);
    std::copy(batch.tokens.begin(), batch.tokens.end(), img.tokens);
    std::copy(batch.pos.begin(), batch.pos.end(), img.pos);
    std::copy(batch.subtree_end.begin(), batch.subtree_end.end(), img.subtree_end);
    std::copy(head_rows.begin(), head_rows.end(), img.head_rows);
    for (int t = 0; t < n_tgt; ++t) {
      const int o = order[t];
      img.tgt_src[t] = compact[batch.tgt_src[o]];
      img.tgt_tok[t] = batch.tgt_tok[o];
      img.tgt_w[t] = batch.tgt_w[o];
    }
    // Pageable source: the call returns once the bytes are staged, so staging_ may be reused.
    TT_CUDA_CHECK(cudaMemcpyAsync(acts.buf_.data(), base, h.meta_bytes, cudaMemcpyHostToDevice, stream_));
  }
  acts.tiles_ = cuda::build_tree_tiles(a.subtree_end, N, cuda::Workspace{a.tiles, a.tiles_bytes}, stream_);
  ensure_scratch(N);
  Scratch& s = *scratch_;
  const Dims d = dims_of(cfg_, N);
  const bf16* W = params_bf16_.data();
  const bf16* wte = W + info_.front().offset;
  cuda::GemmHandle& g = *gemm_;

  const bool fused = fused_qk_rope(d);
  if (fused) cuda::rope_table(a.rope_cs, a.pos, N, d.HS, d.theta, stream_);
  cuda::embedding_forward(a.layers[0].x_in, a.tokens, wte, N, d.C, d.V, stream_);
  for (int l = 0; l < L; ++l) {
    const LayerParams<const bf16> w = layer_params(W, info_, cfg_, l);
    const LayerActs& x = a.layers[l];
    bf16* x_out = l + 1 < L ? a.layers[l + 1].x_in : a.x_final;
    const cuda::ExternalKV* ext = prefixes ? (*prefixes)[l].data() : nullptr;
    const int n_ext = prefixes ? (int)(*prefixes)[l].size() : 0;

    mark(Op::kNorm);
    cuda::rmsnorm_forward(x.n1, x.rstd1, x.x_in, w.in_norm, N, d.C, d.eps, stream_);
    if (d.qk_norm) {
      mark(Op::kGemm);
      cuda::matmul_forward(g, x.q_pre, x.n1, w.wq, N, d.C, d.QD);
      cuda::matmul_forward(g, x.k_pre, x.n1, w.wk, N, d.C, d.KD);
      mark(Op::kNorm);
      if (fused) {
        cuda::qk_norm_rope_forward(x.q, x.q_rstd, x.q_pre, w.q_norm, a.rope_cs, N, d.NH, d.HS, d.eps, stream_);
        cuda::qk_norm_rope_forward(x.k, x.k_rstd, x.k_pre, w.k_norm, a.rope_cs, N, d.NKV, d.HS, d.eps, stream_);
      } else {
        cuda::rmsnorm_forward(x.q, x.q_rstd, x.q_pre, w.q_norm, N * d.NH, d.HS, d.eps, stream_);
        cuda::rmsnorm_forward(x.k, x.k_rstd, x.k_pre, w.k_norm, N * d.NKV, d.HS, d.eps, stream_);
      }
      mark(Op::kGemm);
    } else {
      mark(Op::kGemm);
      cuda::matmul_forward(g, x.q, x.n1, w.wq, N, d.C, d.QD);
      cuda::matmul_forward(g, x.k, x.n1, w.wk, N, d.C, d.KD);
    }
    cuda::matmul_forward(g, x.v, x.n1, w.wv, N, d.C, d.KD);
    if (!fused) {
      mark(Op::kNorm);
      cuda::rope_forward(x.q, a.pos, N, d.NH, d.HS, d.theta, stream_);
      cuda::rope_forward(x.k, a.pos, N, d.NKV, d.HS, d.theta, stream_);
    }
    mark(Op::kAttention);
    cuda::attention_forward(x.att, x.lse, x.q, x.k, x.v, acts.tiles_, ext, n_ext, N, d.NH, d.NKV, d.HS, stream_);
    mark(Op::kGemm);
    cuda::matmul_forward(g, s.sum.data(), x.att, w.wo, N, d.QD, d.C);
    mark(Op::kOther);
    detail::residual_add(x.x_mid, x.x_in, s.sum.data(), (int64_t)N * d.C, stream_);
    mark(Op::kNorm);
    cuda::rmsnorm_forward(x.n2, x.rstd2, x.x_mid, w.post_norm, N, d.C, d.eps, stream_);
    mark(Op::kGemm);
    cuda::matmul_forward(g, x.gate, x.n2, w.wg, N, d.C, d.I);
    cuda::matmul_forward(g, x.up, x.n2, w.wu, N, d.C, d.I);
    mark(Op::kNorm);
    cuda::swiglu_forward(x.h, x.gate, x.up, (int64_t)N * d.I, stream_);
    mark(Op::kGemm);
    cuda::matmul_forward(g, s.sum.data(), x.h, w.wd, N, d.I, d.C);
    mark(Op::kOther);
    detail::residual_add(x_out, x.x_mid, s.sum.data(), (int64_t)N * d.C, stream_);
  }
  const int k_norm = 1 + L * tensors_per_layer(cfg_);
  const int k_lm = cfg_.tie_word_embeddings ? 0 : k_norm + 1;
  mark(Op::kNorm);
  cuda::rmsnorm_forward(a.nf, a.rstd_f, a.x_final, W + info_[k_norm].offset, N, d.C, d.eps, stream_);
  mark(Op::kHead);

  // LM head and loss over the head rows, chunk by chunk: logits, then dlogits in place, then
  // dW_lm += dlogits^T nf and dnf = dlogits W_lm for the chunk's rows.
  const bf16* w_lm = W + info_[k_lm].offset;
  float* g_lm = grads_.data() + info_[k_lm].offset;
  const bool all_rows = n_rows == N;  // head rows are then 0..N-1: no gather or scatter
  if (!all_rows) TT_CUDA_CHECK(cudaMemsetAsync(a.dnf, 0, sizeof(bf16) * (size_t)N * d.C, stream_));
  const int R = s.head_rows;
  int t_begin = 0;
  for (int r0 = 0; r0 < n_rows; r0 += R) {
    const int rows = std::min(R, n_rows - r0);
    int t_end = t_begin;
    while (t_end < n_tgt && compact[batch.tgt_src[order[t_end]]] < r0 + rows) ++t_end;
    const bf16* x_rows = all_rows ? a.nf + (int64_t)r0 * d.C : s.nf_rows.data();
    bf16* dx_rows = all_rows ? a.dnf + (int64_t)r0 * d.C : s.dnf_rows.data();
    if (!all_rows) detail::gather_rows(s.nf_rows.data(), a.nf, a.head_rows + r0, rows, d.C, stream_);
    cuda::matmul_forward(g, s.logits.data(), x_rows, w_lm, rows, d.C, d.V);
    const cuda::CeTargets tgt{a.tgt_src + t_begin, a.tgt_tok + t_begin, a.tgt_w + t_begin, t_end - t_begin};
    const size_t ws = cuda::cross_entropy_workspace_bytes(rows, tgt.n_tgt);
    ensure_workspace(ws);
    cuda::cross_entropy_forward_backward(a.loss, s.ce_lse.data(), s.logits.data(), s.logits.data(), tgt, r0, rows,
                                         d.V, (float)loss_scale, cuda::Workspace{workspace_.data(), workspace_.size()},
                                         stream_);
    cuda::matmul_backward_dw(g, g_lm, s.logits.data(), x_rows, rows, d.C, d.V, 1.f);
    cuda::matmul_backward_dx(g, dx_rows, s.logits.data(), w_lm, rows, d.C, d.V, 0.f);
    if (!all_rows) detail::scatter_rows(a.dnf, s.dnf_rows.data(), a.head_rows + r0, rows, d.C, stream_);
    t_begin = t_end;
  }
  mark(Op::kEnd);
}

double CudaModel::loss(const CudaActivations& acts) const {
  if (acts.n_ == 0) return 0.0;
  const ActsLayout a(cfg_, acts.n_, acts.n_tgt_, acts.n_rows_, const_cast<char*>(acts.buf_.data()));
  double sum = 0;
  TT_CUDA_CHECK(cudaMemcpyAsync(&sum, a.loss, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return acts.loss_scale_ * sum;
}

const bf16* CudaModel::layer_k(const CudaActivations& acts, int l) const {
  TT_CHECK(acts.n_ > 0 && l >= 0 && l < cfg_.num_hidden_layers, "model: layer_k(", l,
           ") needs a forward of a non-empty batch on these activations and a valid layer");
  return ActsLayout(cfg_, acts.n_, acts.n_tgt_, acts.n_rows_, const_cast<char*>(acts.buf_.data())).layers[l].k;
}

const bf16* CudaModel::layer_v(const CudaActivations& acts, int l) const {
  TT_CHECK(acts.n_ > 0 && l >= 0 && l < cfg_.num_hidden_layers, "model: layer_v(", l,
           ") needs a forward of a non-empty batch on these activations and a valid layer");
  return ActsLayout(cfg_, acts.n_, acts.n_tgt_, acts.n_rows_, const_cast<char*>(acts.buf_.data())).layers[l].v;
}

void CudaModel::backward(CudaActivations& acts, const CudaRelayedKVGrads* relayed, const GradReadyFn& on_ready) {
  TT_CHECK(acts.pending_, "model: backward() without a preceding forward() on these activations");
  acts.pending_ = false;
  const int N = acts.n_;
  if (N == 0) {
    if (on_ready) on_ready(0, (int)info_.size());
    return;
  }
  const Dims d = dims_of(cfg_, N);
  const bool fused = fused_qk_rope(d);
  const int L = d.L;
  TT_CHECK(relayed == nullptr || ((int)relayed->dk.size() == L && (int)relayed->dv.size() == L),
           "model: relayed K/V gradients need one entry per layer (", L, ")");
  const ActsLayout a(cfg_, N, acts.n_tgt_, acts.n_rows_, acts.buf_.data());
  const CudaLayerPrefixes* prefixes = acts.prefixes_;
  ensure_scratch(N);
  Scratch& s = *scratch_;
  {
    size_t ws = cuda::rmsnorm_backward_workspace_bytes(N, d.C);
    if (d.qk_norm) {
      ws = std::max(ws, cuda::rmsnorm_backward_workspace_bytes(N * d.NH, d.HS));
      ws = std::max(ws, cuda::rmsnorm_backward_workspace_bytes(N * d.NKV, d.HS));
    }
    ws = std::max(ws, cuda::attention_backward_workspace_bytes(N, d.NH, d.HS));
    ws = std::max(ws, cuda::embedding_backward_workspace_bytes(N));
    ensure_workspace(ws);
  }
  const cuda::Workspace ws{workspace_.data(), workspace_.size()};
  const bf16* W = params_bf16_.data();
  float* G = grads_.data();
  cuda::GemmHandle& g = *gemm_;
  const int k_norm = 1 + L * tensors_per_layer(cfg_);

  mark(Op::kNorm);  // dx starts as the final norm's input gradient (overwritten)
  cuda::rmsnorm_backward(s.dx.data(), G + info_[k_norm].offset, a.dnf, a.x_final, W + info_[k_norm].offset, a.rstd_f,
                         N, d.C, ws, stream_, /*accumulate_dx=*/false);
  if (on_ready) on_ready(k_norm, (int)info_.size());  // the final norm; an untied head's gradient came from forward()
  for (int l = L - 1; l >= 0; --l) {
    const LayerParams<const bf16> w = layer_params(W, info_, cfg_, l);
    const LayerParams<float> gw = layer_params(G, info_, cfg_, l);
    const LayerActs& x = a.layers[l];
    const cuda::ExternalKV* ext = prefixes ? (*prefixes)[l].data() : nullptr;
    const int n_ext = prefixes ? (int)(*prefixes)[l].size() : 0;
    bf16* dx = s.dx.data();

    // MLP: x_out = x_mid + down(swiglu(gate(n2), up(n2))).
    mark(Op::kGemm);
    cuda::matmul_backward_dx(g, s.dh.data(), dx, w.wd, N, d.I, d.C, 0.f);
    cuda::matmul_backward_dw(g, gw.wd, dx, x.h, N, d.I, d.C, 1.f);
    bf16* dgate = x.gate;
    bf16* dup = x.up;
    mark(Op::kNorm);
    cuda::swiglu_backward(dgate, dup, s.dh.data(), x.gate, x.up, (int64_t)N * d.I, stream_);
    mark(Op::kGemm);
    cuda::matmul_backward_dx(g, s.sum.data(), dgate, w.wg, N, d.C, d.I, 0.f);
    cuda::matmul_backward_dx(g, s.sum.data(), dup, w.wu, N, d.C, d.I, 1.f);
    cuda::matmul_backward_dw(g, gw.wg, dgate, x.n2, N, d.C, d.I, 1.f);
    cuda::matmul_backward_dw(g, gw.wu, dup, x.n2, N, d.C, d.I, 1.f);
    mark(Op::kNorm);  // the fp32 sum of the two products, read without a bf16 rounding
    cuda::rmsnorm_backward(dx, gw.post_norm, s.sum.data(), x.x_mid, w.post_norm, x.rstd2, N, d.C, ws, stream_);

    // Attention: x_mid = x_in + o_proj(attn(rope(qk_norm(q_pre)), rope(qk_norm(k_pre)), v)).
    mark(Op::kGemm);
    cuda::matmul_backward_dx(g, s.datt.data(), dx, w.wo, N, d.QD, d.C, 0.f);
    cuda::matmul_backward_dw(g, gw.wo, dx, x.att, N, d.QD, d.C, 1.f);
    mark(Op::kAttention);
    cuda::attention_backward(s.dq.data(), s.dk.data(), s.dv.data(), s.datt.data(), x.att, x.lse, x.q, x.k, x.v,
                             acts.tiles_, ext, n_ext, N, d.NH, d.NKV, d.HS, ws, stream_);
    // Readers of this batch's K/V outside it (child pieces' gateways) add their gradients here.
    mark(Op::kOther);
    if (relayed && relayed->dk[l]) detail::add_inplace(s.dk.data(), relayed->dk[l], (int64_t)N * d.KD, stream_);
    if (relayed && relayed->dv[l]) detail::add_inplace(s.dv.data(), relayed->dv[l], (int64_t)N * d.KD, stream_);
    mark(Op::kNorm);
    if (!fused) {
      cuda::rope_backward(s.dq.data(), a.pos, N, d.NH, d.HS, d.theta, stream_);
      cuda::rope_backward(s.dk.data(), a.pos, N, d.NKV, d.HS, d.theta, stream_);
    }
    const bf16* dq_proj = s.dq.data();  // gradient of the q_proj output
    const bf16* dk_proj = s.dk.data();
    if (d.qk_norm) {
      bf16* dq_pre = s.datt.data();  // datt is consumed; reuse it (overwritten)
      if (fused) {  // dq, dk: gradients of the rotated q, k
        cuda::qk_norm_rope_backward(dq_pre, gw.q_norm, s.dq.data(), x.q_pre, w.q_norm, x.q_rstd, a.rope_cs, N, d.NH,
                                    d.HS, ws, stream_, /*accumulate_dx=*/false);
        cuda::qk_norm_rope_backward(s.dk_pre.data(), gw.k_norm, s.dk.data(), x.k_pre, w.k_norm, x.k_rstd, a.rope_cs,
                                    N, d.NKV, d.HS, ws, stream_, /*accumulate_dx=*/false);
      } else {
        cuda::rmsnorm_backward(dq_pre, gw.q_norm, s.dq.data(), x.q_pre, w.q_norm, x.q_rstd, N * d.NH, d.HS, ws,
                               stream_, /*accumulate_dx=*/false);
        cuda::rmsnorm_backward(s.dk_pre.data(), gw.k_norm, s.dk.data(), x.k_pre, w.k_norm, x.k_rstd, N * d.NKV,
                               d.HS, ws, stream_, /*accumulate_dx=*/false);
      }
      dq_proj = dq_pre;
      dk_proj = s.dk_pre.data();
    }
    mark(Op::kGemm);
    cuda::matmul_backward_dx(g, s.sum.data(), dq_proj, w.wq, N, d.C, d.QD, 0.f);
    cuda::matmul_backward_dx(g, s.sum.data(), dk_proj, w.wk, N, d.C, d.KD, 1.f);
    cuda::matmul_backward_dx(g, s.sum.data(), s.dv.data(), w.wv, N, d.C, d.KD, 1.f);
    cuda::matmul_backward_dw(g, gw.wq, dq_proj, x.n1, N, d.C, d.QD, 1.f);
    cuda::matmul_backward_dw(g, gw.wk, dk_proj, x.n1, N, d.C, d.KD, 1.f);
    cuda::matmul_backward_dw(g, gw.wv, s.dv.data(), x.n1, N, d.C, d.KD, 1.f);
    mark(Op::kNorm);
    cuda::rmsnorm_backward(dx, gw.in_norm, s.sum.data(), x.x_in, w.in_norm, x.rstd1, N, d.C, ws, stream_);
    if (on_ready) on_ready(1 + l * tensors_per_layer(cfg_), 1 + (l + 1) * tensors_per_layer(cfg_));
  }
  mark(Op::kOther);
  cuda::embedding_backward(G + info_.front().offset, s.dx.data(), a.tokens, N, d.C, d.V, ws, stream_);
  mark(Op::kEnd);
  if (on_ready) on_ready(0, 1);  // the embedding (with a tied head, also the head's gradient from forward())
}

void CudaModel::mark(Op op) {
  if (!options_.profile) return;
  cudaEvent_t e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    TT_CUDA_CHECK(cudaEventCreate(&e));
  }
  TT_CUDA_CHECK(cudaEventRecord(e, stream_));
  marks_.emplace_back(e, op);
}

CudaProfile CudaModel::take_profile() {
  CudaProfile p;
  if (marks_.empty()) return p;
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    if (marks_[i].second == Op::kEnd) continue;
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].first, marks_[i + 1].first));
    switch (marks_[i].second) {
      case Op::kGemm: p.gemm_ms += ms; break;
      case Op::kAttention: p.attention_ms += ms; break;
      case Op::kHead: p.head_ms += ms; break;
      case Op::kNorm: p.norm_ms += ms; break;
      default: p.other_ms += ms; break;
    }
  }
  for (auto& m : marks_) spare_events_.push_back(m.first);
  marks_.clear();
  return p;
}

double CudaModel::grad_sum_squares() {
  ensure_workspace(cuda::sum_squares_workspace_bytes(n_params_));
  cuda::sum_squares(reduce_.data(), grads_.data(), n_params_, cuda::Workspace{workspace_.data(), workspace_.size()},
                    stream_);
  double out = 0;
  TT_CUDA_CHECK(cudaMemcpyAsync(&out, reduce_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

}  // namespace tt::model
