// CpuExec: the op vocabulary of model/exec.h on the reference ops of ops/cpu.
#include "model/exec_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "base/check.h"
#include "model/carve.h"
#include "ops/cpu/adamw.h"
#include "ops/cpu/cross_entropy.h"
#include "ops/cpu/vision.h"
#include "ops/cpu/embedding.h"
#include "ops/cpu/gated_attention.h"
#include "ops/cpu/gdn.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/retrieval.h"
#include "ops/cpu/rmsnorm.h"
#include "ops/cpu/rope.h"
#include "ops/cpu/sampling.h"
#include "ops/cpu/swiglu.h"
#include "model/init.h"

namespace tt::model {

void HostBuffer::ensure(size_t bytes) {
  if (bytes <= n_ && p_) return;
  const size_t n = std::max<size_t>((bytes + kCarveAlign - 1) / kCarveAlign * kCarveAlign, kCarveAlign);
  char* p = static_cast<char*>(std::aligned_alloc(kCarveAlign, n));
  if (!p) throw std::bad_alloc();
  p_.reset(p);
  n_ = n;
}

template <class T>
void CpuExec<T>::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

template <class T>
void CpuExec<T>::download(void* dst, const void* src, size_t bytes) const {
  if (bytes) std::memcpy(dst, src, bytes);
}

template <class T>
void CpuExec<T>::zero(void* p, size_t bytes) {
  if (bytes) std::memset(p, 0, bytes);
}

template <class T>
typename CpuExec<T>::Layout CpuExec<T>::make_layout(int, int num_nodes, const int32_t* node_start,
                                                    const int32_t* node_len, const int32_t* node_parent,
                                                    const int32_t*, bool, char*, const int32_t* key_lo) {
  Layout l{num_nodes, node_start, node_len, node_parent};
  l.bidirectional = key_lo != nullptr;
  return l;
}

template <class T>
typename CpuExec<T>::Rope CpuExec<T>::make_rope(const int32_t* pos, int, int, double theta, char*) {
  return Rope{pos, theta};
}

template <class T>
void CpuExec<T>::init_normal(Param* w, int64_t n, uint64_t seed, double stddev) {
  init_normal_host(w, n, seed, stddev);
}

template <class T>
void CpuExec<T>::fill(Param* w, int64_t n, float value) {
  std::fill(w, w + n, T(value));
}

template <class T>
double CpuExec<T>::sum_squares(const Param* x, int64_t n) {
  return cpu::sum_squares(x, n);
}

template <class T>
void CpuExec<T>::embedding_forward(Act* out, const int32_t* tokens, const Weight* wte, int N, int C, int) {
  cpu::embedding_forward(out, tokens, wte, N, C);
}

template <class T>
void CpuExec<T>::embedding_backward(Param* dwte, const Act* dout, const int32_t* tokens, int N, int C, int) {
  cpu::embedding_backward(dwte, dout, tokens, N, C);
}

template <class T>
void CpuExec<T>::rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, int rows, int C, double eps,
                                 double w_offset) {
  cpu::rmsnorm_forward(out, rstd, x, w, rows, C, eps, w_offset);
}

template <class T>
void CpuExec<T>::rmsnorm_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w,
                                  const Stat* rstd, int rows, int C, bool accumulate_dx, double w_offset) {
  if (!accumulate_dx) zero(dx, sizeof(T) * (size_t)rows * C);
  cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, rows, C, w_offset);
}

template <class T>
void CpuExec<T>::linear(Act* out, const Act* x, const Weight* w, int N, int IC, int OC) {
  cpu::matmul_forward(out, x, w, N, IC, OC);
}

template <class T>
void CpuExec<T>::linear_dx(Act* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate) {
  if (!accumulate) zero(dx, sizeof(T) * (size_t)N * IC);
  cpu::matmul_backward<T>(dx, nullptr, dout, nullptr, w, N, IC, OC);
}

