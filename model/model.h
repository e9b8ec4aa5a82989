// Llama/Qwen3 decoder, CPU reference backend, with an explicit forward and backward per layer.
//
// One layer: x += o_proj(attn(rope(qk_norm(q_proj(n1))), rope(qk_norm(k_proj(n1))), v_proj(n1)))
// with n1 = rmsnorm(x); then x += down_proj(swiglu(gate_proj(n2), up_proj(n2))) with
// n2 = rmsnorm(x). Attention is the tree attention primitive over the packed batch's DFS layout,
// with position ids from tree depth. The LM head (tied to the embedding or not) produces logits
// for every packed row, and the loss is the weighted cross-entropy over the batch's target list.
//
// Parameters live in one flat buffer in a fixed order, each with its Hugging Face name and shape,
// so optimizer, checkpoint and gradient code treat them uniformly. forward() saves exactly the
// activations backward() needs. Gradient contract: backward() accumulates (+=) into grads().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/packing.h"
#include "model/config.h"

namespace tt::model {

struct ParamInfo {
  std::string name;            // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // Hugging Face shape, e.g. (q_out, hidden)
  int64_t offset = 0;          // into the flat buffer
  int64_t numel = 0;
  bool decay = true;           // weight decay applies (matrices), not to norm weights
};

// Parameter table for a config; identical for every backend.
std::vector<ParamInfo> param_table(const ModelConfig& cfg);

template <class T>
class Model {
 public:
  explicit Model(const ModelConfig& cfg);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params_info() const { return info_; }
  int64_t num_params() const { return (int64_t)params_.size(); }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }
  T* param(const std::string& name);  // throws tt::Error for an unknown name

  // Deterministic initialisation: normal(0, initializer_range) for matrices (seeded per tensor
  // from `seed` and the tensor's name), ones for norm weights.
  void init(uint64_t seed);
  void zero_grad();

  // Forward over a packed batch: returns loss_scale * sum_t w_t * ce_t. Saves activations and
  // logits (N, V) for backward() and logits().
  double forward(const data::PackedBatch& batch, double loss_scale);
  // Backward of the last forward; grads() += d(loss)/d(params). Reads the batch passed to
  // forward(), which must still be alive.
  void backward();
  const T* logits() const { return logits_.data(); }  // (N, V) of the last forward

 private:
  struct Acts;  // saved activations, defined in model.cc
  ModelConfig cfg_;
  std::vector<ParamInfo> info_;
  std::vector<T> params_;
  std::vector<T> grads_;
  std::vector<T> logits_;
  std::vector<T> acts_buf_;  // all saved activations of the last forward, one allocation
  const data::PackedBatch* batch_ = nullptr;
  double loss_scale_ = 1.0;
};

}  // namespace tt::model
