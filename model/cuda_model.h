// Llama/Qwen3 decoder on the GPU: the CUDA twin of model/model.h, layer by layer the same math,
// the same parameter table (param_table) and the same explicit backward order.
//
// Precision: fp32 master weights and a bf16 working copy (the GEMM operands), fp32 gradients,
// bf16 activations with fp32 statistics (rstd, lse). GEMMs run through cuBLASLt with fp32
// accumulation; where a GEMM result is added to something (residual adds, the sum of the q/k/v or
// gate/up input gradients) it is written in fp32 and rounded to bf16 once after the sum.
// Parameters, gradients and the bf16 copy are flat device buffers in param_table order, so the
// trainer, the optimizer and checkpoints treat them like the CPU ones.
//
// The LM head and the loss run inside forward(), in chunks of the rows that are the source of a
// target (a row that predicts nothing has no logits gradient and is skipped): for each chunk the
// head GEMM writes bf16 logits (rows, V), the fused cross-entropy turns them into dlogits in
// place, and the head's weight gradient (+=) and the gradient of the final norm output are taken
// right away. So logits for the whole batch never exist and forward() already accumulates the LM
// head's weight gradient: backward() must follow every forward() (training only).
//
// Saved activations (CudaActivations) mirror the CPU Acts list: per layer x_in, n1, rstd1,
// [q_pre, k_pre, q_rstd, k_rstd], q, k, v, att, lse, x_mid, n2, rstd2, gate, up, h; then x_final,
// nf, rstd_f, and the head's output gradient dnf. They live in one device buffer that only grows,
// together with the batch's metadata (tokens, positions, subtree_end, the attention's tile
// metadata, the target list), uploaded once per forward in one copy. Backward's scratch is owned
// by the model and shared by all activations. All device memory of the steady state comes from
// one caching allocator (ops/cuda/memory.h): once the largest batch has been seen, a step calls
// no cudaMalloc. Everything runs on one stream, owned by the model.
//
// External KV prefixes per layer (partition gateways, carried KV tails) and gradients relayed
// into a batch's own K/V work as in model.h (cuda_partitioned.h drives them for a partitioned
// tree). Gradient contract: backward() accumulates (+=) into grads(); forward() accumulates the
// LM head's part.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/packing.h"
#include "model/config.h"
#include "model/model.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/memory.h"
#include "ops/cuda/tree_tiles.h"

namespace tt::model {

// prefixes[l]: the external prefixes layer l's attention reads (device pointers; their dk/dv, when
// set, are accumulated by backward()).
using CudaLayerPrefixes = std::vector<std::vector<cuda::ExternalKV>>;

// Gradients relayed into the batch's own per-layer K/V (after norms and RoPE): dk[l], dv[l] are
// device (N, NKV, HS) bf16 or null.
struct CudaRelayedKVGrads {
  std::vector<const float*> dk;  // [layer] (N, NKV, HS) fp32, or null
  std::vector<const float*> dv;
};

struct CudaModelOptions {
  // Bytes of bf16 logits one LM-head chunk may hold: rows per chunk = max(1, bytes / (2 V)).
  int64_t head_chunk_bytes = int64_t(1) << 30;
  // Record CUDA events around every op class of forward() and backward() (take_profile()).
  bool profile = false;
  // cuBLASLt autotuning of every new GEMM shape (cuda::GemmHandle::set_autotune; off: the
  // heuristic's first algorithm, the same every run).
  bool gemm_autotune = false;
};

// GPU time per op class of the forward()/backward() calls since the last take_profile(), in
// milliseconds (CudaModelOptions::profile). The classes partition the calls' stream time.
struct CudaProfile {
  double gemm_ms = 0;       // the layers' projections, forward and backward (cuBLASLt)
  double attention_ms = 0;  // tree attention forward and backward
  double head_ms = 0;       // LM head: row gather/scatter, logits GEMM, fused loss, dW and dX GEMMs
  double norm_ms = 0;       // rmsnorm (also q/k norm), RoPE, SwiGLU, forward and backward
  double other_ms = 0;      // metadata upload, tiles, embedding, residual adds, conversions, memsets
  double total_ms() const { return gemm_ms + attention_ms + head_ms + norm_ms + other_ms; }
};

class CudaModel;

// Gradient readiness, for overlapping the data-parallel gradient all-reduce with backward
// (distributed/buckets.h): backward() calls it with a half-open range [begin, end) of
// param_table indices as soon as every write of that backward to those parameters' gradients is
// enqueued on stream(), so work enqueued on another stream after an event recorded on stream()
// sees them final for this backward. Order: the final norm (and an untied LM head, whose
// gradient forward() took), then layers L-1 ... 0 (one call each), the input embedding last;
// every parameter exactly once per backward, also for an empty batch. It runs on the calling
// thread between kernel launches: it must only enqueue work, never wait for the GPU.
using GradReadyFn = std::function<void(int begin, int end)>;

// The saved activations and batch metadata of one forward, owned by the caller so several
// forwards can be alive at once (the chain of partition pieces). Reused across forwards: the
// device buffer only grows. Move-only.
class CudaActivations {
 public:
  CudaActivations() = default;
  CudaActivations(CudaActivations&&) = default;
  CudaActivations& operator=(CudaActivations&&) = default;
  int n_tokens() const { return n_; }