template <class T>
void CpuExec<T>::linear_dw(Param* dw, const Act* dout, const Act* x, int N, int IC, int OC) {
  cpu::matmul_backward<T>(nullptr, dw, dout, x, nullptr, N, IC, OC);
}

template <class T>
void CpuExec<T>::residual_add(Act* out, const Act* x, const Acc* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = y[i] + x[i];
}

template <class T>
void CpuExec<T>::add_inplace(Act* y, const Acc* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <class T>
void CpuExec<T>::swiglu_forward(Act* h, const Act* gate, const Act* up, int64_t n) {
  cpu::swiglu_forward(h, gate, up, n);
}

template <class T>
void CpuExec<T>::norm_linear(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                             double w_offset, const LinearOut<Act, Weight>* outs, int n_outs) {
  composed::norm_linear(*this, n, rstd, x, norm_w, N, C, eps, w_offset, outs, n_outs);
}

template <class T>
void CpuExec<T>::norm_linear_swiglu(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C,
                                    double eps, double w_offset, Act* gate, Act* up, Act* h, const Weight* wg,
                                    const Weight* wu, int I) {
  composed::norm_linear_swiglu(*this, n, rstd, x, norm_w, N, C, eps, w_offset, gate, up, h, wg, wu, I);
}

template <class T>
void CpuExec<T>::linear_residual(Act* out, const Act* res, const Act* x, const Weight* w, int N, int IC, int OC,
                                 Acc* sum) {
  composed::linear_residual(*this, out, res, x, w, N, IC, OC, sum);
}

template <class T>
void CpuExec<T>::swiglu_backward(Act* dgate, Act* dup, const Act* dh, const Act* gate, const Act* up, int64_t n) {
  cpu::swiglu_backward(dgate, dup, dh, gate, up, n);
}

template <class T>
void CpuExec<T>::rope_forward(Act* x, const Rope& r, int N, int H, int HS) {
  cpu::rope_forward(x, r.pos, N, H, HS, r.theta, r.rotary_dim);
}

template <class T>
void CpuExec<T>::rope_backward(Act* dx, const Rope& r, int N, int H, int HS) {
  cpu::rope_backward(dx, r.pos, N, H, HS, r.theta, r.rotary_dim);
}

template <class T>
void CpuExec<T>::qk_norm_rope_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, const Rope& r, int N,
                                      int H, int HS, double eps, double w_offset) {
  cpu::rmsnorm_forward(out, rstd, x, w, N * H, HS, eps, w_offset);
  cpu::rope_forward(out, r.pos, N, H, HS, r.theta, r.rotary_dim);
}

template <class T>
void CpuExec<T>::qk_norm_rope_pair(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                                   Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV, const Rope& r, int N,
                                   int HS, double eps, double w_offset, const Act* v, Act* store_k, Act* store_v,
                                   const int32_t* store_rows) {
  composed::qk_norm_rope_pair(*this, q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r, N, HS, eps, w_offset, v,
                              store_k, store_v, store_rows);
}

template <class T>
void CpuExec<T>::qk_norm_rope_attention(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                                        Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV, const Rope& r,
                                        int N, int HS, double eps, double w_offset, const Act* v, Act* store_k,
                                        Act* store_v, const int32_t* store_rows, Act* out, Stat* lse,
                                        const Layout& layout, const KV* ext, int n_ext) {
  composed::qk_norm_rope_attention(*this, q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r, N, HS, eps,
                                   w_offset, v, store_k, store_v, store_rows, out, lse, layout, ext, n_ext);
}

template <class T>
void CpuExec<T>::qk_norm_rope_backward(Act* dx, Param* dw, Act* dout, const Act* x, const Weight* w,
                                       const Stat* rstd, const Rope& r, int N, int H, int HS, double w_offset) {
  cpu::rope_backward(dout, r.pos, N, H, HS, r.theta, r.rotary_dim);
  zero(dx, sizeof(T) * (size_t)N * H * HS);
  cpu::rmsnorm_backward(dx, dw, dout, x, w, rstd, N * H, HS, w_offset);
}

