// CudaExec: the op vocabulary of model/exec.h on the kernels of ops/cuda (see exec_cuda.h).
#include "model/exec_cuda.h"

#include <algorithm>
#include <vector>

#include "base/check.h"
#include "model/exec_cuda_kernels.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/attention_decode.h"
#include "ops/cuda/check.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/gated_attention.h"
#include "ops/cuda/gdn.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/retrieval.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/sampling.h"
#include "ops/cuda/swiglu.h"
#include "ops/cuda/vision.h"

namespace tt::model {

using cuda::bf16;

CudaExec::CudaExec(const CudaExecOptions& options) : options_(options) {
  TT_CUDA_CHECK(cudaStreamCreate(&stream_));
  alloc_ = std::make_unique<cuda::DeviceAllocator>();
  gemm_ = std::make_unique<cuda::GemmHandle>(stream_);
  gemm_->set_autotune(options_.gemm_autotune);
  reduce_ = cuda::DeviceBuffer<double>(1, alloc_.get());
}

CudaExec::~CudaExec() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& m : marks_) cudaEventDestroy(m.first);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  workspace_.reset();
  decode_tables_.reset();
  reduce_.reset();
  gemm_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaExec::check_model(const ModelConfig& cfg) {
  if (cfg.has_linear_attention()) {
    const int64_t nk = cfg.linear_num_key_heads, nv = cfg.linear_num_value_heads, dk = cfg.linear_key_head_dim,
                  dv = cfg.linear_value_head_dim, K = cfg.linear_conv_kernel_dim;
    if (dk % 8 != 0 || dk > 128)
      throw Error(str("model.linear_key_head_dim ", dk,
                      " is not supported on cuda (the delta rule's kernels take a multiple of 8 up to 128); "
                      "set device: cpu"));
    if (dv % 32 != 0 || dv > 128)
      throw Error(str("model.linear_value_head_dim ", dv,
                      " is not supported on cuda (the delta rule's kernels take a multiple of 32 up to 128); "
                      "set device: cpu"));
    if (K > 64)
      throw Error(str("model.linear_conv_kernel_dim ", K, " is not supported on cuda (at most 64 taps); set device: cpu"));
    (void)nk, (void)nv;  // nv % nk: ModelConfig::validate
  }
  auto attention_head_dim = [](int64_t d) { return d == 64 || d == 128 || d == 256; };
  if (cfg.vision.enabled() && !attention_head_dim(cfg.vision.head_dim()))
    throw Error(str("vision: head dim hidden_size / num_attention_heads = ", cfg.vision.hidden_size, " / ",
                    cfg.vision.num_attention_heads, " = ", cfg.vision.head_dim(),
                    " is not supported on cuda (the tree attention kernels take 64, 128 or 256); set device: cpu"));
  if (!attention_head_dim(cfg.head_dim))
    throw Error(str("model.head_dim ", cfg.head_dim,
                    " is not supported on cuda (the tree attention kernels take 64, 128 or 256); set device: cpu"));
}

void CudaExec::ensure(Buffer& b, size_t bytes) {
  if (b.size() >= bytes && b.data()) return;
  b.reset();
  b = Buffer(std::max<size_t>(bytes, 1), alloc_.get());
}

void CudaExec::upload(void* dst, const void* src, size_t bytes) {
  mark(Op::kOther);
  if (bytes) TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaExec::download(void* dst, const void* src, size_t bytes) const {
  if (bytes) TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaExec::PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

CudaExec::Fence::~Fence() {
  if (e_) cudaEventDestroy(e_);
}

void CudaExec::ensure_pinned(PinnedBuffer& b, size_t bytes) {
  if (b.p_ && b.n_ >= bytes) return;
  if (b.p_) TT_CUDA_CHECK(cudaFreeHost(b.p_));
  b.p_ = nullptr;
  b.n_ = 0;
  TT_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&b.p_), std::max<size_t>(bytes, 1)));
  b.n_ = std::max<size_t>(bytes, 1);
}

