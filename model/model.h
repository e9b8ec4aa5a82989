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
#include "ops/cpu/attention.h"

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

// External KV prefixes per layer (partition gateways, carried KV tails): prefixes[l] lists the
// prefixes that layer l's attention reads besides the batch's own keys. Their dk/dv (when set)
// are accumulated (+=) by backward().
template <class T>
using LayerPrefixes = std::vector<std::vector<cpu::ExternalKV<T>>>;

// Gradients relayed into a batch's own per-layer K/V rows (after norms and RoPE, as attention
// reads them) from readers outside the batch, e.g. the gateways of child partition pieces:
// dk[l], dv[l] are (N, NKV, HS) or null.
template <class T>
struct RelayedKVGrads {
  std::vector<const T*> dk;
  std::vector<const T*> dv;
};

template <class T>
class Model;

// The saved activations of one forward, owned by the caller so several forwards can be alive at
// once (the chain of partition pieces). Reused across forwards: the buffer only grows.
template <class T>
class Activations {
 public:
  const T* logits() const { return logits_.data(); }  // (N, V)
  int n_tokens() const { return batch_ ? batch_->n_tokens : 0; }

 private:
  friend class Model<T>;
  std::vector<T> buf_;
  std::vector<T> logits_;
  const data::PackedBatch* batch_ = nullptr;
  const LayerPrefixes<T>* prefixes_ = nullptr;
  double loss_scale_ = 1.0;
};

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
  const T* logits() const { return own_.logits(); }  // (N, V) of the last forward

  // The same pair on caller-owned activations, with per-layer external KV prefixes (null: none;
  // else one entry per layer, read by forward and backward alike, so it must stay alive until
  // backward) and gradients relayed into this batch's own K/V (null: none).
  double forward(const data::PackedBatch& batch, double loss_scale, Activations<T>& acts,
                 const LayerPrefixes<T>* prefixes);
  void backward(Activations<T>& acts, const RelayedKVGrads<T>* relayed);
  // Layer l's K and V of the last forward on acts, after norms and RoPE: (N, NKV, HS) each.
  const T* layer_k(const Activations<T>& acts, int l) const;
  const T* layer_v(const Activations<T>& acts, int l) const;

 private:
  struct Acts;  // saved activations, defined in model.cc
  ModelConfig cfg_;
  std::vector<ParamInfo> info_;
  std::vector<T> params_;
  std::vector<T> grads_;
  Activations<T> own_;  // used by forward(batch, scale) / backward()
};

}  // namespace tt::model
