// Backends: the CPU reference (Model<float>, ops/cpu AdamW), the CUDA backend (model::CudaModel,
// ops/cuda AdamW) and the device choice.
#include "trainer/backend.h"

#include <cuda_runtime.h>
#include <spdlog/spdlog.h>

#include "distributed/env.h"
#include "model/cuda_model.h"
#include "model/cuda_partitioned.h"
#include "model/hf_io.h"
#include "model/partitioned.h"
#include "base/check.h"
#include "ops/cpu/adamw.h"
#include "ops/cuda/adamw.h"
#include "ops/cuda/check.h"

namespace tt::trainer {

double Backend::forward_backward_notify(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) {
  const double loss = forward_backward(batch, loss_scale);
  if (ready) ready(0, (int)params_info().size());
  return loss;
}

namespace {

// fp32 master weights are the model's float parameters; m and v are fp32 in the same layout.
class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const model::ModelConfig& cfg)
      : model_(cfg), m_(model_.num_params(), 0.0f), v_(model_.num_params(), 0.0f) {}

  std::string name() const override { return "cpu"; }
  const std::vector<model::ParamInfo>& params_info() const override { return model_.params_info(); }
  int64_t num_params() const override { return model_.num_params(); }

  void init(uint64_t seed) override {
    model_.init(seed);
    reset_optim();
  }
  void load_hf(const std::string& dir) override {
    model::load_hf_weights(dir, model_);
    reset_optim();
  }
  void save_hf(const std::string& dir) const override { model::save_hf(dir, model_, "F32"); }

  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const data::PackedBatch& batch, double loss_scale) override {
    const double loss = model_.forward(batch, loss_scale);
    model_.backward();
    return loss;
  }
  double forward_backward_partitioned(const data::Tree& split, const data::Partition& plan,
                                      double loss_scale) override {
    return model::forward_backward_partitioned(model_, split, plan, loss_scale);
  }
  double grad_sum_squares() const override { return cpu::sum_squares(model_.grads(), model_.num_params()); }
  float* grads_data() override { return model_.grads(); }

  void adamw_step(const OptimStep& p) override {
    for (const model::ParamInfo& info : model_.params_info()) {
      cpu::AdamWParams ap;
      ap.lr = p.lr;
      ap.beta1 = p.beta1;
      ap.beta2 = p.beta2;
      ap.eps = p.eps;
      ap.weight_decay = info.decay ? p.weight_decay : 0.0;
      ap.step = p.step;
      ap.grad_scale = p.grad_scale;
      const int64_t o = info.offset;
      cpu::adamw_update(model_.params() + o, model_.grads() + o, m_.data() + o, v_.data() + o, info.numel, ap);
    }
  }

  std::vector<float> params_host() const override {
    return std::vector<float>(model_.params(), model_.params() + model_.num_params());
  }
  std::vector<float> grads_host() const override {
    return std::vector<float>(model_.grads(), model_.grads() + model_.num_params());
  }
  void optim_state_host(std::vector<float>* m, std::vector<float>* v) const override {
    *m = m_;
    *v = v_;
  }
  void set_optim_state(const std::vector<float>& m, const std::vector<float>& v) override {
    TT_CHECK((int64_t)m.size() == num_params() && (int64_t)v.size() == num_params(), "optimizer state has ",
             m.size(), "/", v.size(), " values, the model ", num_params(), " parameters");
    m_ = m;
    v_ = v;
  }

 private:
  void reset_optim() {
    std::fill(m_.begin(), m_.end(), 0.0f);
    std::fill(v_.begin(), v_.end(), 0.0f);
  }
  model::Model<float> model_;
  std::vector<float> m_;  // (num_params) AdamW first moment
  std::vector<float> v_;  // (num_params) AdamW second moment
};

model::CudaModelOptions model_options(bool gemm_autotune) {
  model::CudaModelOptions o;
  o.gemm_autotune = gemm_autotune;
  return o;
}

