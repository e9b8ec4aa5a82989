// The compute backend the trainer drives: one model's parameters, gradients and AdamW state.
//
// The trainer is written against this interface only; make_backend() is the one place where the
// config's `device` picks an implementation: "cpu" (the reference, Model<float> with fp32 master
// weights and fp32 m/v) or "cuda" (model::CudaModel: fp32 master weights, gradients and m/v on the
// device, a bf16 working copy of the weights, AdamW and the gradient norm on the device). Both
// keep parameters, gradients and optimizer state in the flat layout of model::param_table
// (ParamInfo::offset / numel), so checkpoints read and write them the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "data/packing.h"
#include "data/partition.h"
#include "model/segments.h"
#include "data/tree.h"
#include "model/config.h"
#include "model/param_table.h"
#include "ops/cuda/gemm_tuned.h"

namespace tt::trainer {

struct OptimStep {
  double lr = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0;  // applied only to parameters with ParamInfo::decay
  int64_t step = 1;         // 1-based, for bias correction
  double grad_scale = 1;    // multiplies the gradient first (clipping folds in here)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const std::vector<model::ParamInfo>& params_info() const = 0;
  virtual int64_t num_params() const = 0;

  virtual void init(uint64_t seed) = 0;                      // fresh weights; m = v = 0
  virtual void load_hf(const std::string& dir) = 0;          // HF layout weights; m = v = 0
  virtual void save_hf(const std::string& dir) const = 0;    // HF layout, F32

  virtual void zero_grad() = 0;
  // forward(batch, loss_scale) and its backward; grads += d(loss)/d(params). Returns the loss.
  virtual double forward_backward(const data::PackedBatch& batch, double loss_scale) = 0;
  // Parameters [begin, end) of params_info() whose gradients a forward_backward_notify call has
  // finished writing.
  using GradReady = std::function<void(int begin, int end)>;
  // forward_backward that reports, while backward is being issued, each parameter whose gradient
  // this call will not write again: ready(begin, end), every parameter exactly once per call. Data
  // parallelism starts a gradient bucket's all-reduce from here, overlapping it with the rest of
  // backward (distributed/buckets.h). On a device backend "written" means enqueued on
  // compute_stream(): work ordered after it there sees the final values. The default runs
  // forward_backward and then reports every parameter (no overlap).
  virtual double forward_backward_notify(const data::PackedBatch& batch, double loss_scale, const GradReady& ready);
  // forward_backward_notify without waiting for its loss: the host goes on to the next
  // micro-batch while the device runs this one (a loss read would wait for its backward).
  // pending_losses() waits once and returns the enqueued calls' losses in call order; nll_sum()
  // counts every call's NLL sum in call order once they are read (so it needs pending_losses()
  // first); zero_grad() drops unread ones.
  virtual void enqueue_forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) = 0;
  virtual std::vector<double> pending_losses() = 0;
  // The same for one tree run piece by piece: `split` is data::split_long_nodes(tree, C) and
  // `plan` data::plan_partition(split, C) (model/partitioned.h). Equals forward_backward of the
  // tree's own batch: grads += d(loss)/d(params); returns loss_scale * sum w * ce.
  // recompute: partition.recompute (non-leaf pieces keep only their K/V rows and run their forward
  // again before their backward). load_frames fills a piece's pixels (episode trees; called only
  // for a piece with frames).
  virtual double forward_backward_partitioned(const data::Tree& split, const data::Partition& plan,
                                              double loss_scale, bool recompute,
                                              const std::function<void(data::PackedBatch&)>& load_frames) = 0;
  // The same for one tree run segment by segment (model/segments.h; plan: data::plan_segments):
  // grads += the gradient of loss_scale * L_K (truncated BPTT); returns loss_scale * sum w * ce.
  // load_frames as above (a segment piece with frames). Both backends
  // (tests/model_cuda/segments_cuda_test.cc on the GPU).
  virtual double forward_backward_segmented(const data::SegmentPlan& plan, const model::SegmentConfig& cfg,
                                            double loss_scale,
                                            const std::function<void(data::PackedBatch&)>& load_frames = {}) = 0;
  virtual double grad_sum_squares() const = 0;  // over every gradient, fp64 accumulation
  // The unweighted NLL sum (sum_t cnt_t ce_t, model::Losses) of the forward_backward calls since
  // zero_grad(): divided by the step's flattened targets, the mean token NLL.
  virtual double nll_sum() const = 0;
  // Partition pieces that ran with only their K/V rows kept (partition.recompute), since the
  // backend was made.
  virtual int64_t pieces_recomputed() const = 0;
  // Returns false when the update left a parameter or AdamW moment non-finite (detected in the
  // update's own pass on the GPU; a scan on the CPU).
  virtual bool adamw_step(const OptimStep& p) = 0;
  // The first tensor (table order) holding a non-finite value among the parameters, their
  // gradients or their AdamW moments (as asked), "<name> (<what>)", or "" when all are finite.
  // A reduction per tensor on the backend (the sum of squares is finite exactly when every value is,
  // since |x| < 2^128 keeps sums of squares far inside fp64).
  virtual std::string first_nonfinite(bool params, bool grads, bool optim) = 0;