template <class T>
void CpuExec<T>::attention_forward(Act* out, Stat* lse, const Act* q, const Act* k, const Act* v,
                                   const Layout& layout, const KV* ext, int n_ext, int N, int NH, int NKV, int HS) {
  cpu::attention_forward(out, lse, q, k, v, layout, ext, n_ext, N, NH, NKV, HS);
}

template <class T>
void CpuExec<T>::attention_backward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* out, const Stat* lse,
                                    const Act* q, const Act* k, const Act* v, const Layout& layout, const KV* ext,
                                    int n_ext, int N, int NH, int NKV, int HS) {
  cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, layout, ext, n_ext, N, NH, NKV, HS);
}

template <class T>
void CpuExec<T>::gather_rows(Act* out, const Act* in, const int32_t* rows, int R, int C) {
  for (int r = 0; r < R; ++r) std::copy(in + (int64_t)rows[r] * C, in + (int64_t)(rows[r] + 1) * C, out + (int64_t)r * C);
}

template <class T>
void CpuExec<T>::copy(Act* dst, const Act* src, int64_t n) {
  std::copy(src, src + n, dst);
}

template <class T>
void CpuExec<T>::add_rows(Acc* dst, const int32_t* rows, const Acc* src, int R, int C) {
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) dst[(int64_t)rows[r] * C + c] += src[(int64_t)r * C + c];
}

template <class T>
void CpuExec<T>::add_rows(Acc* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C) {
  for (int i = 0; i < n; i++)
    for (int c = 0; c < C; c++) dst[(int64_t)dst_rows[i] * C + c] += src[(int64_t)src_rows[i] * C + c];
}

template <class T>
void CpuExec<T>::retrieval_select(int32_t* idx, const Act* q, const Act* pool_k, int P, int NH, int NKV, int HS,
                                  uint64_t heads, int R) {
  cpu::retrieval_select(idx, q, pool_k, P, NH, NKV, HS, heads, R);
}

template <class T>
void CpuExec<T>::retrieval_gather(Act* out, const Act* pool, const int32_t* idx, int R, int NKV, int HS,
                                  uint64_t heads) {
  cpu::retrieval_gather(out, pool, idx, R, NKV, HS, heads);
}

template <class T>
void CpuExec<T>::scatter_rows(Act* out, const Act* in, const int32_t* rows, int R, int C) {
  for (int r = 0; r < R; ++r) std::copy(in + (int64_t)r * C, in + (int64_t)(r + 1) * C, out + (int64_t)rows[r] * C);
}

template <class T>
void CpuExec<T>::cross_entropy(double* loss, Stat* lse, Act* dlogits, const Act* logits, const Targets& tgt,
                               int row_begin, int rows, int V, double dloss) {
  // ops/cpu counts a target's source from the first row it is given.
  std::vector<int32_t> src(tgt.src, tgt.src + tgt.n_tgt);
  for (int32_t& s : src) s -= row_begin;
  *loss += cpu::cross_entropy_forward(lse, logits, src.data(), tgt.tok, tgt.w, tgt.n_tgt, rows, V, tgt.c, tgt.c_loss);
  if (dlogits) cpu::cross_entropy_backward(dlogits, logits, lse, src.data(), tgt.tok, tgt.w, tgt.n_tgt, rows, V, dloss);
}

template <class T>
void CpuExec<T>::sample_rows(int32_t* token, double* logprob, const Act* logits, int R, int V, double temperature,
                             const uint64_t* keys) {
  cpu::sample_rows(token, logprob, logits, R, V, temperature, keys);
}

template <class T>
void CpuExec<T>::split_heads(Act* a, Act* b, const Act* ab, int N, int H, int D) {
  cpu::split_heads(a, b, ab, N, H, D);
}

template <class T>
void CpuExec<T>::merge_heads(Act* ab, const Act* a, const Act* b, int N, int H, int D) {
  cpu::merge_heads(ab, a, b, N, H, D);
}