void CudaExec::download_async(void* dst, const void* src, size_t bytes) {
  if (bytes) TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaExec::record(Fence& f) {
  if (!f.e_) TT_CUDA_CHECK(cudaEventCreateWithFlags(&f.e_, cudaEventDisableTiming));
  TT_CUDA_CHECK(cudaEventRecord(f.e_, stream_));
}

void CudaExec::wait(const Fence& f) const {
  if (f.e_) TT_CUDA_CHECK(cudaEventSynchronize(f.e_));
}

void CudaExec::zero(void* p, size_t bytes) {
  mark(Op::kOther);
  if (bytes) TT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
}

void CudaExec::sync() const { TT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

double CudaExec::read(const double* p) const {
  double out = 0;
  download(&out, p, sizeof(double));
  return out;
}

cuda::Workspace CudaExec::workspace(size_t bytes) {
  ensure(workspace_, bytes);
  return cuda::Workspace{workspace_.data(), workspace_.size()};
}

CudaExec::Layout CudaExec::make_layout(int N, int, const int32_t*, const int32_t*, const int32_t*,
                                       const int32_t* subtree_end, bool singletons, char* storage,
                                       const int32_t* key_lo) {
  mark(Op::kOther);
  Layout l;
  l.tiles =
      cuda::build_tree_tiles(subtree_end, N, cuda::Workspace{storage, cuda::tree_tiles_bytes(N)}, stream_, key_lo);
  l.singletons = singletons;
  return l;
}

void CudaExec::plan_recurrent(Layout& l, int N, int num_nodes, const int32_t* host_start, const int32_t* host_len,
                              const int32_t* host_parent, const int32_t* node_start, const int32_t* node_len,
                              const int32_t* node_parent, const int32_t* pos, const int32_t* subtree_end,
                              char* storage) {
  mark(Op::kOther);
  l.num_nodes = num_nodes;
  l.node_start = node_start, l.node_len = node_len, l.node_parent = node_parent;
  l.pos = pos, l.subtree_end = subtree_end;
  l.host_start.assign(host_start, host_start + num_nodes);
  l.host_len.assign(host_len, host_len + num_nodes);
  l.host_parent.assign(host_parent, host_parent + num_nodes);
  l.gdn.make(host_start, host_len, host_parent, num_nodes);
  TT_CHECK(l.gdn.rows() == N && l.gdn.table_bytes() <= recurrent_plan_bytes(N, num_nodes),
           "CudaExec::plan_recurrent: a plan of ", l.gdn.rows(), " rows and ", l.gdn.table_bytes(),
           " table bytes for a batch of ", N, " rows");
  l.gdn.upload(storage, stream_);
}

size_t CudaExec::rope_bytes(int N, int HS) {
  return cuda::qk_norm_rope_supported(HS) ? sizeof(float2) * (size_t)N * (HS / 2) : 0;
}

CudaExec::Rope CudaExec::make_rope(const int32_t* pos, int N, int HS, double theta, char* storage) {
  Rope r{pos, theta, nullptr, 0};
  if (cuda::qk_norm_rope_supported(HS) && N > 0) {
    mark(Op::kNorm);
    float2* table = reinterpret_cast<float2*>(storage);
    cuda::rope_table(table, pos, N, HS, theta, stream_);
    r.table = table;
  }
  return r;
}

void CudaExec::init_normal(Param* w, int64_t n, uint64_t seed, double stddev) {
  detail::init_normal(w, n, seed, stddev, stream_);
}

void CudaExec::fill(Param* w, int64_t n, float value) { detail::fill(w, n, value, stream_); }

void CudaExec::to_weights(Weight* out, const Param* in, int64_t n) {
  mark(Op::kOther);
  detail::f32_to_bf16(out, in, n, stream_);
}

void CudaExec::upload_weights(Weight* out, const float* host, int64_t n) {
  std::vector<cuda::bf16> staged((size_t)n);
  cuda::floats_to_bf16(staged.data(), host, (size_t)n);
  upload(out, staged.data(), sizeof(cuda::bf16) * (size_t)n);
  sync();  // the staging vector goes out of scope
}

void CudaExec::download_weights(float* host, const Weight* in, int64_t n) const {
  std::vector<cuda::bf16> staged((size_t)n);
  download(staged.data(), in, sizeof(cuda::bf16) * (size_t)n);
  cuda::bf16_to_floats(host, staged.data(), (size_t)n);
}

double CudaExec::sum_squares(const Param* x, int64_t n) {
  cuda::sum_squares(reduce_.data(), x, n, workspace(cuda::sum_squares_workspace_bytes(n)), stream_);
  return read(reduce_.data());
}

void CudaExec::embedding_forward(Act* out, const int32_t* tokens, const Weight* wte, int N, int C, int V) {
  mark(Op::kOther);
  cuda::embedding_forward(out, tokens, wte, N, C, V, stream_);
}

void CudaExec::embedding_backward(Param* dwte, const Act* dout, const int32_t* tokens, int N, int C, int V) {
  mark(Op::kOther);
  cuda::embedding_backward(dwte, dout, tokens, N, C, V, workspace(cuda::embedding_backward_workspace_bytes(N)),
                           stream_);
}

void CudaExec::rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, int rows, int C, double eps,
                               double w_offset) {
  mark(Op::kNorm);
  cuda::rmsnorm_forward(out, rstd, x, w, rows, C, eps, stream_, w_offset);
}

void CudaExec::rmsnorm_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w,
                                const Stat* rstd, int rows, int C, bool accumulate_dx, double w_offset) {
  mark(Op::kNorm);
  cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, C, workspace(cuda::rmsnorm_backward_workspace_bytes(rows, C)),
                         stream_, accumulate_dx, w_offset);
}

