// ModelConfig: validation and the Hugging Face config.json mapping (Qwen3ForCausalLM,
// LlamaForCausalLM). Reading is strict about what the decoder cannot represent (rope_scaling,
// attention/MLP biases, activations other than SiLU) and lenient about fields it ignores.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/check.h"

namespace tt::model {

void ModelConfig::validate() const {
  const std::string ctx = "model config: ";
  auto fail = [&](const char* key, const std::string& detail) { throw KeyError(key, ctx, str(key, " ", detail)); };
  if (architecture != "qwen3" && architecture != "llama" && architecture != "qwen3_5_text" &&
      architecture != "qwen3_next")
    fail("architecture", str("must be \"qwen3\", \"llama\", \"qwen3_5_text\" or \"qwen3_next\" (got \"", architecture,
                             "\")"));
  auto in_range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) fail(key, str("must be in [", lo, ", ", hi, "] (got ", v, ")"));
  };
  in_range("vocab_size", vocab_size, 1, kMaxVocabSize);
  in_range("hidden_size", hidden_size, 1, kMaxHiddenSize);
  in_range("intermediate_size", intermediate_size, 1, kMaxIntermediateSize);
  in_range("num_hidden_layers", num_hidden_layers, 1, kMaxLayers);
  in_range("num_attention_heads", num_attention_heads, 1, kMaxHeads);
  in_range("num_key_value_heads", num_key_value_heads, 1, kMaxHeads);
  in_range("head_dim", head_dim, 1, kMaxHeadDim);
  in_range("max_position_embeddings", max_position_embeddings, 1, kMaxPositions);
  if (num_attention_heads % num_key_value_heads != 0)
    fail("num_key_value_heads", str("must divide num_attention_heads (", num_attention_heads, ") (got ",
                                    num_key_value_heads, ")"));
  if (head_dim % 2 != 0) fail("head_dim", str("must be even for RoPE (got ", head_dim, ")"));
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1))
    fail("partial_rotary_factor", str("must be in (0, 1] (got ", partial_rotary_factor, ")"));
  if (!qwen3_5() && partial_rotary_factor != 1)
    fail("partial_rotary_factor", str("must be 1 for architecture ", architecture, " (got ", partial_rotary_factor,
                                      "); partial RoPE is qwen3_5_text's and qwen3_next's"));
  if (rotary_dim() < 2 || rotary_dim() % 2 != 0 ||
      std::fabs((double)rotary_dim() - (double)head_dim * partial_rotary_factor) > 1e-9)
    fail("partial_rotary_factor", str("times head_dim (", head_dim, ") must be an even whole number >= 2 (got ",
                                      partial_rotary_factor, ")"));
  auto positive_finite = [&](const char* key, double v) {
    if (!(v > 0) || !std::isfinite(v)) fail(key, str("must be a finite number > 0 (got ", v, ")"));
  };
  positive_finite("rms_norm_eps", rms_norm_eps);
  // An epsilon of 1e308 passes as "finite" but swamps every mean square: uniform logits, silently.
  if (rms_norm_eps > 1) fail("rms_norm_eps", str("must be at most 1 (Hugging Face models use 1e-6 to 1e-5; got ",
                                                 rms_norm_eps, ")"));
  positive_finite("rope_theta", rope_theta);
  if (!(initializer_range >= 0) || !std::isfinite(initializer_range))
    fail("initializer_range", str("must be a finite number >= 0 (got ", initializer_range, ")"));
  if (!layer_types.empty()) {
    if ((int64_t)layer_types.size() != num_hidden_layers)
      fail("layer_types", str("has ", layer_types.size(), " entries, expected one per layer (num_hidden_layers = ",
                              num_hidden_layers, ")"));
    for (size_t l = 0; l < layer_types.size(); ++l)
      if (layer_types[l] != "full_attention" && layer_types[l] != "linear_attention")
        fail("layer_types", str("entry ", l, " is \"", layer_types[l],
                                "\", not a layer kind of this model (supported: \"full_attention\", "
                                "\"linear_attention\")"));
  }
  if (has_linear_attention() && !qwen3_5())  // Qwen3_5ForCausalLM is the transformers class with the layer
    fail("layer_types", str("names linear_attention layers, which architectures qwen3_5_text and qwen3_next have "
                            "(transformers' Qwen3_5ForCausalLM, Qwen3NextForCausalLM), not ", architecture));
  if (has_linear_attention()) {  // the Gated DeltaNet sizes (names as in HF's Qwen3NextConfig)
    const char* need = " (a linear_attention layer needs it)";
    auto sized = [&](const char* key, int64_t v, int64_t hi) {
      if (v < 1 || v > hi) fail(key, str("must be in [1, ", hi, "] (got ", v, ")", need));
    };
    sized("linear_num_key_heads", linear_num_key_heads, kMaxHeads);
    sized("linear_num_value_heads", linear_num_value_heads, kMaxHeads);
    sized("linear_key_head_dim", linear_key_head_dim, kMaxHeadDim);
    sized("linear_value_head_dim", linear_value_head_dim, kMaxHeadDim);
    sized("linear_conv_kernel_dim", linear_conv_kernel_dim, kMaxConvKernel);
    if (linear_num_value_heads % linear_num_key_heads != 0)
      fail("linear_num_value_heads", str("must be a multiple of linear_num_key_heads (", linear_num_key_heads,
                                         ") (got ", linear_num_value_heads, ")"));
  }
  if (vision.enabled()) {
    const VisionConfig& v = vision;
    auto vfail = [&](const char* key, const std::string& detail) {
      throw KeyError(str("vision.", key), ctx, str("vision.", key, " ", detail));
    };
    auto vrange = [&](const char* key, int64_t x, int64_t lo, int64_t hi) {
      if (x < lo || x > hi) vfail(key, str("must be in [", lo, ", ", hi, "] (got ", x, ")"));
    };
    vrange("hidden_size", v.hidden_size, 1, kMaxHiddenSize);
    vrange("intermediate_size", v.intermediate_size, 1, kMaxIntermediateSize);
    vrange("num_hidden_layers", v.num_hidden_layers, 1, kMaxLayers);
    vrange("num_attention_heads", v.num_attention_heads, 1, kMaxHeads);
    vrange("image_size", v.image_size, 1, 4096);
    vrange("patch_size", v.patch_size, 1, v.image_size);
    if (v.num_channels != 3) vfail("num_channels", str("must be 3: RGB frames (got ", v.num_channels, ")"));
    if (v.image_size % v.patch_size != 0)
      vfail("patch_size", str("must divide vision.image_size (", v.image_size, ") (got ", v.patch_size, ")"));
    if (v.hidden_size % v.num_attention_heads != 0)
      vfail("num_attention_heads", str("must divide vision.hidden_size (", v.hidden_size, ") (got ",
                                       v.num_attention_heads, ")"));
    if (v.hidden_act != "gelu_pytorch_tanh" && v.hidden_act != "gelu")
      vfail("hidden_act", str("must be \"gelu_pytorch_tanh\" or \"gelu\" (got \"", v.hidden_act, "\")"));
    if (v.projector_hidden_act != "gelu_pytorch_tanh" && v.projector_hidden_act != "gelu")
      vfail("projector_hidden_act", str("must be \"gelu\" or \"gelu_pytorch_tanh\" (got \"",
                                        v.projector_hidden_act, "\")"));
    if (!(v.layer_norm_eps > 0) || !std::isfinite(v.layer_norm_eps))
      vfail("layer_norm_eps", str("must be a finite number > 0 (got ", v.layer_norm_eps, ")"));
    if (v.vision_feature_layer < -(v.num_hidden_layers + 1) || v.vision_feature_layer > v.num_hidden_layers)
      vfail("vision_feature_layer",
            str("must be in [", -(v.num_hidden_layers + 1), ", ", v.num_hidden_layers,
                "]: an index of the tower's hidden_states (the embeddings, then vision.num_hidden_layers = ",
                v.num_hidden_layers, " layers; -1 the last) (got ", v.vision_feature_layer, ")"));
    vrange("image_token_index", v.image_token_index, 0, vocab_size - 1);
    vrange("state_dim", v.state_dim, 0, kMaxHiddenSize);
    if (v.state_dim > 0) {
      vrange("state_token_index", v.state_token_index, 0, vocab_size - 1);
      if (v.state_token_index == v.image_token_index)
        vfail("state_token_index", str("must differ from vision.image_token_index (both ", v.image_token_index, ")"));
    }
  }
  const int64_t params = parameter_count();
  if (params > kMaxParameters)
    throw KeyError("hidden_size", ctx,
                   str("hidden_size ", hidden_size, ", intermediate_size ", intermediate_size, ", num_hidden_layers ",
                       num_hidden_layers, ", vocab_size ", vocab_size, " and the heads make ", params,
                       " parameters, more than the limit of 2^40 (", kMaxParameters, ")"));
}