template <class T>
void CpuExec<T>::sigmoid_gate_forward(Act* y, const Act* x, const Act* gate, int64_t n) {
  cpu::sigmoid_gate_forward(y, x, gate, n);
}

template <class T>
void CpuExec<T>::sigmoid_gate_backward(Act* dx, Act* dgate, const Act* dy, const Act* x, const Act* gate, int64_t n) {
  cpu::sigmoid_gate_backward(dx, dgate, dy, x, gate, n);
}

template <class T>
void CpuExec<T>::path_prev(int32_t* prev, const Layout& l, int N) {
  cpu::path_prev(prev, l.node_start, l.node_len, l.node_parent, l.num_nodes, N);
}

template <class T>
void CpuExec<T>::conv1d_silu_forward(Act* out, const Act* x, const Weight* w, const int32_t* prev, int N, int C,
                                     int K) {
  cpu::conv1d_silu_forward(out, x, w, prev, N, C, K);
}

template <class T>
void CpuExec<T>::conv1d_silu_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w,
                                      const int32_t* prev, const Layout&, int N, int C, int K) {
  cpu::conv1d_silu_backward(dx, dw, dout, x, w, prev, N, C, K);
}

template <class T>
void CpuExec<T>::copy_cols(Act* out, const Act* in, int N, int in_cols, int col0, int cols) {
  for (int i = 0; i < N; i++) std::copy_n(in + (size_t)i * in_cols + col0, cols, out + (size_t)i * cols);
}

template <class T>
void CpuExec<T>::add_cols(Act* out, const Act* in, int N, int out_cols, int col0, int cols) {
  for (int i = 0; i < N; i++)
    for (int c = 0; c < cols; c++) out[(size_t)i * out_cols + col0 + c] += in[(size_t)i * cols + c];
}

template <class T>
void CpuExec<T>::move_cols(Act* dst, int dst_cols, int dst_col0, const Act* src, int src_cols, int src_col0, int N,
                           int cols) {
  for (int i = 0; i < N; i++)
    std::copy_n(src + (size_t)i * src_cols + src_col0, cols, dst + (size_t)i * dst_cols + dst_col0);
}

template <class T>
void CpuExec<T>::layernorm_forward(Act* out, Stat* mean, Stat* rstd, const Act* x, const Weight* w, const Weight* b,
                                   int rows, int C, double eps) {
  cpu::layernorm_forward(out, mean, rstd, x, w, b, rows, C, eps);
}

template <class T>
void CpuExec<T>::layernorm_backward(Act* dx, Param* dw, Param* db, const Act* dout, const Act* x, const Weight* w,
                                    const Stat* mean, const Stat* rstd, int rows, int C) {
  cpu::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, rows, C);
}

template <class T>
void CpuExec<T>::gelu_forward(Act* y, const Act* x, int64_t n, bool tanh) {
  if (tanh) cpu::gelu_tanh_forward(y, x, n);
  else cpu::gelu_erf_forward(y, x, n);
}

template <class T>
void CpuExec<T>::gelu_backward(Act* dx, const Act* dy, const Act* x, int64_t n, bool tanh) {
  if (tanh) cpu::gelu_tanh_backward(dx, dy, x, n);
  else cpu::gelu_erf_backward(dx, dy, x, n);
}

template <class T>
void CpuExec<T>::bias_add(Act* out, const Weight* b, int rows, int C) {
  cpu::bias_add(out, b, rows, C);
}

template <class T>
void CpuExec<T>::bias_backward(Param* db, const Act* dout, int rows, int C) {
  cpu::bias_backward(db, dout, rows, C);
}

template <class T>
void CpuExec<T>::copy_rows(Act* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C) {
  cpu::copy_rows(dst, dst_rows, src, src_rows, n, C);
}

