// Backends: one class over the decoder on either execution backend (the CPU reference with
// ops/cpu AdamW, the GPU with ops/cuda AdamW) and the device choice.
#include "trainer/backend.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <fstream>
#include <type_traits>
#include <utility>

#include "distributed/env.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/partitioned.h"
#include "base/check.h"
#include "ops/cpu/adamw.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/check.h"
#include "ops/cuda/gemm.h"

namespace tt::trainer {

double Backend::forward_backward_notify(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) {
  const double loss = forward_backward(batch, loss_scale);
  if (ready) ready(0, (int)params_info().size());
  return loss;
}

namespace {

// Host memory the kernel says is available (MemAvailable of /proc/meminfo), or -1 when unknown.
int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

// Memory free on GPU `gpu` (cudaMemGetInfo), or with gpu < 0 the host's available memory.
int64_t free_memory(int gpu) {
  if (gpu < 0) return host_available_bytes();
  size_t free_b = 0, total_b = 0;
  TT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return (int64_t)free_b;
}

std::string gib(double bytes) { return str(std::round(bytes / (1 << 30) * 100) / 100, " GiB"); }

// One backend over a decoder on execution backend E: its fp32 master weights and gradients, fp32
// AdamW moments m and v in the same flat layout (on the CPU; on the GPU's memory for the CUDA
// backend, where AdamW runs over every tensor in one launch and also rewrites the bf16 working
// copy, and the gradient norm is taken in fp64 on the device). Clipping arrives folded into
// OptimStep::grad_scale. HF directories go through a host image of the flat buffer. Data
// parallelism reduces the gradient buffer in place (ordered on the model's stream on the GPU).
template <class E>
class DecoderBackend : public Backend {
 public:
  static constexpr bool kDevice = std::is_same_v<E, model::CudaExec>;

  // gpu: the current device, where the model allocates (-1 on the CPU).
  DecoderBackend(const model::ModelConfig& cfg, const typename E::Options& options, int gpu)
      : model_(cfg, model::DecoderOptions{}, options), gpu_(gpu) {
    E& e = model_.exec();
    const size_t bytes = sizeof(float) * (size_t)model_.num_params();
    e.ensure(m_, bytes);
    e.ensure(v_, bytes);
    e.ensure(flag_, sizeof(int));
    if constexpr (kDevice) {
      std::vector<cuda::AdamWTensor> tensors;
      for (const model::ParamInfo& p : model_.params_info())
        if (p.trainable) tensors.push_back({p.offset, p.numel, p.decay});  // frozen tensors: no update
      chunks_host_ = cuda::adamw_chunks(tensors);
      e.ensure(chunks_, sizeof(cuda::AdamWChunk) * chunks_host_.size());
      e.upload(chunks_.data(), chunks_host_.data(), sizeof(cuda::AdamWChunk) * chunks_host_.size());
    }
    reset_optim();
    e.sync();
  }

  std::string name() const override { return E::kName; }
  const std::vector<model::ParamInfo>& params_info() const override { return model_.params_info(); }
  int64_t num_params() const override { return model_.num_params(); }

  void init(uint64_t seed) override {
    model_.init(seed);
    reset_optim();
  }
  void load_hf(const std::string& dir) override {
    // Into a scratch copy (a failed load leaves the model as it was), the only one on the host.
    std::vector<float> host((size_t)num_params());
    model::load_hf_weights_into(dir, model_.config(), model_.params_info(), host.data());
    model_.set_params(host.data());
    reset_optim();
  }
  void save_hf(const std::string& dir) const override {
    // A piece at a time (no host copy of the whole weights).
    const model::ParamReader slice = [this](int64_t offset, int64_t n, float* dst) {
      model_.params_slice_host(offset, n, dst);
    };
    model::save_hf(dir, model_.config(), model_.params_info(), slice, "F32");
  }