void CudaExec::rmsnorm_backward(Act* dx, Param* dw, const Acc* dout, const Act* x, const Weight* w,
                                const Stat* rstd, int rows, int C, bool accumulate_dx, double w_offset) {
  mark(Op::kNorm);
  cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, C, workspace(cuda::rmsnorm_backward_workspace_bytes(rows, C)),
                         stream_, accumulate_dx, w_offset);
}

void CudaExec::linear(Act* out, const Act* x, const Weight* w, int N, int IC, int OC) {
  mark(Op::kGemm);
  cuda::matmul_forward(*gemm_, out, x, w, N, IC, OC);
}

void CudaExec::linear(Acc* out, const Act* x, const Weight* w, int N, int IC, int OC) {
  mark(Op::kGemm);
  cuda::matmul_forward(*gemm_, out, x, w, N, IC, OC);
}

void CudaExec::linear_dx(Act* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate) {
  mark(Op::kGemm);
  cuda::matmul_backward_dx(*gemm_, dx, dout, w, N, IC, OC, accumulate ? 1.f : 0.f);
}

void CudaExec::linear_dx(Acc* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate) {
  mark(Op::kGemm);
  cuda::matmul_backward_dx(*gemm_, dx, dout, w, N, IC, OC, accumulate ? 1.f : 0.f);
}

void CudaExec::linear_dw(Param* dw, const Act* dout, const Act* x, int N, int IC, int OC) {
  mark(Op::kGemm);
  cuda::matmul_backward_dw(*gemm_, dw, dout, x, N, IC, OC, 1.f);
}

void CudaExec::norm_linear(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                           double w_offset, const LinearOut<Act, Weight>* outs, int n_outs) {
  bool fused = cuda::gemv_norm_supported(x, norm_w, n, N, C) && n_outs <= cuda::kGemvMaxSegments;
  for (int s = 0; fused && s < n_outs; ++s) fused = cuda::gemv_supported(x, outs[s].w, N, C);
  if (!fused) return composed::norm_linear(*this, n, rstd, x, norm_w, N, C, eps, w_offset, outs, n_outs);
  mark(Op::kGemm);
  cuda::GemvSegment seg[cuda::kGemvMaxSegments];
  for (int s = 0; s < n_outs; ++s) seg[s] = cuda::GemvSegment{outs[s].out, outs[s].w, outs[s].OC};
  cuda::gemv_split(seg, n_outs, x, cuda::GemvNorm{norm_w, (float)eps, (float)w_offset, n, rstd}, N, C, stream_);
}

void CudaExec::norm_linear_swiglu(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                                  double w_offset, Act* gate, Act* up, Act* h, const Weight* wg, const Weight* wu,
                                  int I) {
  if (!cuda::gemv_norm_supported(x, norm_w, n, N, C) || !cuda::gemv_supported(x, wg, N, C) ||
      !cuda::gemv_supported(x, wu, N, C))
    return composed::norm_linear_swiglu(*this, n, rstd, x, norm_w, N, C, eps, w_offset, gate, up, h, wg, wu, I);
  mark(Op::kGemm);
  cuda::gemv_swiglu(h, gate, up, x, cuda::GemvNorm{norm_w, (float)eps, (float)w_offset, n, rstd}, wg, wu, N, C, I,
                    stream_);
}

void CudaExec::linear_residual(Act* out, const Act* res, const Act* x, const Weight* w, int N, int IC, int OC,
                               Acc* sum) {
  if (!cuda::gemv_supported(x, w, N, IC) || N == 0)
    return composed::linear_residual(*this, out, res, x, w, N, IC, OC, sum);
  mark(Op::kGemm);
  cuda::gemv_residual(out, res, x, w, N, IC, OC, stream_);
}

void CudaExec::residual_add(Act* out, const Act* x, const Acc* y, int64_t n) {
  mark(Op::kOther);
  detail::residual_add(out, x, y, n, stream_);
}

void CudaExec::add_inplace(Act* y, const Acc* x, int64_t n) {
  mark(Op::kOther);
  detail::add_inplace(y, x, n, stream_);
}

