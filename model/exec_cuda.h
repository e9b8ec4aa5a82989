// The CUDA execution backend of the decoder: the op vocabulary of model/exec.h on the kernels of
// ops/cuda, on one stream.
//
// Precision: bf16 activations and weight copy (the GEMM operands), fp32 statistics (rstd, lse),
// fp32 master weights and gradients. GEMMs run through cuBLASLt with fp32 accumulation; where a
// GEMM result is added to something (residual adds, the sum of the q/k/v or gate/up input
// gradients) it is written in fp32 (Acc) and rounded to bf16 once after the sum.
//
// Memory: one caching allocator (ops/cuda/memory.h) serves every buffer, so once the largest batch
// has been seen a step calls no cudaMalloc; one op workspace, grown to the largest request (the
// ops on the stream run one at a time, so one region serves them all). Everything is enqueued on
// the exec's stream; nothing here waits for the GPU except read() and sync().
//
// Profile (options.profile): every op records which class it belongs to (GEMM, attention, LM head,
// norm, other), an event marking each change of class; take_profile() turns the events into GPU
// time per class. The LM head's ops (between begin_head() and end_head()) all count as head.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/exec.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/attention_decode.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/gdn.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/memory.h"
#include "ops/cuda/tree_tiles.h"

namespace tt::model {

struct CudaExecOptions {
  // Record an event at every change of op class (take_profile()).
  bool profile = false;
  // cuBLASLt autotuning of every new GEMM shape (cuda::GemmHandle::set_autotune; off: the
  // heuristic's first algorithm, the same every run).
  bool gemm_autotune = false;
  // How the Gated DeltaNet layers' delta-rule walks multiply (ops/cuda/gdn.h GdnProducts).
  cuda::GdnProducts gdn_products = cuda::GdnProducts::kExact;
};

// Time per op class in milliseconds. The classes partition the decoder's calls.
struct CudaOpTimes {
  double gemm_ms = 0;       // the layers' projections, forward and backward (cuBLASLt)
  double attention_ms = 0;  // tree attention forward and backward
  double head_ms = 0;       // LM head: row gather/scatter, logits GEMM, fused loss, dW and dX GEMMs
  double norm_ms = 0;       // rmsnorm (also q/k norm), RoPE, SwiGLU, forward and backward
  double other_ms = 0;      // metadata upload, tiles, embedding, residual adds, conversions, memsets
  double vision_ms = 0;     // the VLA media stage: tower, projector, state projection, row moves
  double total_ms() const { return gemm_ms + attention_ms + head_ms + norm_ms + other_ms + vision_ms; }
};

// Since the last take_profile(): the stream's (GPU) time per op class (the fields it inherits) and
// the host's, from an op's call to the next op's (its launches, and what the decoder computes on
// the host before the next op; host time after a forward's last op is not counted).
struct CudaProfile : CudaOpTimes {
  CudaOpTimes host;
};

class CudaExec {
 public:
  using Act = cuda::bf16;
  using Stat = float;
  using Acc = float;
  using Param = float;
  using Weight = cuda::bf16;
  using KV = cuda::ExternalKV;
  // The attention's view of a batch: the tree tiles, and whether every row is its own one-token
  // tree (a decode step), which the decode kernels serve (ops/cuda/attention_decode.h).
  // For recurrent layers (plan_recurrent): the node arrays, depths and subtree ends on the device
  // (the row ops' path walks) and the delta rule's chunk plan.
  struct Layout {
    cuda::TreeTiles tiles;
    bool singletons = false;
    int num_nodes = 0;
    const int32_t *node_start = nullptr, *node_len = nullptr, *node_parent = nullptr;
    const int32_t *pos = nullptr, *subtree_end = nullptr;
    std::vector<int32_t> host_start, host_len, host_parent;  // the node arrays' host copies
    cuda::GdnPlan gdn;
  };
  using Buffer = cuda::DeviceBuffer<char>;
  struct Rope {
    const int32_t* pos = nullptr;  // (N) device
    double theta = 0;
    const float2* table = nullptr;  // (N, HS/2) cos/sin (cuda::rope_table), when the fused q/k op takes HS
    int rotary_dim = 0;  // RoPE on the first rotary_dim dims of a head (0: all; Qwen3.5's partial RoPE)
  };
  using Targets = cuda::CeTargets;  // src indexes the batch's head rows