// The whole step on the GPU: CudaModel's fp32 master weights and gradients, fp32 m and v in the
// same flat layout, AdamW over every tensor in one launch (ops/cuda/adamw.h; it also rewrites the
// bf16 working copy), the gradient norm in fp64 on the device. Clipping arrives folded into
// OptimStep::grad_scale. HF directories go through a host Model<float> made for the call. Data
// parallelism reduces the device gradient buffer in place, ordered on the model's stream.
class CudaBackend : public Backend {
 public:
  // gpu: the current device, where the model allocates.
  CudaBackend(const model::ModelConfig& cfg, int gpu, bool gemm_autotune)
      : model_(cfg, model_options(gemm_autotune)), gpu_(gpu) {
    const int64_t P = model_.num_params();
    m_ = cuda::DeviceBuffer<float>(P, &model_.allocator());
    v_ = cuda::DeviceBuffer<float>(P, &model_.allocator());
    std::vector<cuda::AdamWTensor> tensors;
    for (const model::ParamInfo& p : model_.params_info()) tensors.push_back({p.offset, p.numel, p.decay});
    const std::vector<cuda::AdamWChunk> chunks = cuda::adamw_chunks(tensors);
    chunks_ = cuda::DeviceBuffer<cuda::AdamWChunk>(chunks.size(), &model_.allocator());
    TT_CUDA_CHECK(cudaMemcpyAsync(chunks_.data(), chunks.data(), sizeof(cuda::AdamWChunk) * chunks.size(),
                                  cudaMemcpyHostToDevice, model_.stream()));
    reset_optim();
    TT_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  }

  std::string name() const override { return "cuda"; }
  const std::vector<model::ParamInfo>& params_info() const override { return model_.params_info(); }
  int64_t num_params() const override { return model_.num_params(); }

  void init(uint64_t seed) override {
    model_.init(seed);
    reset_optim();
  }
  void load_hf(const std::string& dir) override {
    model::Model<float> host(model_.config());
    model::load_hf_weights(dir, host);
    model_.set_params(host.params());
    reset_optim();
  }
  void save_hf(const std::string& dir) const override {
    model::Model<float> host(model_.config());
    const std::vector<float> p = model_.params_host();
    std::copy(p.begin(), p.end(), host.params());
    model::save_hf(dir, host, "F32");
  }

  void zero_grad() override { model_.zero_grad(); }
  double forward_backward(const data::PackedBatch& batch, double loss_scale) override {
    return model_.forward_backward(batch, loss_scale);
  }
  // Layer by layer as backward is enqueued (model::GradReadyFn), so buckets start early.
  double forward_backward_notify(const data::PackedBatch& batch, double loss_scale, const GradReady& ready) override {
    return model_.forward_backward(batch, loss_scale, ready);
  }
  double forward_backward_partitioned(const data::Tree& split, const data::Partition& plan,
                                      double loss_scale) override {
    return model::forward_backward_partitioned(model_, split, plan, loss_scale);
  }
  double grad_sum_squares() const override { return model_.grad_sum_squares(); }

  void adamw_step(const OptimStep& p) override {
    cuda::AdamWParams ap;
    ap.lr = p.lr;
    ap.beta1 = p.beta1;
    ap.beta2 = p.beta2;
    ap.eps = p.eps;
    ap.weight_decay = p.weight_decay;  // the chunk table applies it to decay tensors only
    ap.step = p.step;
    ap.grad_scale = p.grad_scale;
    cuda::adamw_update(model_.params(), model_.params_bf16(), model_.grads(), m_.data(), v_.data(), chunks_.data(),
                       (int)chunks_.size(), ap, nullptr, model_.stream());
    // The step ends when its update has: step timings and host copies see the new weights.
    TT_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  }