  void zero_grad() override {
    model_.zero_grad();
    nll_ = 0;
    calls_.clear();
    pending_.clear();  // losses of a step that stopped before reading them (an error) are dropped with it
  }
  double forward_backward(const data::PackedBatch& batch, double loss_scale) override {
    return forward_backward_notify(batch, loss_scale, nullptr);
  }
  // Layer by layer as backward is enqueued (model::GradReadyFn), so buckets start early.
  double forward_backward_notify(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) override {
    model_.forward(batch, loss_scale, acts_);
    model_.backward(acts_, nullptr, ready);
    const model::Losses l = model_.losses(acts_);
    add_nll(l.nll_sum);
    return l.loss;
  }
  void enqueue_forward_backward(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) override {
    model_.forward(batch, loss_scale, acts_);
    model_.backward(acts_, nullptr, ready);
    pending_.add(model_, acts_);
    calls_.push_back({true, 0});
  }
  std::vector<double> pending_losses() override {
    const std::vector<model::Losses> got = pending_.take(model_.exec());
    std::vector<double> out;
    size_t k = 0;
    for (Call& c : calls_) {
      if (!c.pending) continue;
      c.nll = got[k].nll_sum;
      out.push_back(got[k].loss);
      ++k;
    }
    for (const Call& c : calls_) nll_ += c.nll;  // in call order
    calls_.clear();
    return out;
  }
  double forward_backward_partitioned(const data::Tree& split, const data::Partition& plan, double loss_scale,
                                      bool recompute,
                                      const std::function<void(data::PackedBatch&)>& load_frames) override {
    model::PartitionRunStats st;
    const double loss =
        model::forward_backward_partitioned(model_, split, plan, loss_scale, &st, recompute, load_frames);
    add_nll(st.nll_sum);
    pieces_recomputed_ += st.pieces_recomputed;
    return loss;
  }
  double forward_backward_segmented(const data::SegmentPlan& plan, const model::SegmentConfig& cfg, double loss_scale,
                                    const std::function<void(data::PackedBatch&)>& load_frames) override {
    model::SegmentRunStats st;
    const double loss = model::forward_backward_segmented(model_, cfg, plan, loss_scale, &st, load_frames);
    add_nll(st.nll_sum);
    return loss;
  }
  double nll_sum() const override {
    TT_CHECK(calls_.empty(), "backend: nll_sum() with ", calls_.size(), " calls' NLL sums not yet read (pending_losses)");
    return nll_;
  }
  int64_t pieces_recomputed() const override { return pieces_recomputed_; }
  double grad_sum_squares() const override { return model_.grad_sum_squares(); }

  bool adamw_step(const OptimStep& p) override {
    if constexpr (kDevice) {
      cuda::AdamWParams ap;
      ap.lr = p.lr;
      ap.beta1 = p.beta1;
      ap.beta2 = p.beta2;
      ap.eps = p.eps;
      ap.weight_decay = p.weight_decay;  // the chunk table applies it to decay tensors only
      ap.step = p.step;
      ap.grad_scale = p.grad_scale;
      int* flag = reinterpret_cast<int*>(flag_.data());
      model_.exec().zero(flag, sizeof(int));
      cuda::adamw_update(model_.params(), model_.weights(), model_.grads(), m(), v(),
                         reinterpret_cast<const cuda::AdamWChunk*>(chunks_.data()), (int)chunks_host_.size(), ap,
                         nullptr, model_.exec().stream(), flag);
      // The step ends when its update has (the flag's read waits): step timings and host copies
      // see the new weights.
      int bad = 0;
      model_.exec().download(&bad, flag, sizeof(int));
      return bad == 0;
    } else {
      for (const model::ParamInfo& info : model_.params_info()) {
        if (!info.trainable) continue;  // frozen (vision.freeze, unread tower layers): left as it is
        cpu::AdamWParams ap;
        ap.lr = p.lr;
        ap.beta1 = p.beta1;
        ap.beta2 = p.beta2;
        ap.eps = p.eps;
        ap.weight_decay = info.decay ? p.weight_decay : 0.0;
        ap.step = p.step;
        ap.grad_scale = p.grad_scale;
        const int64_t o = info.offset;
        cpu::adamw_update(model_.params() + o, model_.grads() + o, m() + o, v() + o, info.numel, ap);
      }
      return first_nonfinite(true, false, true).empty();
    }
  }

