// Model configuration with Hugging Face config.json field names (Llama and Qwen3 families).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tt::model {

// One decoder layer as the model builds it: its mixer kind (the layer_types entry) and variants.
struct LayerSpec {
  std::string mixer = "full_attention";
  bool qk_norm = false;  // Qwen3's per-head q/k RMSNorm
};

struct ModelConfig {
  std::string architecture = "qwen3";  // "qwen3" | "llama"
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 384;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 32;  // Llama default: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t max_position_embeddings = 4096;
  // HF's layer_types: the mixer of each layer ("full_attention"; the only kind so far). Empty
  // means every layer is full_attention; otherwise one entry per layer.
  std::vector<std::string> layer_types;
  // HF's eos_token_id: generation stops after emitting one of them (empty: none).
  std::vector<int64_t> eos_token_id;

  bool qk_norm() const { return architecture == "qwen3"; }
  // The layers as the model builds them (layer_types and the architecture's variants).
  std::vector<LayerSpec> layer_specs() const;
  // Throws tt::Error naming the field and what was expected.
  void validate() const;
  // Hugging Face config.json (architectures, model_type, torch_dtype, ...).
  nlohmann::json to_hf_json(const std::string& torch_dtype = "float32") const;
  // Reads a Hugging Face config.json object; `where` names the file for errors.
  static ModelConfig from_hf_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace tt::model
