// The CPU execution backend of the decoder: the reference ops of ops/cpu behind the op vocabulary
// every layer kind is written in (model/exec.h states it; model/exec_cuda.h is the GPU backend).
//
// Everything is T (float for training, double for the exactness tests): activations, statistics,
// accumulators, master weights and the weights the ops read (one buffer: no working copy). The
// CPU backend is the oracle, so its backward never consumes what forward saved (a backward can be
// repeated on the same activations and adds the same gradient again) and the LM head's gradient
// is taken in backward(), like every other gradient.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "model/config.h"
#include "model/exec.h"
#include "ops/cpu/attention.h"

namespace tt::model {

// A grow-only host buffer, 256-byte aligned (model/carve.h).
class HostBuffer {
 public:
  char* data() { return p_.get(); }
  const char* data() const { return p_.get(); }
  size_t size() const { return n_; }
  // Grows to at least `bytes` (contents are not kept when it grows).
  void ensure(size_t bytes);

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> p_;
  size_t n_ = 0;
};

template <class T>
class CpuExec {
 public:
  using Act = T;     // activations
  using Stat = T;    // per-row statistics (rstd, lse)
  using Acc = T;     // sums of several products, relayed gradients
  using Param = T;   // master weights and their gradients
  using Weight = T;  // what the ops read as weights (the master weights themselves)
  using KV = cpu::ExternalKV<T>;
  using Layout = cpu::AttnLayout;
  using Buffer = HostBuffer;
  struct Rope {
    const int32_t* pos = nullptr;  // (N)
    double theta = 0;
    int rotary_dim = 0;  // RoPE on the first rotary_dim dims of a head (0: all; Qwen3.5's partial RoPE)
  };
  // A head chunk's targets: src indexes the batch's head rows (the chunk starts at row_begin).
  struct Targets {
    const int32_t* src = nullptr;
    const int32_t* tok = nullptr;
    const double* w = nullptr;
    int n_tgt = 0;
    const double* c = nullptr;  // (n_tgt) second weights: *c_loss += sum_t c_t ce_t (the NLL's counts)
    double* c_loss = nullptr;
  };

  struct Options {};
  static constexpr const char* kName = "cpu";
  static constexpr bool kSeparateWeights = false;      // Weight buffer == Param buffer
  static constexpr bool kBackwardConsumesSaved = false;
  static constexpr bool kHeadGradInForward = false;
  static constexpr int kMaxExternalKV = INT_MAX;
  static int max_external_kv(bool) { return INT_MAX; }
  static constexpr int64_t kDefaultHeadChunkBytes = INT64_MAX;  // one chunk: every head row at once
  // The Qwen3.5 ops below (Gated DeltaNet, gated attention, zero-centred norms, partial RoPE;
  // model/gdn.h, model/attention.h).
  static constexpr bool kHybridOps = true;
  // A recurrent layer's carried state (init / end states, conv context) is host memory here.
  static constexpr bool kHostRecurrent = true;
  // The vision tower's ops below (LayerNorm, GELU, biases, row moves, patchify; model/vision.h).
  static constexpr bool kVisionOps = true;

  explicit CpuExec(const Options& = {}) {}
  // Every config the model accepts runs here.
  static void check_model(const ModelConfig&) {}

  // Memory: host pointers everywhere.
  void ensure(Buffer& b, size_t bytes) { b.ensure(bytes); }
  void upload(void* dst, const void* src, size_t bytes);
  void download(void* dst, const void* src, size_t bytes) const;
  void zero(void* p, size_t bytes);
  void sync() const {}
  double read(const double* p) const { return *p; }
  // Pipelined downloads (model/exec_cuda.h): here every copy is done on return.
  using PinnedBuffer = HostBuffer;
  struct Fence {};
  void ensure_pinned(PinnedBuffer& b, size_t bytes) { b.ensure(bytes); }
  void download_async(void* dst, const void* src, size_t bytes) { download(dst, src, bytes); }
  void record(Fence&) {}
  void wait(const Fence&) const {}
  static double to_double(Act x) { return (double)x; }

  // Batch preparation (ops/cpu/attention.h reads the node ranges directly).
  static size_t layout_bytes(int) { return 0; }
  // key_lo (N; the first token of each key's node): the bidirectional mode (ops/cpu/attention.h
  // AttnLayout::bidirectional reads the node ranges, so only its presence matters here).
  Layout make_layout(int N, int num_nodes, const int32_t* node_start, const int32_t* node_len,
                     const int32_t* node_parent, const int32_t* subtree_end, bool singletons, char* storage,
                     const int32_t* key_lo = nullptr);
  // The recurrent layers read the node ranges from the layout directly: nothing to plan.
  static size_t recurrent_plan_bytes(int, int) { return 0; }
  void plan_recurrent(Layout&, int, int, const int32_t*, const int32_t*, const int32_t*, const int32_t*,
                      const int32_t*, const int32_t*, const int32_t*, const int32_t*, char*) {}
  static size_t rope_bytes(int, int) { return 0; }
  Rope make_rope(const int32_t* pos, int N, int HS, double theta, char* storage);