 private:
  friend class CudaModel;
  cuda::DeviceBuffer<char> buf_;
  int n_ = 0;
  int n_tgt_ = 0;
  int n_rows_ = 0;  // rows that are the source of a target (LM-head rows)
  bool pending_ = false;  // forward done, backward not yet
  double loss_scale_ = 1.0;
  const CudaLayerPrefixes* prefixes_ = nullptr;
  cuda::TreeTiles tiles_;
};

class CudaModel {
 public:
  // Throws tt::Error when the config cannot run here (head_dim other than 64 or 128, ...) or when
  // no CUDA device is usable.
  explicit CudaModel(const ModelConfig& cfg, const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params_info() const { return info_; }
  int64_t num_params() const { return n_params_; }
  cudaStream_t stream() const { return stream_; }
  cuda::DeviceAllocator& allocator() { return *alloc_; }
  const cuda::DeviceAllocator& allocator() const { return *alloc_; }

  // Device buffers (num_params) in param_table order.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  cuda::bf16* params_bf16() { return params_bf16_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }

  // Model::init on the device: the same draws (splitmix64 per tensor, Box-Muller in fp64), so the
  // weights equal the CPU model's up to the last bit of the fp64 library functions (log, cos,
  // sin), which in rare cases moves the fp32 rounding by one ulp.
  void init(uint64_t seed);
  // Host copies (num_params fp32); set_params also refreshes the bf16 copy.
  void set_params(const float* host);
  std::vector<float> params_host() const;
  std::vector<float> grads_host() const;
  // Rounds the fp32 master weights into the bf16 copy (after changing params() on the device).
  void refresh_bf16();
  void zero_grad();

  // forward + backward of one batch on the model's own activations; grads += d(loss)/d(params).
  // Returns loss_scale * sum_t w_t * ce_t (waits for the stream). on_ready: see GradReadyFn.
  double forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReadyFn& on_ready = nullptr);

  // The pair on caller-owned activations, with per-layer external prefixes (null: none; else one
  // list per layer; they must stay alive until backward) and relayed K/V gradients (null: none).
  // The batch is copied to the device by forward(): it need not outlive the call.
  void forward(const data::PackedBatch& batch, double loss_scale, CudaActivations& acts,
               const CudaLayerPrefixes* prefixes);
  void backward(CudaActivations& acts, const CudaRelayedKVGrads* relayed, const GradReadyFn& on_ready = nullptr);
  // loss_scale * sum_t w_t * ce_t of the last forward on acts (waits for the stream).
  double loss(const CudaActivations& acts) const;
  // Layer l's K and V of the last forward on acts, after norms and RoPE: (N, NKV, HS) device.
  const cuda::bf16* layer_k(const CudaActivations& acts, int l) const;
  const cuda::bf16* layer_v(const CudaActivations& acts, int l) const;

  // Sum of squares of every gradient, fp64 on the device (waits for the stream).
  double grad_sum_squares();

  // The profile since the last call (zeros unless options.profile); waits for the stream.
  CudaProfile take_profile();

 private:
  struct Scratch;
  enum class Op { kGemm, kAttention, kHead, kNorm, kOther, kEnd };
  // With options.profile: the ops enqueued from here to the next mark belong to class `op`.
  void mark(Op op);
  void ensure_scratch(int N);
  void ensure_workspace(size_t bytes);

  ModelConfig cfg_;
  CudaModelOptions options_;
  std::vector<ParamInfo> info_;
  int64_t n_params_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::DeviceAllocator> alloc_;  // declared before every buffer it serves
  std::unique_ptr<cuda::GemmHandle> gemm_;
  cuda::DeviceBuffer<float> params_;
  cuda::DeviceBuffer<cuda::bf16> params_bf16_;
  cuda::DeviceBuffer<float> grads_;
  std::unique_ptr<Scratch> scratch_;
  cuda::DeviceBuffer<char> workspace_;  // op workspaces (one op at a time)
  cuda::DeviceBuffer<double> reduce_;   // (1) sum of squares
  std::vector<char> staging_;           // host image of a batch's metadata
  std::vector<std::pair<cudaEvent_t, Op>> marks_;  // profile marks since take_profile()
  std::vector<cudaEvent_t> spare_events_;
  CudaActivations own_;                 // forward_backward()'s activations
};

}  // namespace tt::model
