// Backends: the CPU reference (Model<float>, ops/cpu AdamW) and the device choice.
#include "trainer/backend.h"

#include <spdlog/spdlog.h>

#include "model/hf_io.h"
#include "model/partitioned.h"
#include "ops/check.h"
#include "ops/cpu/adamw.h"

namespace tt::trainer {
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

}  // namespace

std::unique_ptr<Backend> make_backend(const std::string& device, const model::ModelConfig& cfg) {
  if (device == "cuda") throw Error("device: cuda is not available in this build (CUDA backend pending)");
  if (device == "auto") {
    spdlog::info("device: auto -> cpu (the CUDA backend is not built yet; training runs on the CPU reference)");
  } else if (device != "cpu") {
    throw Error(str("device: expected one of auto|cpu|cuda, got '", device, "'"));
  }
  return std::make_unique<CpuBackend>(cfg);
}

}  // namespace tt::trainer
