// Model configuration with Hugging Face config.json field names (Llama and Qwen3 families).
#pragma once

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tt::model {

// One decoder layer as the model builds it: its mixer kind (the layer_types entry) and variants.
struct LayerSpec {
  std::string mixer = "full_attention";
  bool qk_norm = false;      // Qwen3's per-head q/k RMSNorm
  bool output_gate = false;  // Qwen3.5's gated attention: q_proj also gives a per-head gate, o_proj reads att sigmoid(gate)
  int rotary_dim = 0;        // RoPE on the first rotary_dim dims of a head (0: all; Qwen3.5's partial RoPE)
};

// Bounds of every size, checked by ModelConfig::validate() (an error names the key). They are
// chosen so that every product the decoder (model/decoder.h) and the CUDA kernels form
// fits its type:
//  - single dimensions (V, C, I, NH, NKV, HS, L) and the head widths NH * HS, NKV * HS (<= 2^20)
//    are int32;
//  - row counts of the per-head q/k norm, N * NH, are int32: a batch of N tokens needs
//    N * NH < 2^31 (RunConfig::validate checks it against data.max_tokens_per_batch; N itself and
//    the position ids are int32, so max_position_embeddings < 2^31);
//  - element counts (N * V logits, V * C, I * C, N * I, ...) are int64, and the parameter count is
//    at most kMaxParameters (2^40), so parameters, gradients and AdamW state in bytes fit int64.
// These are limits of the arithmetic, not of memory: a model within them can still be too large
// for the host or the device.
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;          // 16,777,216
constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;         // 65,536
constexpr int64_t kMaxIntermediateSize = int64_t{1} << 18;   // 262,144
constexpr int64_t kMaxLayers = int64_t{1} << 10;             // 1,024
constexpr int64_t kMaxHeads = int64_t{1} << 10;              // 1,024 (query heads; KV heads divide them)
constexpr int64_t kMaxHeadDim = int64_t{1} << 10;            // 1,024
constexpr int64_t kMaxPositions = (int64_t{1} << 31) - 1;    // int32 position ids
constexpr int64_t kMaxParameters = int64_t{1} << 40;
constexpr int64_t kMaxConvKernel = 64;                       // linear_conv_kernel_dim
static_assert(kMaxHeads * kMaxHeadDim <= (int64_t{1} << 20), "head widths NH * HS must stay far below 2^31");

// The vision tower and its connector (issue 16; model/vision.h): a SigLIP vision transformer
// (HF SiglipVisionConfig names) whose last layer's patch tokens go through a LLaVA projector
// (multi_modal_projector.linear_1, GELU, linear_2) into the decoder's rows of each frame slot,
// and a state projection (one Linear) into each state row. Off while num_hidden_layers is 0.
struct VisionConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_channels = 3;
  int64_t image_size = 0;
  int64_t patch_size = 0;
  std::string hidden_act = "gelu_pytorch_tanh";  // the tower MLP's: gelu_pytorch_tanh | gelu
  double layer_norm_eps = 1e-6;
  bool freeze = false;  // the tower's weights take no gradient and no update (the projector trains)
  // LLaVA's connector fields (LlavaConfig names).
  std::string projector_hidden_act = "gelu";  // gelu | gelu_pytorch_tanh
  int64_t image_token_index = 0;   // the placeholder token id of frame-slot rows
  // The projector reads hidden_states[vision_feature_layer] as LLaVA does: k >= 0 the output of
  // the first k encoder layers (0: the embeddings), k < 0 counted from the end (-1: the last
  // layer, -2: LLaVA-1.5's second to last); never SigLIP's post_layernorm.
  int64_t vision_feature_layer = -1;
  // Proprioceptive state (ours: model.state_projector): values per state row (0: none) and the
  // placeholder id of state rows.
  int64_t state_dim = 0;
  int64_t state_token_index = 1;

  bool enabled() const { return num_hidden_layers > 0; }
  int64_t grid() const { return patch_size > 0 ? image_size / patch_size : 0; }
  int64_t tokens_per_frame() const { return grid() * grid(); }  // (image_size / patch_size)^2, no CLS
  int64_t head_dim() const { return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0; }
  // Encoder layers that run: those up to hidden_states[vision_feature_layer]. The layers after it
  // keep their tensors (read from and written to checkpoints) but never run and are frozen, as in
  // transformers, where they get no gradient and the optimizer skips them.
  int64_t feature_layers() const {
    return vision_feature_layer < 0 ? num_hidden_layers + 1 + vision_feature_layer : vision_feature_layer;
  }
  int64_t parameter_count(int64_t text_hidden) const;
};

struct ModelConfig {
  std::string architecture = "qwen3";  // "qwen3" | "llama" | "qwen3_5_text" (dense Qwen3.5, text only) | "qwen3_next" (dense)
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
  // HF's layer_types: the mixer of each layer, "full_attention" or "linear_attention" (Gated
  // DeltaNet, model/gdn.h: CPU backend only so far). Empty means every layer is full_attention;
  // otherwise one entry per layer.
  std::vector<std::string> layer_types;
  // Gated DeltaNet ("linear_attention" layers; HF Qwen3-Next / Qwen3.5 names): key heads, value
  // heads (a multiple of the key heads), their head dims and the causal conv's kernel. 0: unset
  // (required, each in [1, its bound], when a layer is linear_attention).
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  bool has_linear_attention() const;
  // HF's eos_token_id: generation stops after emitting one of them (empty: none).
  std::vector<int64_t> eos_token_id;

  // The vision tower, projector and state projection of a VLA (off by default).
  VisionConfig vision;

  // qwen3_5_text: RoPE on head_dim * partial_rotary_factor dims (HF default 0.25; others 1).
  double partial_rotary_factor = 1.0;

  bool qk_norm() const { return architecture == "qwen3" || qwen3_5(); }
  // Qwen3.5: every RMSNorm weight but the Gated DeltaNet's gated norm is stored zero-centred (the
  // layer applies 1 + w; ParamInfo::hf_offset), attention has an output gate, RoPE is partial.
  // The Qwen3.5 family: qwen3_5_text and the dense qwen3_next (the same model; Qwen3-Next fuses
  // the Gated DeltaNet's input projections, grouped per key head: in_proj_qkvz, in_proj_ba).
  bool qwen3_5() const { return architecture == "qwen3_5_text" || architecture == "qwen3_next"; }
  bool qwen3_next() const { return architecture == "qwen3_next"; }
  int rotary_dim() const { return (int)std::lround((double)head_dim * partial_rotary_factor); }
  // The layers as the model builds them (layer_types and the architecture's variants).
  std::vector<LayerSpec> layer_specs() const;
  // The one spelling of each config: layer_types naming full_attention for every layer becomes []
  // (what Qwen3Config writes, and what from_hf_json returns), so two configs of the same model
  // compare equal however they spelt it.
  void canonicalize();
  // Checks every field against its bound above and the cross-field rules (heads, even head_dim,
  // the parameter count); throws tt::KeyError naming the field and what was expected.
  void validate() const;
  // Parameters of the decoder (the sizes of param_table), computed without overflow for any
  // field values; saturates at INT64_MAX.
  int64_t parameter_count() const;
  // Hugging Face config.json (architectures, model_type, torch_dtype, ...).
  nlohmann::json to_hf_json(const std::string& torch_dtype = "float32") const;
  // Reads a Hugging Face config.json object; `where` names the file for errors.
  static ModelConfig from_hf_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace tt::model