  std::string first_nonfinite(bool params, bool grads, bool optim) override {
    E& e = model_.exec();
    for (const model::ParamInfo& p : model_.params_info()) {
      const std::pair<bool, const float*> bufs[4] = {{params, model_.params()},
                                                     {grads, model_.grads()},
                                                     {optim, m()},
                                                     {optim, v()}};
      const char* what[4] = {"weights", "gradient", "AdamW m", "AdamW v"};
      for (int k = 0; k < 4; ++k)
        if (bufs[k].first && !std::isfinite(e.sum_squares(bufs[k].second + p.offset, p.numel)))
          return str(p.name, " (", what[k], ")");
    }
    return "";
  }

  std::vector<float> params_host() const override { return model_.params_host(); }
  std::vector<float> grads_host() const override { return model_.grads_host(); }
  void optim_slice_host(bool second, int64_t offset, int64_t n, float* dst) const override {
    check_optim_slice(offset, n);
    const float* src = reinterpret_cast<const float*>((second ? v_ : m_).data()) + offset;
    model_.exec().download(dst, src, sizeof(float) * n);  // waits
  }
  void set_optim_slice(int64_t offset, const float* m_in, const float* v_in, int64_t n) override {
    check_optim_slice(offset, n);
    model_.exec().upload(m() + offset, m_in, sizeof(float) * n);  // pageable sources: staged on return
    model_.exec().upload(v() + offset, v_in, sizeof(float) * n);
    model_.exec().sync();
  }
  int64_t device_malloc_count() const override {
    if constexpr (kDevice) return model_.exec().allocator().stats().num_cuda_malloc;
    return 0;
  }
  int64_t take_device_peak_bytes() override {
    if constexpr (kDevice) {
      const int64_t peak = model_.exec().allocator().stats().peak_bytes_in_use;
      model_.exec().allocator().reset_peak();
      return peak;
    }
    return 0;
  }

  float* grads_data() override { return model_.grads(); }
  bool grads_on_device() const override { return kDevice; }
  void* compute_stream() const override {
    if constexpr (kDevice) return model_.exec().stream();
    return nullptr;
  }
  int device() const override { return gpu_; }
  int64_t max_external_kv() const override { return E::max_external_kv(/*singletons=*/false); }
  int64_t partition_resident_bytes(int64_t activation_tokens, int64_t kept_tokens) const override {
    int64_t row_elems = 0;  // K and V elements a row over all layers
    for (int l = 0; l < model_.architecture().num_layers(); ++l) row_elems += 2 * model_.carry_row_elems(l);
    const int64_t kept = kept_tokens * row_elems * (int64_t)(sizeof(typename E::Act) + sizeof(typename E::Acc));
    return model::estimate_training_memory<E>(model_.config(), activation_tokens).activations + kept;
  }
  int64_t free_memory_bytes() const override {
    if constexpr (kDevice) {  // the allocator's cached blocks are free to the run too
      const cuda::AllocatorStats s = model_.exec().allocator().stats();
      return free_memory(gpu_) + s.bytes_reserved - s.bytes_in_use;
    }
    return free_memory(-1);
  }

  std::string gemm_tuning_signature() const override {
    if constexpr (kDevice)
      if (model_.exec().gemm().autotune()) return cuda::gemm_tuning_signature();
    return "";
  }
  std::vector<cuda::GemmTuned> gemm_tuning() const override {
    if constexpr (kDevice) return model_.exec().gemm().tuned();
    return {};
  }
  void set_gemm_tuning(const std::vector<cuda::GemmTuned>& table) override {
    if constexpr (kDevice) model_.exec().gemm().set_tuned(table);
  }
  void set_gemm_hints(const std::vector<cuda::GemmTuned>& hints) override {
    if constexpr (kDevice) model_.exec().gemm().set_hints(hints);
  }
  std::vector<cuda::GemmTuned> take_gemm_pending() override {
    if constexpr (kDevice) return model_.exec().gemm().take_pending();
    return {};
  }
  GemmTuneTotals gemm_tune_totals() const override {
    GemmTuneTotals t;
    if constexpr (kDevice) {
      const cuda::GemmTuneStats s = model_.exec().gemm().tune_stats();
      t.tuned = s.tuned_plans;
      t.reused = s.reused_plans;
      t.tune_s = s.tune_s;
    }
    return t;
  }