  // Host copies in the flat layout, for checkpoints and tests.
  virtual std::vector<float> params_host() const = 0;
  virtual std::vector<float> grads_host() const = 0;
  // m's (second: v's) n values from `offset` of the flat layout into dst (a checkpoint writes them
  // a piece at a time: no host copy of the whole state); the whole state, as vectors, for tests.
  virtual void optim_slice_host(bool second, int64_t offset, int64_t n, float* dst) const = 0;
  void optim_state_host(std::vector<float>* m, std::vector<float>* v) const {
    m->resize((size_t)num_params());
    v->resize((size_t)num_params());
    optim_slice_host(false, 0, num_params(), m->data());
    optim_slice_host(true, 0, num_params(), v->data());
  }
  // AdamW's m and v for the n parameters from `offset` of the flat layout (a checkpoint loads them a
  // tensor at a time: no host copy of the whole state); the whole state, as vectors, for tests.
  virtual void set_optim_slice(int64_t offset, const float* m, const float* v, int64_t n) = 0;
  void set_optim_state(const std::vector<float>& m, const std::vector<float>& v) {
    TT_CHECK((int64_t)m.size() == num_params() && (int64_t)v.size() == num_params(), "optimizer state has ", m.size(),
             "/", v.size(), " values, the model ", num_params(), " parameters");
    set_optim_slice(0, m.data(), v.data(), num_params());
  }

  // cudaMalloc calls so far (0 on the CPU): once the largest batch has run, training steps must
  // not change it (the caching allocator serves every buffer).
  virtual int64_t device_malloc_count() const { return 0; }
  // Peak device bytes in use since the last call (the step's peak), then resets it; 0 on the CPU.
  virtual int64_t take_device_peak_bytes() { return 0; }

  // Data parallelism (distributed/): the flat gradient buffer, (num_params) floats, that the
  // trainer sums over ranks, bucket by bucket, as the step's last backward reports them final
  // (forward_backward_notify) and after it. Device memory ordered on
  // compute_stream() (a cudaStream_t) when grads_on_device(), else host memory; nullptr when the
  // backend cannot train data-parallel.
  virtual float* grads_data() { return nullptr; }
  virtual bool grads_on_device() const { return false; }
  virtual void* compute_stream() const { return nullptr; }
  virtual int device() const { return -1; }  // the CUDA device the backend lives on; -1: the CPU
  // The most external KV prefixes one training attention call reads (a partition piece's gateway
  // ranges): the CUDA kernels' cuda::kMaxExternalKV, unbounded on the CPU.
  virtual int64_t max_external_kv() const { return INT64_MAX; }
  // Memory a partitioned tree holds besides the training state (model::estimate_training_memory):
  // the activations of `activation_tokens` resident at once, plus `kept_tokens` whose K/V rows
  // and their gradient accumulators alone are kept (partition.recompute). 0 where unknown.
  virtual int64_t partition_resident_bytes(int64_t activation_tokens, int64_t kept_tokens) const {
    (void)activation_tokens, (void)kept_tokens;
    return 0;
  }
  // Memory free for it now (the GPU's free memory, or the host's available memory); -1: unknown.
  virtual int64_t free_memory_bytes() const { return -1; }