void ModelConfig::canonicalize() {
  if ((int64_t)layer_types.size() == num_hidden_layers &&
      std::all_of(layer_types.begin(), layer_types.end(), [](const std::string& t) { return t == "full_attention"; }))
    layer_types.clear();
}

bool ModelConfig::has_linear_attention() const {
  return std::find(layer_types.begin(), layer_types.end(), "linear_attention") != layer_types.end();
}

std::vector<LayerSpec> ModelConfig::layer_specs() const {
  std::vector<LayerSpec> specs(num_hidden_layers);
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (!layer_types.empty()) specs[l].mixer = layer_types[l];
    specs[l].qk_norm = qk_norm();
    specs[l].output_gate = qwen3_5();
    specs[l].rotary_dim = rotary_dim() == head_dim ? 0 : rotary_dim();
  }
  return specs;
}

int64_t ModelConfig::parameter_count() const {
  // 128-bit arithmetic on sizes clamped to [0, 2^32]: a product of three is below 2^96 and the
  // few sums below stay far from 2^127; the result saturates at INT64_MAX.
  using Wide = __int128;
  auto w = [](int64_t v) { return (Wide)std::min<int64_t>(std::max<int64_t>(v, 0), int64_t{1} << 32); };
  const Wide qd = w(num_attention_heads) * w(head_dim), kd = w(num_key_value_heads) * w(head_dim);
  const Wide mlp = w(hidden_size) + 3 * w(hidden_size) * w(intermediate_size);
  const Wide attention = w(hidden_size) + (qwen3_5() ? 3 : 2) * qd * w(hidden_size) + 2 * kd * w(hidden_size) +
                         (qk_norm() ? 2 * w(head_dim) : 0);
  // Gated DeltaNet (model/gdn.h): input norm, in_proj_qkv, in_proj_z, in_proj_b/a, conv1d, A_log,
  // dt_bias, norm, out_proj.
  const Wide kd_lin = w(linear_num_key_heads) * w(linear_key_head_dim);
  const Wide vd_lin = w(linear_num_value_heads) * w(linear_value_head_dim);
  const Wide conv_dim = 2 * kd_lin + vd_lin;
  const Wide gdn = w(hidden_size) + conv_dim * w(hidden_size) + vd_lin * w(hidden_size) +
                   2 * w(linear_num_value_heads) * w(hidden_size) + conv_dim * w(linear_conv_kernel_dim) +
                   2 * w(linear_num_value_heads) + w(linear_value_head_dim) + w(hidden_size) * vd_lin;
  const Wide embed = w(vocab_size) * w(hidden_size) * (tie_word_embeddings ? 1 : 2);
  const Wide max = (Wide)std::numeric_limits<int64_t>::max();
  if (mlp + attention + gdn > max) return std::numeric_limits<int64_t>::max();  // * L would pass 2^127
  const Wide n_linear = has_linear_attention() ? (Wide)std::count(layer_types.begin(), layer_types.end(),
                                                                  std::string("linear_attention"))
                                               : 0;
  const Wide n_full = w(num_hidden_layers) - n_linear;
  const Wide vis = vision.enabled() ? (Wide)vision.parameter_count(hidden_size) : 0;
  const Wide total =
      embed + w(hidden_size) + mlp * w(num_hidden_layers) + attention * n_full + gdn * n_linear + vis;
  return total > max ? std::numeric_limits<int64_t>::max() : (int64_t)total;
}