  // Parameters.
  void init_normal(Param* w, int64_t n, uint64_t seed, double stddev);
  void fill(Param* w, int64_t n, float value);
  void to_weights(Weight*, const Param*, int64_t) {}  // no working copy
  void upload_weights(Weight* out, const float* host, int64_t n) { std::copy(host, host + n, out); }
  void download_weights(float* host, const Weight* in, int64_t n) const { std::copy(in, in + n, host); }
  double sum_squares(const Param* x, int64_t n);

  // The op vocabulary (model/exec.h).
  void embedding_forward(Act* out, const int32_t* tokens, const Weight* wte, int N, int C, int V);
  void embedding_backward(Param* dwte, const Act* dout, const int32_t* tokens, int N, int C, int V);
  // w_offset (kHybridOps): the scale is w + w_offset (1: Qwen3.5's zero-centred norm weights).
  void rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, int rows, int C, double eps,
                       double w_offset = 0);
  void rmsnorm_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w, const Stat* rstd,
                        int rows, int C, bool accumulate_dx, double w_offset = 0);
  void linear(Act* out, const Act* x, const Weight* w, int N, int IC, int OC);
  void linear_dx(Act* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate);
  void linear_dw(Param* dw, const Act* dout, const Act* x, int N, int IC, int OC);
  void residual_add(Act* out, const Act* x, const Acc* y, int64_t n);
  void add_inplace(Act* y, const Acc* x, int64_t n);
  void swiglu_forward(Act* h, const Act* gate, const Act* up, int64_t n);
  void norm_linear(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps, double w_offset,
                   const LinearOut<Act, Weight>* outs, int n_outs);
  void norm_linear_swiglu(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                          double w_offset, Act* gate, Act* up, Act* h, const Weight* wg, const Weight* wu, int I);
  void linear_residual(Act* out, const Act* res, const Act* x, const Weight* w, int N, int IC, int OC, Acc* sum);
  void swiglu_backward(Act* dgate, Act* dup, const Act* dh, const Act* gate, const Act* up, int64_t n);
  void rope_forward(Act* x, const Rope& r, int N, int H, int HS);
  void rope_backward(Act* dx, const Rope& r, int N, int H, int HS);
  void qk_norm_rope_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, const Rope& r, int N, int H, int HS,
                            double eps, double w_offset = 0);
  void qk_norm_rope_pair(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k, Stat* k_rstd,
                         const Act* k_pre, const Weight* k_w, int NKV, const Rope& r, int N, int HS, double eps,
                         double w_offset, const Act* v, Act* store_k, Act* store_v, const int32_t* store_rows);
  void qk_norm_rope_attention(Act* q, Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k, Stat* k_rstd,
                              const Act* k_pre, const Weight* k_w, int NKV, const Rope& r, int N, int HS, double eps,
                              double w_offset, const Act* v, Act* store_k, Act* store_v, const int32_t* store_rows,
                              Act* out, Stat* lse, const Layout& layout, const KV* ext, int n_ext);
  void qk_norm_rope_backward(Act* dx, Param* dw, Act* dout, const Act* x, const Weight* w, const Stat* rstd,
                             const Rope& r, int N, int H, int HS, double w_offset = 0);
  void attention_forward(Act* out, Stat* lse, const Act* q, const Act* k, const Act* v, const Layout& layout,
                         const KV* ext, int n_ext, int N, int NH, int NKV, int HS);
  void attention_backward(Act* dq, Act* dk, Act* dv, const Act* dout, const Act* out, const Stat* lse, const Act* q,
                          const Act* k, const Act* v, const Layout& layout, const KV* ext, int n_ext, int N, int NH,
                          int NKV, int HS);
  void gather_rows(Act* out, const Act* in, const int32_t* rows, int R, int C);
  void scatter_rows(Act* out, const Act* in, const int32_t* rows, int R, int C);
  void copy(Act* dst, const Act* src, int64_t n);
  // dst[rows[r]] += src[r] (R rows of C; rows distinct): relayed gradients into their rows.
  void add_rows(Acc* dst, const int32_t* rows, const Acc* src, int R, int C);
  // dst[dst_rows[i]] += src[src_rows[i]] (i < n; dst_rows distinct): the GPU's bf16 <-> fp32 forms
  // in one (Act = Acc here).
  void add_rows(Acc* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C);
  // Segment retrieval (ops/cpu/retrieval.h): per KV head in `heads`, the R pool rows whose keys
  // score highest against the head's query group; then those rows gathered into a prefix.
  void retrieval_select(int32_t* idx, const Act* q, const Act* pool_k, int P, int NH, int NKV, int HS,
                        uint64_t heads, int R);
  void retrieval_gather(Act* out, const Act* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads);
  void cross_entropy(double* loss, Stat* lse, Act* dlogits, const Act* logits, const Targets& tgt, int row_begin,
                     int rows, int V, double dloss);
  void sample_rows(int32_t* token, double* logprob, const Act* logits, int R, int V, double temperature,
                   const uint64_t* keys);
  // Gated attention (ops/cpu/gated_attention.h): per-head split and merge, y = x sigmoid(gate).
  void split_heads(Act* a, Act* b, const Act* ab, int N, int H, int D);
  void merge_heads(Act* ab, const Act* a, const Act* b, int N, int H, int D);
  void sigmoid_gate_forward(Act* y, const Act* x, const Act* gate, int64_t n);
  void sigmoid_gate_backward(Act* dx, Act* dgate, const Act* dy, const Act* x, const Act* gate, int64_t n);
  // Gated DeltaNet (ops/cpu/gdn.h; dx-style outputs +=, as there, except gdn_gates_backward's da, db).
  void path_prev(int32_t* prev, const Layout& layout, int N);
  void conv1d_silu_forward(Act* out, const Act* x, const Weight* w, const int32_t* prev, int N, int C, int K);
  // (layout: the batch's, for backends that walk descendants through it; N may exceed its rows
  // here, a carried conv's extended rows, which prev links.)
  void conv1d_silu_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w, const int32_t* prev,
                            const Layout& layout, int N, int C, int K);
  // out (N, cols) = in[:, col0 : col0 + cols] of in (N, in_cols); add_cols adds back the other way.
  void copy_cols(Act* out, const Act* in, int N, int in_cols, int col0, int cols);
  void add_cols(Act* out, const Act* in, int N, int out_cols, int col0, int cols);
  // dst[:, dst_col0 : dst_col0 + cols] = src[:, src_col0 : src_col0 + cols] (rows of dst_cols and
  // src_cols elements): Qwen3-Next's grouped projections to and from the flat layout.
  void move_cols(Act* dst, int dst_cols, int dst_col0, const Act* src, int src_cols, int src_col0, int N, int cols);
  void l2norm_forward(Act* y, Stat* rstd, const Act* x, int rows, int D, double eps);
  void l2norm_backward(Act* dx, const Act* dy, const Act* x, const Stat* rstd, int rows, int D);
  void gated_rmsnorm_forward(Act* y, Stat* rstd, const Act* x, const Act* z, const Weight* w, int rows, int D,
                             double eps);
  void gated_rmsnorm_backward(Act* dx, Act* dz, Param* dw, const Act* dy, const Act* x, const Act* z, const Weight* w,
                              const Stat* rstd, int rows, int D);
  // g (the log decay), dg and dbeta are Acc: fp32 on the GPU, as transformers computes g.
  void gdn_gates_forward(Acc* g, Act* beta, const Act* a, const Act* b, const Weight* A_log, const Weight* dt_bias,
                         int N, int H);
  void gdn_gates_backward(Act* da, Act* db, Param* dA_log, Param* ddt_bias, const Acc* dg, const Acc* dbeta,
                          const Act* a, const Act* b, const Weight* A_log, const Weight* dt_bias, int N, int H);
  // init (num_roots, nv, dk, dv) or null (zeros); end (num_nodes, nv, dk, dv) or null.
  void gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                   const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale,
                   const double* init = nullptr, double* end = nullptr);
  // d_init (num_roots, nv, dk, dv) += when not null; d_end (num_nodes, nv, dk, dv) or null: the
  // gradient arriving at each node's end state from outside the batch.
  void gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q, const Act* k,
                    const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N, int nk, int nv,
                    int k_dim, int v_dim, double scale, const double* init = nullptr, double* d_init = nullptr,
                    const double* d_end = nullptr);
  // The vision tower (ops/cpu/vision.h; dx-style outputs and bias gradients +=, as there).
  void layernorm_forward(Act* out, Stat* mean, Stat* rstd, const Act* x, const Weight* w, const Weight* b, int rows,
                         int C, double eps);
  void layernorm_backward(Act* dx, Param* dw, Param* db, const Act* dout, const Act* x, const Weight* w,
                          const Stat* mean, const Stat* rstd, int rows, int C);
  // GELU, tanh (HF gelu_pytorch_tanh) or exact (HF gelu).
  void gelu_forward(Act* y, const Act* x, int64_t n, bool tanh);
  void gelu_backward(Act* dx, const Act* dy, const Act* x, int64_t n, bool tanh);
  void bias_add(Act* out, const Weight* b, int rows, int C);
  void bias_backward(Param* db, const Act* dout, int rows, int C);
  void copy_rows(Act* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C);
  // dst[d] = sum of src[src_rows[k]], k in [offsets[d], offsets[d + 1]) (ops/cpu/vision.h).
  void sum_rows(Act* dst, const Act* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C);
  void zero_rows(Act* dst, const int32_t* rows, int n, int C);
  // patches (F P, 3 p p) of F frames' pixels (F, 3, S, S).
  void patchify(Act* patches, const float* pixels, int F, int S, int patch);
  // Profiling scopes are a GPU notion; here they do nothing.
  void begin_head() {}
  void end_head() {}
  void begin_vision() {}
  void end_vision() {}
  void profile_gap() {}
};

}  // namespace tt::model