void CudaExec::swiglu_forward(Act* h, const Act* gate, const Act* up, int64_t n) {
  mark(Op::kNorm);
  cuda::swiglu_forward(h, gate, up, n, stream_);
}

void CudaExec::swiglu_backward(Act* dgate, Act* dup, const Act* dh, const Act* gate, const Act* up, int64_t n) {
  mark(Op::kNorm);
  cuda::swiglu_backward(dgate, dup, dh, gate, up, n, stream_);
}

void CudaExec::rope_forward(Act* x, const Rope& r, int N, int H, int HS) {
  mark(Op::kNorm);
  cuda::rope_forward(x, r.pos, N, H, HS, r.theta, stream_, r.rotary_dim);
}

void CudaExec::rope_backward(Act* dx, const Rope& r, int N, int H, int HS) {
  mark(Op::kNorm);
  cuda::rope_backward(dx, r.pos, N, H, HS, r.theta, stream_, r.rotary_dim);
}

void CudaExec::rope_backward(Acc* dx, const Rope& r, int N, int H, int HS) {
  mark(Op::kNorm);
  cuda::rope_backward(dx, r.pos, N, H, HS, r.theta, stream_, r.rotary_dim);
}

void CudaExec::add_rows(Acc* dst, const int32_t* rows, const Acc* src, int R, int C) {
  mark(Op::kOther);
  detail::add_rows(dst, rows, src, R, C, stream_);
}

// The fused kernel rotates whole heads; partial RoPE runs the norm and the rotation one after
// the other.
static bool fused_rope(const CudaExec::Rope& r, int HS) {
  return r.table && (r.rotary_dim == 0 || r.rotary_dim == HS);
}

void CudaExec::qk_norm_rope_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, const Rope& r, int N, int H,
                                    int HS, double eps, double w_offset) {
  mark(Op::kNorm);
  if (fused_rope(r, HS)) {
    cuda::qk_norm_rope_forward(out, rstd, x, w, r.table, N, H, HS, eps, stream_, w_offset);
  } else {
    cuda::rmsnorm_forward(out, rstd, x, w, N * H, HS, eps, stream_, w_offset);
    cuda::rope_forward(out, r.pos, N, H, HS, r.theta, stream_, r.rotary_dim);
  }
}

void CudaExec::qk_norm_rope_pair(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                                 Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV, const Rope& r, int N,
                                 int HS, double eps, double w_offset, const Act* v, Act* store_k, Act* store_v,
                                 const int32_t* store_rows) {
  if (!fused_rope(r, HS) || !cuda::qk_norm_rope_supported(HS))
    return composed::qk_norm_rope_pair(*this, q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r, N, HS, eps,
                                       w_offset, v, store_k, store_v, store_rows);
  mark(Op::kNorm);
  cuda::qk_norm_rope_pair(q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r.table, N, HS, eps, w_offset, v,
                          store_k, store_v, store_rows, stream_);
}

void CudaExec::qk_norm_rope_backward(Act* dx, Param* dw, Act* dout, const Act* x, const Weight* w, const Stat* rstd,
                                     const Rope& r, int N, int H, int HS, double w_offset) {
  mark(Op::kNorm);
  const cuda::Workspace ws = workspace(cuda::rmsnorm_backward_workspace_bytes(N * H, HS));
  if (fused_rope(r, HS)) {
    cuda::qk_norm_rope_backward(dx, dw, dout, x, w, rstd, r.table, N, H, HS, ws, stream_, /*accumulate_dx=*/false,
                                w_offset);
  } else {
    cuda::rope_backward(dout, r.pos, N, H, HS, r.theta, stream_, r.rotary_dim);
    cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, N * H, HS, ws, stream_, /*accumulate_dx=*/false, w_offset);
  }
}

void CudaExec::ensure_decode_plan(const KV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  if (decode_plan_.matches(ext, n_ext, N, NH, NKV, HS)) return;
  decode_plan_.make(ext, n_ext, N, NH, NKV, HS);  // the first layer of a decode batch
  ensure(decode_tables_, decode_plan_.table_bytes());
  decode_plan_.upload(decode_tables_.data(), stream_);
}