  // GEMM autotuning (the CUDA backend with train.gemm_autotune; trainer/gemm_tuning.h): the
  // signature of the library and GPU its table is for ("" when the backend tunes nothing), the
  // table, replacing it, and the totals so far (shape buckets timed, plans that took a table
  // entry, seconds spent timing).
  struct GemmTuneTotals {
    int64_t tuned = 0, reused = 0;
    double tune_s = 0;
  };
  // Winners the backend timed (or took from a hint) since the last call, not yet adopted: the
  // GEMMs run the heuristic's choice until set_gemm_tuning adopts them (cuda::GemmHandle).
  virtual std::string gemm_tuning_signature() const { return ""; }
  virtual std::vector<cuda::GemmTuned> gemm_tuning() const { return {}; }
  virtual void set_gemm_tuning(const std::vector<cuda::GemmTuned>& table) { (void)table; }
  virtual void set_gemm_hints(const std::vector<cuda::GemmTuned>& hints) { (void)hints; }
  virtual std::vector<cuda::GemmTuned> take_gemm_pending() { return {}; }
  virtual GemmTuneTotals gemm_tune_totals() const { return {}; }
};

// What a partitioned tree holds at once, against the memory free for it (Backend::
// partition_resident_bytes, free_memory_bytes): "" when it fits or `free_bytes` is unknown (< 0),
// else the error's text (after "<where>: data.path <path>: "), naming the tree, the bytes, and
// what helps: partition.recompute (whose bytes `need_recompute` gives) or, with it on already, a
// smaller partition.capacity_tokens.
std::string partition_memory_problem(const std::string& tree_id, int64_t n_tree, const data::Partition& plan,
                                     bool recompute, int64_t need, int64_t need_recompute, int64_t free_bytes,
                                     const std::string& free_what);

// device: "auto" | "cpu" | "cuda". "auto" takes cuda when a CUDA device of compute capability
// 9.0 (the kernels are sm_90a) is visible and the model runs there (CudaExec::check_model: head_dim
// 64, 128 or 256, linear-attention head dims the delta rule's kernels take), else cpu, and logs which. Throws tt::Error for "cuda" without a visible device or on another GPU,
// naming the config key, or for a model the CUDA backend cannot run.
// One process per GPU (data parallelism): the CUDA backend makes GPU
// distributed::pick_device(local_rank, local_world_size, visible) the calling thread's current
// device before it allocates anything (NCCL is then set up on the same device, Backend::device());
// a local rank without a GPU of its own is an error (pick_device). One process: GPU 0.
// cuda: the CUDA backend's options (model::CudaExecOptions: cuBLASLt autotuning, train.gemm_autotune;
// the delta rule's products, train.gdn_products); the CPU ignores them (it computes exactly).
// max_tokens > 0 (the trainer's data.max_tokens_per_batch): before allocating, the memory the
// backend will need (weights, gradients, AdamW state, the activations of such a micro-batch:
// model::estimate_training_memory) is compared with what the host (MemAvailable) or the GPU
// (cudaMemGetInfo) has free, and a tt::Error naming the keys says when it cannot fit.
std::unique_ptr<Backend> make_backend(const std::string& device, const model::ModelConfig& cfg, int local_rank = 0,
                                      int local_world_size = 1, const model::CudaExecOptions& cuda = {},
                                      int64_t max_tokens = 0);

// The device choice of make_backend alone: the GPU it made current for "cuda" (or "auto" picking
// one), or -1 for the CPU; the same errors and logs.
int resolve_device(const std::string& device, const model::ModelConfig& cfg, int local_rank = 0,
                   int local_world_size = 1);

}  // namespace tt::trainer