int64_t VisionConfig::parameter_count(int64_t text_hidden) const {
  using Wide = __int128;
  auto w = [](int64_t v) { return (Wide)std::min<int64_t>(std::max<int64_t>(v, 0), int64_t{1} << 32); };
  const Wide D = w(hidden_size), I = w(intermediate_size), C = w(text_hidden), p = w(patch_size);
  const Wide P = w(tokens_per_frame());
  const Wide embed = D * 3 * p * p + D + P * D;
  const Wide layer = 4 * D + 4 * (D * D + D) + (I * D + I) + (D * I + D);  // two LayerNorms, attention, MLP
  const Wide projector = (C * D + C) + (C * C + C);
  const Wide state = state_dim > 0 ? C * w(state_dim) + C : 0;
  const Wide total = embed + layer * w(num_hidden_layers) + projector + state;
  const Wide max = (Wide)std::numeric_limits<int64_t>::max();
  return total > max ? std::numeric_limits<int64_t>::max() : (int64_t)total;
}

nlohmann::json ModelConfig::to_hf_json(const std::string& torch_dtype) const {
  if (vision.enabled()) {  // LlavaForConditionalGeneration: the decoder is its text_config
    ModelConfig text = *this;
    text.vision = VisionConfig{};
    const VisionConfig& v = vision;
    nlohmann::json j;
    j["architectures"] = nlohmann::json::array({"LlavaForConditionalGeneration"});
    j["model_type"] = "llava";
    j["text_config"] = text.to_hf_json(torch_dtype);
    j["vision_config"] = {{"model_type", "siglip_vision_model"},
                          {"hidden_size", v.hidden_size},
                          {"intermediate_size", v.intermediate_size},
                          {"num_hidden_layers", v.num_hidden_layers},
                          {"num_attention_heads", v.num_attention_heads},
                          {"num_channels", v.num_channels},
                          {"image_size", v.image_size},
                          {"patch_size", v.patch_size},
                          {"hidden_act", v.hidden_act},
                          {"layer_norm_eps", v.layer_norm_eps},
                          {"attention_dropout", 0.0},
                          {"vision_use_head", false}};
    j["image_token_index"] = v.image_token_index;
    j["projector_hidden_act"] = v.projector_hidden_act;
    j["multimodal_projector_bias"] = true;
    j["vision_feature_select_strategy"] = "full";  // SigLIP has no CLS token to drop
    j["vision_feature_layer"] = v.vision_feature_layer;
    j["image_seq_length"] = v.tokens_per_frame();
    j["tie_word_embeddings"] = tie_word_embeddings;
    j["torch_dtype"] = torch_dtype;
    // Ours (transformers keeps unknown fields): the state projection and the freeze flag.
    j["treetrain_vision"] = {{"state_dim", v.state_dim}, {"state_token_index", v.state_token_index},
                             {"freeze", v.freeze}};
    return j;
  }
  const bool qwen = architecture == "qwen3" || qwen3_5();
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({qwen3_next() ? "Qwen3NextForCausalLM"
                                              : qwen3_5()  ? "Qwen3_5ForCausalLM"
                                              : qwen       ? "Qwen3ForCausalLM"
                                                           : "LlamaForCausalLM"});
  j["model_type"] = qwen3_next() ? "qwen3_next" : qwen3_5() ? "qwen3_5_text" : qwen ? "qwen3" : "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  if (qwen3_5()) {  // Qwen3_5TextConfig reads RoPE from rope_parameters (1-D RoPE: text positions)
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", rope_theta},
                            {"partial_rotary_factor", partial_rotary_factor}};
  } else {
    j["rope_theta"] = rope_theta;
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["initializer_range"] = initializer_range;
  j["max_position_embeddings"] = max_position_embeddings;
  ModelConfig canonical = *this;  // every layer full_attention is written as no layer_types
  canonical.canonicalize();
  if (!canonical.layer_types.empty()) j["layer_types"] = canonical.layer_types;
  if (qwen3_5() && canonical.layer_types.empty())  // Qwen3.5 would build its own 3:1 list otherwise
    j["layer_types"] = std::vector<std::string>(num_hidden_layers, "full_attention");
  if (has_linear_attention()) {
    j["linear_num_key_heads"] = linear_num_key_heads;
    j["linear_num_value_heads"] = linear_num_value_heads;
    j["linear_key_head_dim"] = linear_key_head_dim;
    j["linear_value_head_dim"] = linear_value_head_dim;
    j["linear_conv_kernel_dim"] = linear_conv_kernel_dim;
  }
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  j["bos_token_id"] = nullptr;
  if (eos_token_id.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (eos_token_id.size() == 1) {
    j["eos_token_id"] = eos_token_id[0];
  } else {
    j["eos_token_id"] = eos_token_id;
  }
  if (qwen3_next()) {  // dense: no expert anywhere (transformers' default is 512 experts)
    j["num_experts"] = 0;
    j["mlp_only_layers"] = nlohmann::json::array();
    j["decoder_sparse_step"] = 1;
  }
  if (qwen3_5()) {
    j["full_attention_interval"] = 4;  // unused: layer_types is written
  } else if (qwen) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = num_hidden_layers;
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  return j;
}

namespace {

// A present, non-null field (HF writes null for "unset").
bool has(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null();
}

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!has(j, key)) throw Error(str(where, ": missing required field \"", key, "\""));
  const auto& v = j.at(key);
  if (!v.is_number_integer())
    throw Error(str(where, ": field \"", key, "\" must be an integer, got ", v.dump()));
  return v.get<int64_t>();
}