 private:
  void check_optim_slice(int64_t offset, int64_t n) const {
    TT_CHECK(offset >= 0 && n >= 0 && offset + n <= num_params(), "optimizer state slice [", offset, ", ", offset + n,
             ") outside the model's ", num_params(), " parameters");
  }
  float* m() { return reinterpret_cast<float*>(m_.data()); }
  float* v() { return reinterpret_cast<float*>(v_.data()); }
  void reset_optim() {
    model_.exec().zero(m_.data(), sizeof(float) * (size_t)num_params());
    model_.exec().zero(v_.data(), sizeof(float) * (size_t)num_params());
  }
  // mutable: grad_sum_squares() and the host copies are const in the interface but run on the
  // model's stream and scratch.
  mutable model::Decoder<E> model_;
  model::Activations<E> acts_;  // forward_backward's
  double nll_ = 0;              // since zero_grad
  model::LossReader<E> pending_;  // enqueue_forward_backward's losses
  // The NLL sums of the calls since pending_losses() while some are pending, in call order (added
  // to nll_ in that order once they are read).
  struct Call {
    bool pending;
    double nll;
  };
  std::vector<Call> calls_;
  void add_nll(double x) {
    if (calls_.empty()) nll_ += x;
    else calls_.push_back({false, x});
  }
  int64_t pieces_recomputed_ = 0;
  int gpu_;
  typename E::Buffer m_;  // (num_params) AdamW first moment
  typename E::Buffer v_;  // (num_params) AdamW second moment
  typename E::Buffer chunks_;  // the CUDA AdamW chunk table
  typename E::Buffer flag_;    // (1) int: the CUDA update left a non-finite value
  std::vector<cuda::AdamWChunk> chunks_host_;
};

using CpuBackend = DecoderBackend<model::CpuExec<float>>;
using CudaBackend = DecoderBackend<model::CudaExec>;

cudaDeviceProp device_props(int gpu) {
  cudaDeviceProp prop{};
  TT_CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu));
  return prop;
}

// The CUDA kernels are built for sm_90a (tools/cuda.bzl): compute capability 9.0 only. Empty
// when the device is one, else what it is.
std::string unsupported_gpu(const cudaDeviceProp& prop) {
  if (prop.major == 9 && prop.minor == 0) return "";
  return str(prop.name, " has compute capability ", prop.major, ".", prop.minor,
             "; the CUDA backend is built for 9.0 (Hopper, sm_90a)");
}

// Makes this rank's GPU current (one process per GPU) and returns it.
int bind_gpu(int local_rank, int local_world_size, int visible) {
  const int gpu = distributed::pick_device(local_rank, local_world_size, visible);
  TT_CUDA_CHECK(cudaSetDevice(gpu));
  return gpu;
}

}  // namespace

int resolve_device(const std::string& device, const model::ModelConfig& cfg, int local_rank, int local_world_size) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw Error(str("device: expected one of auto|cpu|cuda, got '", device, "'"));
  if (device == "cpu") return -1;
  std::string why;
  const int n = cuda::visible_devices(&why);
  if (device == "cuda") {
    if (n == 0) throw Error(str("device: cuda but no CUDA device is visible (", why, ")"));
    const int gpu = bind_gpu(local_rank, local_world_size, n);
    if (const std::string bad = unsupported_gpu(device_props(gpu)); !bad.empty())
      throw Error(str("device: cuda but ", bad));
    model::CudaExec::check_model(cfg);
    return gpu;
  }
  if (n == 0) {
    spdlog::info("device: auto -> cpu (no CUDA device is visible: {})", why);
    return -1;
  }
  try {  // a model the CUDA kernels cannot run (head dims, linear attention shapes) stays on the cpu
    model::CudaExec::check_model(cfg);
  } catch (const Error& e) {
    spdlog::info("device: auto -> cpu ({})", e.what());
    return -1;
  }
  const int gpu = bind_gpu(local_rank, local_world_size, n);
  const cudaDeviceProp prop = device_props(gpu);
  if (const std::string bad = unsupported_gpu(prop); !bad.empty()) {
    spdlog::info("device: auto -> cpu ({})", bad);
    return -1;
  }
  spdlog::info("device: auto -> cuda (device {} of {} visible: {})", gpu, n, prop.name);
  return gpu;
}