  std::vector<float> params_host() const override { return model_.params_host(); }
  std::vector<float> grads_host() const override { return model_.grads_host(); }
  void optim_state_host(std::vector<float>* m, std::vector<float>* v) const override {
    m->resize(num_params());
    v->resize(num_params());
    TT_CUDA_CHECK(cudaMemcpyAsync(m->data(), m_.data(), sizeof(float) * m->size(), cudaMemcpyDeviceToHost,
                                  model_.stream()));
    TT_CUDA_CHECK(cudaMemcpyAsync(v->data(), v_.data(), sizeof(float) * v->size(), cudaMemcpyDeviceToHost,
                                  model_.stream()));
    TT_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  }
  void set_optim_state(const std::vector<float>& m, const std::vector<float>& v) override {
    TT_CHECK((int64_t)m.size() == num_params() && (int64_t)v.size() == num_params(), "optimizer state has ",
             m.size(), "/", v.size(), " values, the model ", num_params(), " parameters");
    TT_CUDA_CHECK(cudaMemcpyAsync(m_.data(), m.data(), sizeof(float) * m.size(), cudaMemcpyHostToDevice,
                                  model_.stream()));
    TT_CUDA_CHECK(cudaMemcpyAsync(v_.data(), v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice,
                                  model_.stream()));
    TT_CUDA_CHECK(cudaStreamSynchronize(model_.stream()));
  }
  int64_t device_malloc_count() const override { return model_.allocator().stats().num_cuda_malloc; }
  int64_t take_device_peak_bytes() override {
    const int64_t peak = model_.allocator().stats().peak_bytes_in_use;
    model_.allocator().reset_peak();
    return peak;
  }

  float* grads_data() override { return model_.grads(); }
  bool grads_on_device() const override { return true; }
  void* compute_stream() const override { return model_.stream(); }
  int device() const override { return gpu_; }

 private:
  void reset_optim() {
    m_.fill_bytes(0, model_.stream());
    v_.fill_bytes(0, model_.stream());
  }
  // mutable: grad_sum_squares() is const in the interface but runs a reduction on the model's
  // stream and scratch.
  mutable model::CudaModel model_;
  int gpu_;
  cuda::DeviceBuffer<float> m_;  // (num_params) AdamW first moment
  cuda::DeviceBuffer<float> v_;  // (num_params) AdamW second moment
  cuda::DeviceBuffer<cuda::AdamWChunk> chunks_;
};

// Visible CUDA devices; `why` says why there are none.
int cuda_devices(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = str("cudaGetDeviceCount: ", cudaGetErrorString(err));
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

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

std::unique_ptr<Backend> make_backend(const std::string& device, const model::ModelConfig& cfg, int local_rank,
                                      int local_world_size, bool gemm_autotune) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw Error(str("device: expected one of auto|cpu|cuda, got '", device, "'"));
  if (device == "cpu") return std::make_unique<CpuBackend>(cfg);
  std::string why;
  const int n = cuda_devices(&why);
  if (device == "cuda") {
    if (n == 0) throw Error(str("device: cuda but no CUDA device is visible (", why, ")"));
    const int gpu = bind_gpu(local_rank, local_world_size, n);
    if (const std::string bad = unsupported_gpu(device_props(gpu)); !bad.empty())
      throw Error(str("device: cuda but ", bad));
    return std::make_unique<CudaBackend>(cfg, gpu, gemm_autotune);
  }
  if (n == 0) {
    spdlog::info("device: auto -> cpu (no CUDA device is visible: {})", why);
    return std::make_unique<CpuBackend>(cfg);
  }
  if (cfg.head_dim != 64 && cfg.head_dim != 128) {
    spdlog::info("device: auto -> cpu (model.head_dim {}: the CUDA attention takes 64 or 128)", cfg.head_dim);
    return std::make_unique<CpuBackend>(cfg);
  }
  const int gpu = bind_gpu(local_rank, local_world_size, n);
  const cudaDeviceProp prop = device_props(gpu);
  if (const std::string bad = unsupported_gpu(prop); !bad.empty()) {
    spdlog::info("device: auto -> cpu ({})", bad);
    return std::make_unique<CpuBackend>(cfg);
  }
  spdlog::info("device: auto -> cuda (device {} of {} visible: {})", gpu, n, prop.name);
  return std::make_unique<CudaBackend>(cfg, gpu, gemm_autotune);
}

}  // namespace tt::trainer