void CudaExec::qk_norm_rope_attention(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                                      Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV, const Rope& r,
                                      int N, int HS, double eps, double w_offset, const Act* v, Act* store_k,
                                      Act* store_v, const int32_t* store_rows, Act* out, Stat* lse,
                                      const Layout& layout, const KV* ext, int n_ext) {
  if (layout.singletons && fused_rope(r, HS) && cuda::qk_norm_rope_supported(HS) && N > 0) {
    ensure_decode_plan(ext, n_ext, N, NH, NKV, HS);
    if (decode_plan_.cluster_size() > 0) {  // one kernel: the cluster's blocks normalize their own rows
      mark(Op::kAttention);
      cuda::DecodeQkNorm n;
      n.q = q, n.q_rstd = q_rstd, n.q_pre = q_pre, n.q_w = q_w;
      n.k = k, n.k_rstd = k_rstd, n.k_pre = k_pre, n.k_w = k_w;
      n.rope_cs = r.table, n.eps = (float)eps, n.w_offset = (float)w_offset;
      n.store_k = store_k, n.store_v = store_v, n.store_rows = store_rows;
      cuda::attention_decode_forward(out, lse, n, v, ext, n_ext, N, NH, NKV, HS, decode_plan_,
                                     workspace(decode_plan_.workspace_bytes()), stream_);
      return;
    }
  }
  composed::qk_norm_rope_attention(*this, q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r, N, HS, eps,
                                   w_offset, v, store_k, store_v, store_rows, out, lse, layout, ext, n_ext);
}

void CudaExec::attention_forward(Act* out, Stat* lse, const Act* q, const Act* k, const Act* v, const Layout& layout,
                                 const KV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  mark(Op::kAttention);
  if (layout.singletons) {
    ensure_decode_plan(ext, n_ext, N, NH, NKV, HS);
    cuda::attention_decode_forward(out, lse, q, k, v, ext, n_ext, N, NH, NKV, HS, decode_plan_,
                                   workspace(decode_plan_.workspace_bytes()), stream_);
  } else {
    cuda::attention_forward(out, lse, q, k, v, layout.tiles, ext, n_ext, N, NH, NKV, HS, stream_);
  }
}

void CudaExec::attention_backward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* out, const Stat* lse,
                                  const Act* q, const Act* k, const Act* v, const Layout& layout, const KV* ext,
                                  int n_ext, int N, int NH, int NKV, int HS) {
  mark(Op::kAttention);
  cuda::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, layout.tiles, ext, n_ext, N, NH, NKV, HS,
                           workspace(cuda::attention_backward_workspace_bytes(N, NH, HS)), stream_);
}

void CudaExec::gather_rows(Act* out, const Act* in, const int32_t* rows, int R, int C) {
  mark(Op::kOther);
  detail::gather_rows(out, in, rows, R, C, stream_);
}

void CudaExec::copy(Act* dst, const Act* src, int64_t n) {
  mark(Op::kOther);
  if (n) TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(Act) * (size_t)n, cudaMemcpyDeviceToDevice, stream_));
}

void CudaExec::copy(Acc* dst, const Acc* src, int64_t n) {
  mark(Op::kOther);
  if (n) TT_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(Acc) * (size_t)n, cudaMemcpyDeviceToDevice, stream_));
}

void CudaExec::move_cols(Act* dst, int dst_cols, int dst_col0, const Act* src, int src_cols, int src_col0, int N,
                         int cols) {
  mark(Op::kOther);
  if (N <= 0 || cols <= 0) return;
  TT_CHECK(dst_col0 + cols <= dst_cols && src_col0 + cols <= src_cols, "CudaExec::move_cols: columns [", src_col0,
           ", +", cols, ") of ", src_cols, " into [", dst_col0, ", +", cols, ") of ", dst_cols);
  TT_CUDA_CHECK(cudaMemcpy2DAsync(dst + dst_col0, sizeof(Act) * (size_t)dst_cols, src + src_col0,
                                  sizeof(Act) * (size_t)src_cols, sizeof(Act) * (size_t)cols, (size_t)N,
                                  cudaMemcpyDeviceToDevice, stream_));
}

void CudaExec::split_heads(Act* a, Act* b, const Act* ab, int N, int H, int D) {
  mark(Op::kOther);
  cuda::split_heads(a, b, ab, N, H, D, stream_);
}

void CudaExec::merge_heads(Act* ab, const Act* a, const Act* b, int N, int H, int D) {
  mark(Op::kOther);
  cuda::merge_heads(ab, a, b, N, H, D, stream_);
}

void CudaExec::sigmoid_gate_forward(Act* y, const Act* x, const Act* gate, int64_t n) {
  mark(Op::kNorm);
  cuda::sigmoid_gate_forward(y, x, gate, n, stream_);
}

void CudaExec::sigmoid_gate_backward(Act* dx, Act* dgate, const Act* dy, const Act* x, const Act* gate, int64_t n) {
  mark(Op::kNorm);
  cuda::sigmoid_gate_backward(dx, dgate, dy, x, gate, n, stream_);
}