namespace {

// Throws when the training state and a micro-batch's activations cannot fit (see make_backend).
template <class E>
void check_memory(const model::ModelConfig& cfg, int64_t tokens, int gpu) {
  const model::MemoryEstimate m = model::estimate_training_memory<E>(cfg, tokens);
  const int64_t optim = 2 * (int64_t)sizeof(float) * model::Architecture(cfg).table().num_params();
  const int64_t need = m.total() + optim;
  const int64_t have = free_memory(gpu);
  const std::string where = gpu >= 0 ? str("GPU ", gpu, " has ", gib((double)have), " free")
                                     : str("the host has ", gib((double)have), " available");
  if (have < 0 || need <= have) return;
  throw Error(str("the model (", model::Architecture(cfg).table().num_params(),
                  " parameters from model.hidden_size, model.intermediate_size, model.num_hidden_layers, "
                  "model.vocab_size) and data.max_tokens_per_batch = ", tokens, " need about ", gib((double)need),
                  " on ", E::kName, " (weights ", gib((double)m.weights), ", gradients ", gib((double)m.grads),
                  ", AdamW state ", gib((double)optim), ", activations ", gib((double)m.activations), "), but ", where,
                  ": make the model or data.max_tokens_per_batch smaller (partition.capacity_tokens bounds a large "
                  "tree's pieces)"));
}

}  // namespace

std::string partition_memory_problem(const std::string& tree_id, int64_t n_tree, const data::Partition& plan,
                                     bool recompute, int64_t need, int64_t need_recompute, int64_t free_bytes,
                                     const std::string& free_what) {
  if (free_bytes < 0 || need <= free_bytes) return "";
  std::string out = str("tree '", tree_id, "' (", n_tree, " tokens in ", plan.num_pieces(), " pieces) would hold about ",
                        gib(need), " at once besides the training state (");
  if (recompute)
    out += str("the activations of ", plan.max_piece_tokens, " tokens and the K/V rows of ", plan.kept_peak_tokens);
  else
    out += str("the activations of a chain of pieces, ", plan.peak_tokens, " tokens");
  out += str("), but ", free_what, " ", gib(free_bytes), " free: ");
  if (!recompute && need_recompute <= free_bytes)
    return out + str("set partition.recompute: true (the activations of one piece at a time, at most ",
                     plan.max_piece_tokens, " tokens, and the K/V rows of ", plan.kept_peak_tokens,
                     " tokens: about ", gib(need_recompute), ")");
  return out + str(recompute ? "" : "partition.recompute: true would still need about " + gib(need_recompute) + "; ",
                   "a smaller partition.capacity_tokens (", plan.capacity,
                   " now) bounds a piece's activations (the K/V rows kept grow with the tree)");
}

std::unique_ptr<Backend> make_backend(const std::string& device, const model::ModelConfig& cfg, int local_rank,
                                      int local_world_size, const model::CudaExecOptions& cuda, int64_t max_tokens) {
  const int gpu = resolve_device(device, cfg, local_rank, local_world_size);
  if (max_tokens > 0) {
    if (gpu < 0) check_memory<model::CpuExec<float>>(cfg, max_tokens, gpu);
    else check_memory<model::CudaExec>(cfg, max_tokens, gpu);
  }
  if (gpu < 0) return std::make_unique<CpuBackend>(cfg, model::CpuExec<float>::Options{}, -1);
  return std::make_unique<CudaBackend>(cfg, cuda, gpu);
}

}  // namespace tt::trainer