template <class T>
void CpuExec<T>::sum_rows(Act* dst, const Act* src, const int32_t* offsets, const int32_t* src_rows, int n_dst,
                          int C) {
  cpu::sum_rows(dst, src, offsets, src_rows, n_dst, C);
}

template <class T>
void CpuExec<T>::zero_rows(Act* dst, const int32_t* rows, int n, int C) {
  cpu::zero_rows(dst, rows, n, C);
}

template <class T>
void CpuExec<T>::patchify(Act* patches, const float* pixels, int F, int S, int patch) {
  const int64_t frame = (int64_t)3 * S * S, P = (int64_t)(S / patch) * (S / patch), row = (int64_t)3 * patch * patch;
  std::vector<T> px(frame);
  for (int f = 0; f < F; ++f) {
    std::copy(pixels + f * frame, pixels + (f + 1) * frame, px.begin());
    cpu::patchify(patches + f * P * row, px.data(), S, S, patch);
  }
}

template <class T>
void CpuExec<T>::l2norm_forward(Act* y, Stat* rstd, const Act* x, int rows, int D, double eps) {
  cpu::l2norm_forward(y, rstd, x, rows, D, eps);
}

template <class T>
void CpuExec<T>::l2norm_backward(Act* dx, const Act* dy, const Act* x, const Stat* rstd, int rows, int D) {
  cpu::l2norm_backward(dx, dy, x, rstd, rows, D);
}

template <class T>
void CpuExec<T>::gated_rmsnorm_forward(Act* y, Stat* rstd, const Act* x, const Act* z, const Weight* w, int rows,
                                       int D, double eps) {
  cpu::gated_rmsnorm_forward(y, rstd, x, z, w, rows, D, eps);
}

template <class T>
void CpuExec<T>::gated_rmsnorm_backward(Act* dx, Act* dz, Param* dw, const Act* dy, const Act* x, const Act* z,
                                        const Weight* w, const Stat* rstd, int rows, int D) {
  cpu::gated_rmsnorm_backward(dx, dz, dw, dy, x, z, w, rstd, rows, D);
}

template <class T>
void CpuExec<T>::gdn_gates_forward(Acc* g, Act* beta, const Act* a, const Act* b, const Weight* A_log,
                                   const Weight* dt_bias, int N, int H) {
  cpu::gdn_gates_forward(g, beta, a, b, A_log, dt_bias, N, H);
}

template <class T>
void CpuExec<T>::gdn_gates_backward(Act* da, Act* db, Param* dA_log, Param* ddt_bias, const Acc* dg, const Acc* dbeta,
                                    const Act* a, const Act* b, const Weight* A_log, const Weight* dt_bias, int N,
                                    int H) {
  cpu::gdn_gates_backward(da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, N, H);
}

namespace {
template <class L>
cpu::GdnTree gdn_tree(const L& l, int N, int nk, int nv, int dk, int dv, double scale) {
  cpu::GdnTree t;
  t.node_start = l.node_start;
  t.node_len = l.node_len;
  t.node_parent = l.node_parent;
  t.num_nodes = l.num_nodes;
  t.N = N;
  t.nk = nk, t.nv = nv, t.dk = dk, t.dv = dv;
  t.scale = scale;
  return t;
}
}  // namespace

template <class T>
void CpuExec<T>::gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                             const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale,
                             const double* init, double* end) {
  cpu::gdn_tree_forward(o, end, q, k, v, g, beta, init, gdn_tree(layout, N, nk, nv, dk, dv, scale));
}

template <class T>
void CpuExec<T>::gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q,
                              const Act* k, const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N,
                              int nk, int nv, int dk_, int dv_, double scale, const double* init,
                              double* d_init, const double* d_end) {
  cpu::gdn_tree_backward(dq, dk, dv, dg, dbeta, d_init, d_o, d_end, q, k, v, g, beta, init,
                         gdn_tree(layout, N, nk, nv, dk_, dv_, scale));
}

template class CpuExec<float>;
template class CpuExec<double>;

}  // namespace tt::model