  using Options = CudaExecOptions;
  static constexpr const char* kName = "cuda";
  static constexpr bool kSeparateWeights = true;
  static constexpr bool kBackwardConsumesSaved = true;
  static constexpr bool kHeadGradInForward = true;
  static constexpr int kMaxExternalKV = cuda::kMaxExternalKV;
  // External prefixes one attention call may read: the tree kernels' limit, none for a decode
  // batch (every row its own one-token tree).
  static int max_external_kv(bool singletons) { return singletons ? INT_MAX : kMaxExternalKV; }
  static constexpr int64_t kDefaultHeadChunkBytes = int64_t(1) << 30;  // of bf16 logits per chunk
  static constexpr bool kVisionOps = true;  // the tower's ops below (ops/cuda/vision.h)
  // The Qwen3.5 ops (exec_cpu.h): Gated DeltaNet, gated attention, zero-centred norms, partial RoPE.
  static constexpr bool kHybridOps = true;
  // A recurrent layer's carried state (partition gateways, segment tails, the inference cache)
  // lives in host memory on the CPU backend only so far: such carries are an error here.
  static constexpr bool kHostRecurrent = false;

  // Creates the stream, the allocator and the GEMM handle on the current device. Throws
  // tt::Error when no CUDA device is usable.
  explicit CudaExec(const CudaExecOptions& options = {});
  ~CudaExec();
  CudaExec(const CudaExec&) = delete;
  CudaExec& operator=(const CudaExec&) = delete;

  // Throws tt::Error naming the key for a config the kernels cannot run (head_dim other than 64
  // or 128 in the decoder or the vision tower; linear_attention head shapes the delta rule's
  // kernels do not take; a conv kernel wider than 64).
  static void check_model(const ModelConfig& cfg);

  cudaStream_t stream() const { return stream_; }
  cuda::DeviceAllocator& allocator() { return *alloc_; }
  const cuda::DeviceAllocator& allocator() const { return *alloc_; }
  cuda::GemmHandle& gemm() { return *gemm_; }

  // Memory.
  void ensure(Buffer& b, size_t bytes);
  void upload(void* dst, const void* src, size_t bytes);  // pageable host source: staged on return
  void download(void* dst, const void* src, size_t bytes) const;  // waits
  void zero(void* p, size_t bytes);
  void sync() const;
  double read(const double* p) const;  // waits
  // Pipelined downloads (Decoder::infer_enqueue): download_async enqueues a copy into page-locked
  // host memory (a PinnedBuffer's) and returns; record(f) marks the stream's position in f and
  // wait(f) blocks until the stream has passed it, so the copies enqueued before record(f) are on
  // the host. The host prepares and launches the next forward meanwhile.
  class PinnedBuffer {
   public:
    PinnedBuffer() = default;
    ~PinnedBuffer();
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    char* data() { return p_; }
    size_t size() const { return n_; }

   private:
    friend class CudaExec;
    char* p_ = nullptr;
    size_t n_ = 0;
  };
  class Fence {
   public:
    Fence() = default;
    ~Fence();
    Fence(const Fence&) = delete;
    Fence& operator=(const Fence&) = delete;

   private:
    friend class CudaExec;
    cudaEvent_t e_ = nullptr;
  };
  void ensure_pinned(PinnedBuffer& b, size_t bytes);  // contents are not kept when it grows
  void download_async(void* dst, const void* src, size_t bytes);
  void record(Fence& f);
  void wait(const Fence& f) const;
  static double to_double(Act x) { return cuda::host_bf16_to_float(x); }