static void check_planned(const CudaExec::Layout& l, int N, const char* op) {
  TT_CHECK(l.node_start && l.gdn.rows() == N, "CudaExec::", op, ": the batch's recurrent plan is missing (",
           "plan_recurrent) or covers ", l.gdn.rows(), " rows, not ", N);
}

void CudaExec::path_prev(int32_t* prev, const Layout& l, int N) {
  mark(Op::kOther);
  check_planned(l, N, "path_prev");
  cuda::gdn_path_prev(prev, l.node_start, l.node_len, l.node_parent, l.num_nodes, stream_);
}

void CudaExec::conv1d_silu_forward(Act* out, const Act* x, const Weight* w, const int32_t* prev, int N, int C, int K) {
  mark(Op::kNorm);
  cuda::conv1d_silu_forward(out, x, w, prev, N, C, K, stream_);
}

void CudaExec::conv1d_silu_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w,
                                    const int32_t* prev, const Layout& l, int N, int C, int K) {
  // The input gradient gathers from descendants through the batch's depths and subtree ends (a
  // carried conv over extended rows is the CPU backend's: kHostRecurrent).
  check_planned(l, N, "conv1d_silu_backward");
  mark(Op::kNorm);
  cuda::conv1d_silu_backward(dx, dw, dout, x, w, prev, l.pos, l.subtree_end, N, C, K,
                             workspace(cuda::conv1d_silu_backward_workspace_bytes(N, C, K)), stream_);
}

void CudaExec::conv1d_silu_backward(Acc* dx, Param* dw, const Act* dout, const Act* x, const Weight* w,
                                    const int32_t* prev, const int32_t* pos, const int32_t* subtree_end, int N, int C,
                                    int K) {
  mark(Op::kNorm);
  cuda::conv1d_silu_backward(dx, dw, dout, x, w, prev, pos, subtree_end, N, C, K,
                             workspace(cuda::conv1d_silu_backward_workspace_bytes(N, C, K)), stream_);
}

void CudaExec::add_rows(Act* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C) {
  mark(Op::kOther);
  detail::add_rows(dst, dst_rows, src, src_rows, n, C, stream_);
}

void CudaExec::add_rows(Acc* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C) {
  mark(Op::kOther);
  detail::add_rows(dst, dst_rows, src, src_rows, n, C, stream_);
}

void CudaExec::add_rows(Acc* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C) {
  mark(Op::kOther);
  detail::add_rows(dst, dst_rows, src, src_rows, n, C, stream_);
}

void CudaExec::copy_cols(Act* out, const Act* in, int N, int in_cols, int col0, int cols) {
  move_cols(out, cols, 0, in, in_cols, col0, N, cols);
}

void CudaExec::add_cols(Act* out, const Act* in, int N, int out_cols, int col0, int cols) {
  mark(Op::kOther);
  detail::add_cols(out, in, N, out_cols, col0, cols, stream_);
}

void CudaExec::l2norm_forward(Act* y, Stat* rstd, const Act* x, int rows, int D, double eps) {
  mark(Op::kNorm);
  cuda::l2norm_forward(y, rstd, x, rows, D, eps, stream_);
}

void CudaExec::l2norm_backward(Act* dx, const Act* dy, const Act* x, const Stat* rstd, int rows, int D) {
  mark(Op::kNorm);
  cuda::l2norm_backward(dx, dy, x, rstd, rows, D, stream_);
}

void CudaExec::gated_rmsnorm_forward(Act* y, Stat* rstd, const Act* x, const Act* z, const Weight* w, int rows, int D,
                                     double eps) {
  mark(Op::kNorm);
  cuda::gated_rmsnorm_forward(y, rstd, x, z, w, rows, D, eps, stream_);
}

void CudaExec::gated_rmsnorm_backward(Act* dx, Act* dz, Param* dw, const Act* dy, const Act* x, const Act* z,
                                      const Weight* w, const Stat* rstd, int rows, int D) {
  mark(Op::kNorm);
  cuda::gated_rmsnorm_backward(dx, dz, dw, dy, x, z, w, rstd, rows, D,
                               workspace(cuda::gated_rmsnorm_backward_workspace_bytes(rows, D)), stream_);
}

void CudaExec::gdn_gates_forward(Acc* g, Act* beta, const Act* a, const Act* b, const Weight* A_log,
                                 const Weight* dt_bias, int N, int H) {
  mark(Op::kNorm);
  cuda::gdn_gates_forward(g, beta, a, b, A_log, dt_bias, N, H, stream_);
}