int64_t get_int_or(const nlohmann::json& j, const char* key, int64_t dflt, const std::string& where) {
  return has(j, key) ? get_int(j, key, where) : dflt;
}

double get_double_or(const nlohmann::json& j, const char* key, double dflt, const std::string& where) {
  if (!has(j, key)) return dflt;
  const auto& v = j.at(key);
  if (!v.is_number()) throw Error(str(where, ": field \"", key, "\" must be a number, got ", v.dump()));
  return v.get<double>();
}

bool get_bool_or(const nlohmann::json& j, const char* key, bool dflt, const std::string& where) {
  if (!has(j, key)) return dflt;
  const auto& v = j.at(key);
  if (!v.is_boolean()) throw Error(str(where, ": field \"", key, "\" must be a boolean, got ", v.dump()));
  return v.get<bool>();
}

std::string architecture_of(const nlohmann::json& j, const std::string& where) {
  if (has(j, "model_type")) {
    const auto& v = j.at("model_type");
    if (!v.is_string()) throw Error(str(where, ": field \"model_type\" must be a string, got ", v.dump()));
    const std::string t = v.get<std::string>();
    if (t == "qwen3" || t == "llama" || t == "qwen3_5_text" || t == "qwen3_next") return t;
    throw Error(str(where, ": unsupported model_type \"", t,
                    "\" (expected \"qwen3\", \"llama\", \"qwen3_5_text\" or \"qwen3_next\")"));
  }
  if (has(j, "architectures")) {
    const auto& a = j.at("architectures");
    if (a.is_array()) {
      for (const auto& e : a) {
        if (e == "Qwen3ForCausalLM") return "qwen3";
        if (e == "Qwen3_5ForCausalLM") return "qwen3_5_text";
        if (e == "Qwen3NextForCausalLM") return "qwen3_next";
        if (e == "LlamaForCausalLM") return "llama";
      }
    }
    throw Error(str(where, ": unsupported architectures ", a.dump(),
                    " (expected Qwen3ForCausalLM or LlamaForCausalLM)"));
  }
  throw Error(str(where, ": missing \"model_type\" and \"architectures\""));
}

}  // namespace