  // Batch preparation.
  static size_t layout_bytes(int N) { return cuda::tree_tiles_bytes(N); }
  // singletons: every row is its own one-token tree (the caller knows it from the host batch);
  // key_lo (device, (N): the first token of each key's node) the bidirectional mode
  // (ops/cuda/tree_tiles.h). storage: layout_bytes(N) device bytes.
  Layout make_layout(int N, int num_nodes, const int32_t* node_start, const int32_t* node_len,
                     const int32_t* node_parent, const int32_t* subtree_end, bool singletons, char* storage,
                     const int32_t* key_lo = nullptr);
  // The recurrent layers' view of a batch (host node arrays for the chunk plan, device ones for
  // the row ops), into layout l; storage: recurrent_plan_bytes(N, num_nodes) device bytes.
  static size_t recurrent_plan_bytes(int N, int num_nodes) { return cuda::GdnPlan::max_table_bytes(N, num_nodes); }
  void plan_recurrent(Layout& l, int N, int num_nodes, const int32_t* host_start, const int32_t* host_len,
                      const int32_t* host_parent, const int32_t* node_start, const int32_t* node_len,
                      const int32_t* node_parent, const int32_t* pos, const int32_t* subtree_end, char* storage);
  static size_t rope_bytes(int N, int HS);
  Rope make_rope(const int32_t* pos, int N, int HS, double theta, char* storage);

  // Parameters.
  void init_normal(Param* w, int64_t n, uint64_t seed, double stddev);
  void fill(Param* w, int64_t n, float value);
  void to_weights(Weight* out, const Param* in, int64_t n);  // round to the bf16 copy
  // out (n) on the device = the host values rounded to bf16 (an inference model's weights).
  void upload_weights(Weight* out, const float* host, int64_t n);
  // host (n) = the device bf16 values widened.
  void download_weights(float* host, const Weight* in, int64_t n) const;
  double sum_squares(const Param* x, int64_t n);              // fp64 on the device; waits

