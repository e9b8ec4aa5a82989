// Hugging Face layout directories: config.json + model.safetensors with HF tensor names.
// A checkpoint written here loads in transformers (Qwen3ForCausalLM / LlamaForCausalLM; with a
// vision section LlavaForConditionalGeneration: the SigLIP tower, the projector, the decoder as
// text_config; a SigLIP checkpoint's pooling head and post_layernorm, which LLaVA never reads,
// are skipped on read), and a
// model they write loads here (`model.init_from: DIR`). With tied embeddings lm_head.weight is
// not written, and is ignored when present on read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/decoder.h"
#include "model/param_table.h"

namespace tt::model {

// The name of table tensor `name` in the HF layout: itself, except for a VLA
// (LlavaForConditionalGeneration as transformers writes it: language_model.model.*,
// language_model.lm_head.weight, vision_tower.*, multi_modal_projector.*; ours: state_projector.*).
std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name);
// The table name of a tensor named `file_name` in an HF file (a VLA's on-disk or in-memory
// transformers names, with or without SiglipVisionModel's vision_model level); other names as they are.
std::string table_tensor_name(const ModelConfig& cfg, const std::string& file_name);

// Reads DIR/config.json. Throws tt::Error naming the file.
ModelConfig read_hf_config(const std::string& dir);

// Writes config.json and model.safetensors (dtype "F32" or "BF16") into dir (created): the
// tensors of `table` read from the flat host buffer `params` (table offsets).
template <class T>
void save_hf(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table, const T* params,
             const std::string& dtype);
// The same with the flat parameters read through slice(offset, n, dst), [offset, offset + n) into
// dst a piece of at most 2^20 at a time (a device's weights saved without a host copy of them whole).
using ParamReader = std::function<void(int64_t offset, int64_t n, float* dst)>;
void save_hf(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table,
             const ParamReader& slice, const std::string& dtype);

// Loads DIR/model.safetensors (or the shards named by DIR/model.safetensors.index.json) into the
// flat host buffer `params` (table offsets); every parameter must be present with the right
// shape, and other tensors are errors except lm_head.weight of a tied model (errors name the
// tensor and the file). On error `params` is unchanged.
template <class T>
void load_hf_weights(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table, T* params);
// The same without the staging copy: straight into `params`, which on error holds part of the
// files (for a caller's own scratch buffer, Backend::load_hf: one host copy of the weights).
template <class T>
void load_hf_weights_into(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table,
                          T* params);

// The same checks from the safetensors headers alone (no values read, nothing of the model's size
// allocated): every tensor of `table` present once with its shape, no unexpected one, with
// load_hf_weights' messages. Run before building a model from a checkpoint's config.json
// (trainer's read_checkpoint_config), so weights of other shapes (or a config.json edited to a
// huge vocabulary) are named before gigabytes are allocated.
void check_hf_weight_shapes(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table);

// The same for a CPU decoder's own parameters.
template <class T>
void save_hf(const std::string& dir, const Model<T>& model, const std::string& dtype) {
  save_hf(dir, model.config(), model.params_info(), model.params(), dtype);
}
template <class T>
void load_hf_weights(const std::string& dir, Model<T>& model) {
  load_hf_weights(dir, model.config(), model.params_info(), model.params());
}

}  // namespace tt::model