void CudaExec::gdn_gates_backward(Act* da, Act* db, Param* dA_log, Param* ddt_bias, const Acc* dg, const Acc* dbeta,
                                  const Act* a, const Act* b, const Weight* A_log, const Weight* dt_bias, int N,
                                  int H) {
  mark(Op::kNorm);
  cuda::gdn_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, N, H,
                           workspace(cuda::gdn_gates_backward_workspace_bytes(N, H)), stream_);
}

void CudaExec::gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                           const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale,
                           const double* init, double* end) {
  TT_CHECK(!init && !end, "CudaExec::gdn_forward: carried recurrent states are the cpu backend's (kHostRecurrent)");
  check_planned(layout, N, "gdn_forward");
  mark(Op::kAttention);
  cuda::gdn_forward(o, nullptr, q, k, v, g, beta, nullptr, layout.gdn, nk, nv, dk, dv, scale,
                    workspace(cuda::gdn_forward_workspace_bytes(layout.gdn, nv, dk, dv, false, options_.gdn_products)),
                    stream_, options_.gdn_products);
}

void CudaExec::gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                           const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale,
                           const float* init, float* end) {
  check_planned(layout, N, "gdn_forward");
  mark(Op::kAttention);
  cuda::gdn_forward(o, end, q, k, v, g, beta, init, layout.gdn, nk, nv, dk, dv, scale,
                    workspace(cuda::gdn_forward_workspace_bytes(layout.gdn, nv, dk, dv, end != nullptr,
                                                                options_.gdn_products)),
                    stream_, options_.gdn_products);
}

void CudaExec::gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q, const Act* k,
                            const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N, int nk, int nv,
                            int k_dim, int v_dim, double scale, const double* init, double* d_init,
                            const double* d_end) {
  TT_CHECK(!init && !d_init && !d_end,
           "CudaExec::gdn_backward: carried recurrent states are the cpu backend's (kHostRecurrent)");
  check_planned(layout, N, "gdn_backward");
  mark(Op::kAttention);
  cuda::gdn_backward(dq, dk, dv, dg, dbeta, nullptr, d_o, nullptr, q, k, v, g, beta, nullptr, layout.gdn, nk, nv,
                     k_dim, v_dim, scale,
                     workspace(cuda::gdn_backward_workspace_bytes(layout.gdn, nv, k_dim, v_dim, options_.gdn_products)),
                     stream_, /*accumulate=*/true, options_.gdn_products);
}

void CudaExec::gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q, const Act* k,
                            const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N, int nk, int nv,
                            int k_dim, int v_dim, double scale, const float* init, float* d_init, const float* d_end) {
  check_planned(layout, N, "gdn_backward");
  mark(Op::kAttention);
  cuda::gdn_backward(dq, dk, dv, dg, dbeta, d_init, d_o, d_end, q, k, v, g, beta, init, layout.gdn, nk, nv, k_dim,
                     v_dim, scale,
                     workspace(cuda::gdn_backward_workspace_bytes(layout.gdn, nv, k_dim, v_dim, options_.gdn_products)),
                     stream_, /*accumulate=*/true, options_.gdn_products);
}

void CudaExec::retrieval_select(int32_t* idx, const Act* q, const Act* pool_k, int P, int NH, int NKV, int HS,
                                uint64_t heads, int R) {
  mark(Op::kOther);
  cuda::retrieval_select(idx, q, pool_k, P, NH, NKV, HS, heads, R,
                         workspace(cuda::retrieval_select_workspace_bytes(P, R)), stream_);
}

void CudaExec::retrieval_gather(Act* out, const Act* pool, const int32_t* idx, int R, int NKV, int HS,
                                uint64_t heads) {
  mark(Op::kOther);
  cuda::retrieval_gather(out, pool, idx, R, NKV, HS, heads, stream_);
}

void CudaExec::scatter_rows(Act* out, const Act* in, const int32_t* rows, int R, int C) {
  mark(Op::kOther);
  detail::scatter_rows(out, in, rows, R, C, stream_);
}

void CudaExec::layernorm_forward(Act* out, Stat* mean, Stat* rstd, const Act* x, const Weight* w, const Weight* b,
                                 int rows, int C, double eps) {
  mark(Op::kNorm);
  cuda::layernorm_forward(out, mean, rstd, x, w, b, rows, C, eps, stream_);
}

void CudaExec::layernorm_backward(Act* dx, Param* dw, Param* db, const Act* dout, const Act* x, const Weight* w,
                                  const Stat* mean, const Stat* rstd, int rows, int C) {
  mark(Op::kNorm);
  cuda::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, C, /*accumulate_dx=*/true,
                           workspace(cuda::layernorm_backward_workspace_bytes(rows, C)), stream_);
}