  // The op vocabulary (model/exec.h).
  void embedding_forward(Act* out, const int32_t* tokens, const Weight* wte, int N, int C, int V);
  void embedding_backward(Param* dwte, const Act* dout, const int32_t* tokens, int N, int C, int V);
  // w_offset: the scale is w + w_offset (1: Qwen3.5's zero-centred norm weights).
  void rmsnorm_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, int rows, int C, double eps,
                       double w_offset = 0);
  void rmsnorm_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w, const Stat* rstd,
                        int rows, int C, bool accumulate_dx, double w_offset = 0);
  void rmsnorm_backward(Act* dx, Param* dw, const Acc* dout, const Act* x, const Weight* w, const Stat* rstd,
                        int rows, int C, bool accumulate_dx, double w_offset = 0);
  void linear(Act* out, const Act* x, const Weight* w, int N, int IC, int OC);
  void linear(Acc* out, const Act* x, const Weight* w, int N, int IC, int OC);
  void linear_dx(Act* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate);
  void linear_dx(Acc* dx, const Act* dout, const Weight* w, int N, int IC, int OC, bool accumulate);
  void linear_dw(Param* dw, const Act* dout, const Act* x, int N, int IC, int OC);
  void residual_add(Act* out, const Act* x, const Acc* y, int64_t n);
  void add_inplace(Act* y, const Acc* x, int64_t n);
  void swiglu_forward(Act* h, const Act* gate, const Act* up, int64_t n);
  // The fused forms (exec.h): one kernel (ops/cuda/gemv.h) for up to cuda::kGemvMaxRows rows, the
  // separate ops otherwise.
  void norm_linear(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps, double w_offset,
                   const LinearOut<Act, Weight>* outs, int n_outs);
  void norm_linear_swiglu(Act* n, Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                          double w_offset, Act* gate, Act* up, Act* h, const Weight* wg, const Weight* wu, int I);
  void linear_residual(Act* out, const Act* res, const Act* x, const Weight* w, int N, int IC, int OC, Acc* sum);
  void swiglu_backward(Act* dgate, Act* dup, const Act* dh, const Act* gate, const Act* up, int64_t n);
  void rope_forward(Act* x, const Rope& r, int N, int H, int HS);
  void rope_backward(Act* dx, const Rope& r, int N, int H, int HS);
  // On fp32 rows (a segment's tail-key gradients, rotated back before they reach their rows).
  void rope_backward(Acc* dx, const Rope& r, int N, int H, int HS);
  void qk_norm_rope_forward(Act* out, Stat* rstd, const Act* x, const Weight* w, const Rope& r, int N, int H, int HS,
                            double eps, double w_offset = 0);
  // Both qk_norm_rope_forward calls of an attention layer in one launch, and with store_k the
  // cache stores of k and v (scatter_rows of each) in the same kernel (fused RoPE only).
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
  void copy(Acc* dst, const Acc* src, int64_t n);
  // dst[rows[r]] += src[r] (R rows of C; rows distinct): relayed gradients into their rows.
  void add_rows(Acc* dst, const int32_t* rows, const Acc* src, int R, int C);
  // dst[dst_rows[i]] += src[src_rows[i]] (i < n) in fp32, between bf16 rows and fp32 accumulators
  // (a recurrent layer's relayed conv-context gradients).
  void add_rows(Act* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C);
  void add_rows(Acc* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C);
  void add_rows(Acc* dst, const int32_t* dst_rows, const Acc* src, const int32_t* src_rows, int n, int C);
  // dst[:, dst_col0 : dst_col0 + cols] = src[:, src_col0 : src_col0 + cols] for N rows of dst_cols
  // and src_cols elements (one strided copy; the retrieval pool keeps the long-range heads' columns).
  void move_cols(Act* dst, int dst_cols, int dst_col0, const Act* src, int src_cols, int src_col0, int N, int cols);
  // Qwen3.5's ops (CPU meaning in exec_cpu.h; kernels in ops/cuda/gated_attention.h, gdn.h, the
  // same accumulation contract). gdn_forward / gdn_backward read the layout's chunk plan
  // (plan_recurrent); their host-memory init / end states (the CPU backend's carries) must be null.
  void split_heads(Act* a, Act* b, const Act* ab, int N, int H, int D);
  void merge_heads(Act* ab, const Act* a, const Act* b, int N, int H, int D);
  void sigmoid_gate_forward(Act* y, const Act* x, const Act* gate, int64_t n);
  void sigmoid_gate_backward(Act* dx, Act* dgate, const Act* dy, const Act* x, const Act* gate, int64_t n);
  void path_prev(int32_t* prev, const Layout& layout, int N);
  void conv1d_silu_forward(Act* out, const Act* x, const Weight* w, const int32_t* prev, int N, int C, int K);
  void conv1d_silu_backward(Act* dx, Param* dw, const Act* dout, const Act* x, const Weight* w, const int32_t* prev,
                            const Layout& layout, int N, int C, int K);
  // Over rows of the caller's own DFS layout (device prev, depths, subtree ends): a carried
  // conv's context rows placed before their roots (model/gdn.h); dx in fp32, +=.
  void conv1d_silu_backward(Acc* dx, Param* dw, const Act* dout, const Act* x, const Weight* w, const int32_t* prev,
                            const int32_t* pos, const int32_t* subtree_end, int N, int C, int K);
  void copy_cols(Act* out, const Act* in, int N, int in_cols, int col0, int cols);
  void add_cols(Act* out, const Act* in, int N, int out_cols, int col0, int cols);
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
  void gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                   const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale,
                   const double* init = nullptr, double* end = nullptr);
  // With device states: init (num_roots, nv, dk, dv) fp32 or null, end (num_nodes, ...) or null
  // (the inference cache's recurrent states; model/gdn.h).
  void gdn_forward(Act* o, const Act* q, const Act* k, const Act* v, const Acc* g, const Act* beta,
                   const Layout& layout, int N, int nk, int nv, int dk, int dv, double scale, const float* init,
                   float* end);
  void gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q, const Act* k,
                    const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N, int nk, int nv,
                    int k_dim, int v_dim, double scale, const double* init = nullptr, double* d_init = nullptr,
                    const double* d_end = nullptr);
  // With device states: init (num_roots, ...) fp32 or null, d_init += or null, d_end (num_nodes,
  // ...) or null (a partition piece's relayed state gradients).
  void gdn_backward(Act* dq, Act* dk, Act* dv, Acc* dg, Acc* dbeta, const Act* d_o, const Act* q, const Act* k,
                    const Act* v, const Acc* g, const Act* beta, const Layout& layout, int N, int nk, int nv,
                    int k_dim, int v_dim, double scale, const float* init, float* d_init, const float* d_end);
  // Segment retrieval (ops/cuda/retrieval.h; CPU meaning in exec_cpu.h): fp32 scores, so near-ties
  // may order differently from the fp64 reference.
  void retrieval_select(int32_t* idx, const Act* q, const Act* pool_k, int P, int NH, int NKV, int HS,
                        uint64_t heads, int R);
  void retrieval_gather(Act* out, const Act* pool, const int32_t* idx, int R, int NKV, int HS, uint64_t heads);
  // The vision tower's ops (model/vision.h; CPU meaning in exec_cpu.h and ops/cpu/vision.h):
  // LayerNorm, GELU (tanh or erf), Linear biases, row moves between the tower's and the decoder's
  // rows, patchify. dx, dw, db accumulate (+=) as on the CPU.
  void layernorm_forward(Act* out, Stat* mean, Stat* rstd, const Act* x, const Weight* w, const Weight* b, int rows,
                         int C, double eps);
  void layernorm_backward(Act* dx, Param* dw, Param* db, const Act* dout, const Act* x, const Weight* w,
                          const Stat* mean, const Stat* rstd, int rows, int C);
  void gelu_forward(Act* y, const Act* x, int64_t n, bool tanh);
  void gelu_backward(Act* dx, const Act* dy, const Act* x, int64_t n, bool tanh);
  void bias_add(Act* out, const Weight* b, int rows, int C);
  void bias_add(Acc* out, const Weight* b, int rows, int C);
  void bias_backward(Param* db, const Act* dout, int rows, int C);
  void copy_rows(Act* dst, const int32_t* dst_rows, const Act* src, const int32_t* src_rows, int n, int C);
  void sum_rows(Act* dst, const Act* src, const int32_t* offsets, const int32_t* src_rows, int n_dst, int C);
  void zero_rows(Act* dst, const int32_t* rows, int n, int C);
  void patchify(Act* patches, const float* pixels, int F, int S, int patch);
  void cross_entropy(double* loss, Stat* lse, Act* dlogits, const Act* logits, const Targets& tgt, int row_begin,
                     int rows, int V, double dloss);
  void sample_rows(int32_t* token, double* logprob, const Act* logits, int R, int V, double temperature,
                   const uint64_t* keys);
  void begin_head();
  void end_head();
  // The ops between them are the media stage's (profile class vision).
  void begin_vision();
  void end_vision();
  // The stream time from here to the next op is not counted in the profile (host gaps between
  // the decoder's calls).
  void profile_gap() { mark(Op::kNone); }

  // GPU time per op class since the last call (zeros unless options.profile); waits.
  CudaProfile take_profile();

 private:
  enum class Op { kGemm, kAttention, kHead, kNorm, kOther, kVision, kNone };
  // The ops enqueued from here to the next change belong to class `op` (with options.profile).
  void mark(Op op);
  // The op workspace, grown to at least `bytes` (stream-ordered reuse).
  cuda::Workspace workspace(size_t bytes);
  // decode_plan_ for these arguments (made and uploaded when they differ from the last call's).
  void ensure_decode_plan(const KV* ext, int n_ext, int N, int NH, int NKV, int HS);

  CudaExecOptions options_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::DeviceAllocator> alloc_;  // declared before every buffer it serves
  std::unique_ptr<cuda::GemmHandle> gemm_;
  Buffer workspace_;
  // The decode-mode attention's work tables, built once per decode batch and shared by its layers.
  cuda::AttentionDecodePlan decode_plan_;
  Buffer decode_tables_;
  cuda::DeviceBuffer<double> reduce_;  // (1) sum of squares
  bool in_head_ = false;
  bool in_vision_ = false;
  Op current_ = Op::kNone;
  std::vector<std::pair<cudaEvent_t, Op>> marks_;  // profile marks since take_profile()
  // t (ms) into class op's field (kNone: other).
  static void add_time(CudaOpTimes& t, Op op, double ms);
  Op host_op_ = Op::kNone;                          // the class of the last op called
  std::chrono::steady_clock::time_point host_since_;  // when it was called
  CudaOpTimes host_;                                 // host time per class since take_profile()
  std::vector<cudaEvent_t> spare_events_;
};

}  // namespace tt::model