ModelConfig ModelConfig::from_hf_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw Error(str(where, ": config must be a JSON object"));
  const bool llava = (has(j, "model_type") && j.at("model_type") == "llava") ||
                     (!has(j, "model_type") && has(j, "architectures") && j.at("architectures").is_array() &&
                      std::find(j.at("architectures").begin(), j.at("architectures").end(),
                                "LlavaForConditionalGeneration") != j.at("architectures").end());
  if (llava) {
    for (const char* key : {"text_config", "vision_config"})
      if (!has(j, key) || !j.at(key).is_object())
        throw Error(str(where, ": a llava config needs a \"", key, "\" object"));
    ModelConfig c = from_hf_json(j.at("text_config"), where + " text_config");
    const nlohmann::json& vj = j.at("vision_config");
    const std::string vw = where + " vision_config";
    if (has(vj, "model_type") && vj.at("model_type") != "siglip_vision_model")
      throw Error(str(vw, ": model_type ", vj.at("model_type").dump(),
                      " is unsupported (expected \"siglip_vision_model\": the SigLIP tower)"));
    VisionConfig& v = c.vision;
    v.hidden_size = get_int(vj, "hidden_size", vw);
    v.intermediate_size = get_int(vj, "intermediate_size", vw);
    v.num_hidden_layers = get_int(vj, "num_hidden_layers", vw);
    v.num_attention_heads = get_int(vj, "num_attention_heads", vw);
    v.num_channels = get_int_or(vj, "num_channels", 3, vw);
    v.image_size = get_int(vj, "image_size", vw);
    v.patch_size = get_int(vj, "patch_size", vw);
    v.layer_norm_eps = get_double_or(vj, "layer_norm_eps", 1e-6, vw);
    if (has(vj, "hidden_act")) {
      if (!vj.at("hidden_act").is_string()) throw Error(str(vw, ": field \"hidden_act\" must be a string"));
      v.hidden_act = vj.at("hidden_act").get<std::string>();
    }
    if (has(j, "projector_hidden_act")) {
      if (!j.at("projector_hidden_act").is_string())
        throw Error(str(where, ": field \"projector_hidden_act\" must be a string"));
      v.projector_hidden_act = j.at("projector_hidden_act").get<std::string>();
    }
    v.image_token_index = get_int_or(j, has(j, "image_token_index") ? "image_token_index" : "image_token_id", 32000, where);
    if (!get_bool_or(j, "multimodal_projector_bias", true, where))
      throw Error(str(where, ": multimodal_projector_bias = false is unsupported (expected true)"));
    // Absent keys mean LlavaConfig's defaults: "default" (drop the first token, a CLS), which a
    // SigLIP tower cannot take, and hidden_states[-2].
    if (!has(j, "vision_feature_select_strategy") || j.at("vision_feature_select_strategy") != "full")
      throw Error(str(where, ": vision_feature_select_strategy ",
                      has(j, "vision_feature_select_strategy") ? j.at("vision_feature_select_strategy").dump()
                                                               : std::string("absent (LlavaConfig's default \"default\")"),
                      " is unsupported (expected \"full\": a SigLIP tower has no CLS token to drop)"));
    v.vision_feature_layer = -2;
    if (has(j, "vision_feature_layer")) {
      if (!j.at("vision_feature_layer").is_number_integer())
        throw Error(str(where, ": vision_feature_layer ", j.at("vision_feature_layer").dump(),
                        " is unsupported (expected one integer: the index of one hidden state, not a list)"));
      v.vision_feature_layer = j.at("vision_feature_layer").get<int64_t>();
    }
    if (has(j, "tie_word_embeddings")) c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", false, where);
    if (has(j, "treetrain_vision")) {
      const nlohmann::json& tv = j.at("treetrain_vision");
      if (!tv.is_object()) throw Error(str(where, ": field \"treetrain_vision\" must be an object"));
      v.state_dim = get_int_or(tv, "state_dim", 0, where + " treetrain_vision");
      v.state_token_index = get_int_or(tv, "state_token_index", 1, where + " treetrain_vision");
      v.freeze = get_bool_or(tv, "freeze", false, where + " treetrain_vision");
    }
    try {
      c.validate();
    } catch (const Error& e) {
      throw Error(str(where, ": ", e.what()));
    }
    return c;
  }
  ModelConfig c;
  c.architecture = architecture_of(j, where);
  c.vocab_size = get_int(j, "vocab_size", where);
  c.hidden_size = get_int(j, "hidden_size", where);
  c.intermediate_size = get_int(j, "intermediate_size", where);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", where);
  c.num_attention_heads = get_int(j, "num_attention_heads", where);
  c.num_key_value_heads = get_int_or(j, "num_key_value_heads", c.num_attention_heads, where);
  if (has(j, "head_dim")) {
    c.head_dim = get_int(j, "head_dim", where);
  } else {
    if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0)
      throw Error(str(where, ": no \"head_dim\" and hidden_size (", c.hidden_size,
                      ") is not a multiple of num_attention_heads (", c.num_attention_heads, ")"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.rms_norm_eps = get_double_or(j, "rms_norm_eps", c.rms_norm_eps, where);
  c.rope_theta = get_double_or(j, "rope_theta", c.rope_theta, where);
  c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", false, where);
  c.initializer_range = get_double_or(j, "initializer_range", c.initializer_range, where);
  c.max_position_embeddings = get_int_or(j, "max_position_embeddings", c.max_position_embeddings, where);
  if (has(j, "eos_token_id")) {  // an id or a list of ids
    const auto& e = j.at("eos_token_id");
    const auto bad = [&] {
      return Error(str(where, ": field \"eos_token_id\" must be a token id or a list of them, got ", e.dump()));
    };
    if (e.is_number_integer()) {
      c.eos_token_id.push_back(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const auto& x : e) {
        if (!x.is_number_integer()) throw bad();
        c.eos_token_id.push_back(x.get<int64_t>());
      }
    } else {
      throw bad();
    }
    for (int64_t id : c.eos_token_id)
      if (id < 0 || id >= c.vocab_size)
        throw Error(str(where, ": eos_token_id ", id, " outside vocab_size ", c.vocab_size));
  }
  if (has(j, "layer_types")) {
    const auto& lt = j.at("layer_types");
    if (!lt.is_array()) throw Error(str(where, ": field \"layer_types\" must be a list of strings, got ", lt.dump()));
    for (const auto& e : lt) {
      if (!e.is_string()) throw Error(str(where, ": field \"layer_types\" must be a list of strings, got ", lt.dump()));
      c.layer_types.push_back(e.get<std::string>());
    }
    c.canonicalize();
  }
  if (c.architecture == "qwen3_next" && !has(j, "num_experts")) {
    // transformers' Qwen3NextConfig defaults to 512 experts: dense only when every layer is
    // mlp_only or num_experts is 0.
    bool all_dense = false;
    if (has(j, "mlp_only_layers") && j.at("mlp_only_layers").is_array())
      all_dense = (int64_t)j.at("mlp_only_layers").size() >= c.num_hidden_layers;
    if (!all_dense)
      throw Error(str(where, ": a qwen3_next config without num_experts is transformers' default mixture of 512 "
                             "experts, which is unsupported; expected num_experts: 0 (dense MLPs)"));
  }
  if (get_int_or(j, "num_experts", 0, where) > 0)  // Qwen3-Next / Qwen3.5-MoE: not a dense model
    throw Error(str(where, ": num_experts = ", j.at("num_experts").dump(),
                    " (a mixture-of-experts model) is unsupported; expected 0 or absent (dense MLPs)"));
  if (c.qwen3_5()) {
    c.partial_rotary_factor = get_double_or(j, "partial_rotary_factor", 0.25, where);
    if (c.layer_types.empty()) {  // transformers' default: every full_attention_interval-th layer is full
      const int64_t every = get_int_or(j, "full_attention_interval", 4, where);
      if (every < 1) throw Error(str(where, ": field \"full_attention_interval\" must be >= 1, got ", every));
      for (int64_t l = 0; l < c.num_hidden_layers; ++l)
        c.layer_types.push_back((l + 1) % every == 0 ? "full_attention" : "linear_attention");
      c.canonicalize();
    }
  }
  c.linear_num_key_heads = get_int_or(j, "linear_num_key_heads", 0, where);
  c.linear_num_value_heads = get_int_or(j, "linear_num_value_heads", 0, where);
  c.linear_key_head_dim = get_int_or(j, "linear_key_head_dim", 0, where);
  c.linear_value_head_dim = get_int_or(j, "linear_value_head_dim", 0, where);
  c.linear_conv_kernel_dim = get_int_or(j, "linear_conv_kernel_dim", 0, where);

  // Newer transformers write RoPE settings as rope_parameters {"rope_type", "rope_theta"}.
  if (has(j, "rope_parameters")) {
    const auto& rp = j.at("rope_parameters");
    if (!rp.is_object()) throw Error(str(where, ": field \"rope_parameters\" must be an object, got ", rp.dump()));
    if (has(rp, "rope_type") && rp.at("rope_type") != "default")
      throw Error(str(where, ": rope_parameters.rope_type ", rp.at("rope_type").dump(),
                      " is unsupported (only plain RoPE: expected \"default\")"));
    if (has(rp, "partial_rotary_factor"))
      c.partial_rotary_factor = get_double_or(rp, "partial_rotary_factor", 1.0, where + " rope_parameters");
    // Qwen3.5's multimodal RoPE (mrope_section, interleaved): with the equal temporal, height and
    // width positions of text it is the 1-D RoPE computed here.
    if (has(rp, "rope_theta")) {
      const double theta = get_double_or(rp, "rope_theta", c.rope_theta, where + " rope_parameters");
      if (has(j, "rope_theta") && theta != c.rope_theta)
        throw Error(str(where, ": rope_theta ", c.rope_theta, " and rope_parameters.rope_theta ", theta, " disagree"));
      c.rope_theta = theta;
    }
  }
  if (has(j, "rope_scaling"))
    throw Error(str(where, ": rope_scaling ", j.at("rope_scaling").dump(),
                    " is unsupported (only plain RoPE; expected absent or null)"));
  if (get_bool_or(j, "attention_bias", false, where))
    throw Error(str(where, ": attention_bias = true is unsupported (expected false)"));
  if (get_bool_or(j, "mlp_bias", false, where))
    throw Error(str(where, ": mlp_bias = true is unsupported (expected false)"));
  if (has(j, "hidden_act") && j.at("hidden_act") != "silu")
    throw Error(str(where, ": hidden_act ", j.at("hidden_act").dump(), " is unsupported (expected \"silu\")"));
  if (get_bool_or(j, "use_sliding_window", false, where))
    throw Error(str(where, ": use_sliding_window = true is unsupported (expected false)"));

  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(str(where, ": ", e.what()));
  }
  return c;
}

}  // namespace tt::model