void CudaExec::gelu_forward(Act* y, const Act* x, int64_t n, bool tanh) {
  mark(Op::kNorm);
  cuda::gelu_forward(y, x, n, tanh, stream_);
}

void CudaExec::gelu_backward(Act* dx, const Act* dy, const Act* x, int64_t n, bool tanh) {
  mark(Op::kNorm);
  cuda::gelu_backward(dx, dy, x, n, tanh, /*accumulate=*/true, stream_);
}

void CudaExec::bias_add(Act* out, const Weight* b, int rows, int C) {
  mark(Op::kOther);
  cuda::bias_add(out, b, rows, C, stream_);
}

void CudaExec::bias_add(Acc* out, const Weight* b, int rows, int C) {
  mark(Op::kOther);
  cuda::bias_add(out, b, rows, C, stream_);
}

void CudaExec::bias_backward(Param* db, const Act* dout, int rows, int C) {
  mark(Op::kOther);
  cuda::bias_backward(db, dout, rows, C, workspace(cuda::bias_backward_workspace_bytes(rows, C)), stream_);
}

void CudaExec::copy_rows(Act* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C) {
  mark(Op::kOther);
  cuda::copy_rows(dst, dst_rows, src, src_rows, n, C, stream_);
}

void CudaExec::sum_rows(Act* dst, const Act* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C) {
  mark(Op::kOther);
  cuda::sum_rows(dst, src, offsets, src_rows, n_dst, C, stream_);
}

void CudaExec::zero_rows(Act* dst, const int32_t* rows, int n, int C) {
  mark(Op::kOther);
  cuda::zero_rows(dst, rows, n, C, stream_);
}

void CudaExec::patchify(Act* patches, const float* pixels, int F, int S, int patch) {
  mark(Op::kOther);
  cuda::patchify(patches, pixels, F, S, patch, stream_);
}

void CudaExec::cross_entropy(double* loss, Stat* lse, Act* dlogits, const Act* logits, const Targets& tgt,
                             int row_begin, int rows, int V, double dloss) {
  mark(Op::kOther);
  const cuda::Workspace ws = workspace(cuda::cross_entropy_workspace_bytes(rows, tgt.n_tgt));
  if (dlogits) {
    cuda::cross_entropy_forward_backward(loss, lse, dlogits, logits, tgt, row_begin, rows, V, (float)dloss, ws, stream_);
  } else {
    cuda::cross_entropy_forward(loss, lse, logits, tgt, row_begin, rows, V, ws, stream_);
  }
}

void CudaExec::sample_rows(int32_t* token, double* logprob, const Act* logits, int R, int V, double temperature,
                           const uint64_t* keys) {
  mark(Op::kOther);
  cuda::sample_rows(token, logprob, logits, R, V, temperature, keys, stream_);
}

void CudaExec::begin_head() {
  mark(Op::kHead);
  in_head_ = true;
}

void CudaExec::end_head() { in_head_ = false; }

void CudaExec::begin_vision() {
  mark(Op::kVision);
  in_vision_ = true;
}

void CudaExec::end_vision() { in_vision_ = false; }

void CudaExec::mark(Op op) {
  if (!options_.profile) return;
  if (in_head_) op = Op::kHead;
  if (in_vision_) op = Op::kVision;
  const auto now = std::chrono::steady_clock::now();
  if (host_op_ != Op::kNone)
    add_time(host_, host_op_, std::chrono::duration<double, std::milli>(now - host_since_).count());
  host_op_ = op;
  host_since_ = now;
  if (op == current_) return;
  current_ = op;
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

void CudaExec::add_time(CudaOpTimes& t, Op op, double ms) {
  switch (op) {
    case Op::kGemm: t.gemm_ms += ms; break;
    case Op::kAttention: t.attention_ms += ms; break;
    case Op::kHead: t.head_ms += ms; break;
    case Op::kNorm: t.norm_ms += ms; break;
    case Op::kVision: t.vision_ms += ms; break;
    default: t.other_ms += ms; break;
  }
}

CudaProfile CudaExec::take_profile() {
  CudaProfile p;
  if (marks_.empty()) return p;
  mark(Op::kNone);
  p.host = host_;
  host_ = CudaOpTimes{};
  TT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    if (marks_[i].second == Op::kNone) continue;
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].first, marks_[i + 1].first));
    add_time(p, marks_[i].second, ms);
  }
  for (auto& m : marks_) spare_events_.push_back(m.first);
  marks_.clear();
  current_ = Op::kNone;
  return p;
}

}  // namespace tt::model
