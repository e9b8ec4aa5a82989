// Hugging Face directories: config.json + model.safetensors (or a sharded checkpoint with
// model.safetensors.index.json on read). Tensor names and shapes come from param_table().
#include "model/hf_io.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "base/check.h"
#include "base/json.h"
#include "base/files.h"
#include "model/safetensors.h"

namespace tt::model {

namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += str(i ? ", " : "", s[i]);
  return r + ")";
}

// Tensors of a SigLIP checkpoint that LLaVA never reads (the pooling head, post_layernorm), by
// table name: skipped on read.
bool unused_by_llava(const std::string& name) {
  const std::string tower = "model.vision_tower.vision_model.";
  return name.rfind(tower + "head.", 0) == 0 || name.rfind(tower + "post_layernorm.", 0) == 0;
}

bool starts(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

}  // namespace

// A VLA is written as transformers 5.17 writes LlavaForConditionalGeneration (the layout older
// releases read too): language_model.model.* and language_model.lm_head.weight for the decoder,
// vision_tower.* (no vision_model level) for the SigLIP tower, multi_modal_projector.*, and our
// state_projector.*.
std::string hf_tensor_name(const ModelConfig& cfg, const std::string& name) {
  if (!cfg.vision.enabled()) return name;
  const std::string tower = "model.vision_tower.vision_model.";
  if (starts(name, tower)) return "vision_tower." + name.substr(tower.size());
  for (const char* own : {"model.multi_modal_projector.", "model.state_projector."})
    if (starts(name, own)) return name.substr(6);
  if (starts(name, "model.")) return "language_model." + name;
  return "language_model." + name;  // lm_head.weight
}

std::string table_tensor_name(const ModelConfig& cfg, const std::string& file_name) {
  if (!cfg.vision.enabled()) return file_name;
  std::string n = file_name;
  // transformers' in-memory prefix (model.language_model.*, model.vision_tower.*, ...) and the
  // on-disk one (language_model.model.*, vision_tower.*, ...) both name the same tensors.
  if (starts(n, "model.language_model.")) return "model." + n.substr(21);
  if (starts(n, "language_model.model.")) return "model." + n.substr(21);
  if (starts(n, "language_model.lm_head.")) return n.substr(15);
  if (starts(n, "model.")) n = n.substr(6);
  if (starts(n, "vision_tower.vision_model.")) return "model.vision_tower.vision_model." + n.substr(26);
  if (starts(n, "vision_tower.")) return "model.vision_tower.vision_model." + n.substr(13);
  if (starts(n, "multi_modal_projector.") || starts(n, "state_projector.")) return "model." + n;
  return file_name;
}

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return ModelConfig::from_hf_json(read_json_file(path), path);
}

namespace {

// config.json, then model.safetensors of `table`'s tensors, each's values set by set_source(t, p).
template <class SetSource>
void write_hf(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table,
              const std::string& dtype, SetSource set_source) {
  TT_CHECK(dtype == "F32" || dtype == "BF16", "save_hf: dtype must be \"F32\" or \"BF16\", got \"", dtype, "\"");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str(dir, ": cannot create directory: ", ec.message()));
  const std::string torch_dtype = dtype == "F32" ? "float32" : "bfloat16";
  write_text_atomic((fs::path(dir) / "config.json").string(),
                    cfg.to_hf_json(torch_dtype).dump(2) + "\n");
  std::vector<StWriteTensor> tensors;
  for (const ParamInfo& p : table) {
    StWriteTensor t;
    t.name = hf_tensor_name(cfg, p.name);
    t.shape = p.shape;
    set_source(t, p);
    tensors.push_back(std::move(t));
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, dtype, {{"format", "pt"}});
}

}  // namespace

template <class T>
void save_hf(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table, const T* params,
             const std::string& dtype) {
  write_hf(dir, cfg, table, dtype, [params](StWriteTensor& t, const ParamInfo& p) {
    if constexpr (std::is_same_v<T, float>) {
      t.f32 = params + p.offset;
    } else {
      t.f64 = params + p.offset;
    }
  });
}

void save_hf(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table,
             const ParamReader& slice, const std::string& dtype) {
  write_hf(dir, cfg, table, dtype, [&slice](StWriteTensor& t, const ParamInfo& p) {
    t.fill = [&slice, offset = p.offset](int64_t first, int64_t n, float* dst) { slice(offset + first, n, dst); };
  });
}

namespace {

// Files to read: model.safetensors, or the shards named by model.safetensors.index.json.
std::vector<std::string> weight_files(const std::string& dir) {
  std::vector<std::string> files;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    files.push_back(single.string());
  } else if (fs::exists(index)) {
    const nlohmann::json j = read_json_file(index.string());
    if (!j.contains("weight_map") || !j.at("weight_map").is_object())
      throw Error(str(index.string(), ": missing \"weight_map\" object"));
    std::set<std::string> shards;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      if (!file.is_string()) throw Error(str(index.string(), ": weight_map entry \"", name, "\" is not a file name"));
      shards.insert(file.template get<std::string>());
    }
    for (const std::string& s : shards) files.push_back((fs::path(dir) / s).string());
  } else {
    throw Error(str(single.string(), ": not found (nor ", index.string(), ")"));
  }
  return files;
}

// The table entry a file's tensor loads into, or null for one the model ignores (a tied head, a
// tower part LLaVA never reads); a tensor the model does not have, of another shape, or in two
// shards is an error naming the file. `loaded` collects the entries seen.
const ParamInfo* entry_for(const ModelConfig& cfg, const std::map<std::string, const ParamInfo*>& wanted,
                           const std::string& file, const std::string& name, const std::vector<int64_t>& shape,
                           std::set<std::string>* loaded) {
  const std::string own = table_tensor_name(cfg, name);
  auto it = wanted.find(own);
  if (it == wanted.end()) {
    if (cfg.tie_word_embeddings && own == "lm_head.weight") return nullptr;
    if (cfg.vision.enabled() && unused_by_llava(own)) return nullptr;
    throw Error(str(file, ": unexpected tensor \"", name, "\" for a ", cfg.architecture, " model",
                    cfg.tie_word_embeddings ? " with tied embeddings" : ""));
  }
  const ParamInfo& p = *it->second;
  if (shape != p.shape)
    throw Error(str(file, ": tensor \"", name, "\" has shape ", shape_str(shape), ", expected ", shape_str(p.shape)));
  if (!loaded->insert(p.name).second) throw Error(str(file, ": tensor \"", name, "\" appears in two shards"));
  return &p;
}

std::map<std::string, const ParamInfo*> by_name(const std::vector<ParamInfo>& table) {
  std::map<std::string, const ParamInfo*> wanted;
  for (const ParamInfo& p : table) wanted[p.name] = &p;
  return wanted;
}

void expect_all_loaded(const std::string& dir, const std::vector<std::string>& files, const ModelConfig& cfg,
                       const std::vector<ParamInfo>& table, const std::set<std::string>& loaded) {
  for (const ParamInfo& p : table)
    if (!loaded.count(p.name))
      throw Error(str(files.size() == 1 ? files[0] : dir, ": missing tensor \"", hf_tensor_name(cfg, p.name),
                      "\" with shape ", shape_str(p.shape)));
}

}  // namespace

void check_hf_weight_shapes(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table) {
  const std::vector<std::string> files = weight_files(dir);
  const std::map<std::string, const ParamInfo*> wanted = by_name(table);
  std::set<std::string> loaded;
  for (const std::string& file : files)
    for (const auto& [name, t] : read_safetensors_shapes(file)) entry_for(cfg, wanted, file, name, t.shape, &loaded);
  expect_all_loaded(dir, files, cfg, table, loaded);
}

template <class T>
void load_hf_weights_into(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table,
                          T* params) {
  const std::vector<std::string> files = weight_files(dir);
  const std::map<std::string, const ParamInfo*> wanted = by_name(table);
  std::set<std::string> loaded;
  for (const std::string& file : files) {  // a tensor at a time into its place (not the file as doubles)
    SafetensorsReader st(file);
    for (const auto& [name, t] : st.tensors())
      if (const ParamInfo* p = entry_for(cfg, wanted, file, name, t.shape, &loaded)) st.read(name, params + p->offset);
  }
  expect_all_loaded(dir, files, cfg, table, loaded);
}

template <class T>
void load_hf_weights(const std::string& dir, const ModelConfig& cfg, const std::vector<ParamInfo>& table, T* params) {
  int64_t n = 0;
  for (const ParamInfo& p : table) n = std::max(n, p.offset + p.numel);
  // Staged so that a failed load leaves the parameters untouched.
  std::vector<T> staged(params, params + n);
  load_hf_weights_into(dir, cfg, table, staged.data());
  std::copy(staged.begin(), staged.end(), params);
}

template void save_hf<float>(const std::string&, const ModelConfig&, const std::vector<ParamInfo>&, const float*,
                             const std::string&);
template void save_hf<double>(const std::string&, const ModelConfig&, const std::vector<ParamInfo>&, const double*,
                              const std::string&);
template void load_hf_weights<float>(const std::string&, const ModelConfig&, const std::vector<ParamInfo>&, float*);
template void load_hf_weights_into<float>(const std::string&, const ModelConfig&, const std::vector<ParamInfo>&, float*);
template void load_hf_weights<double>(const std::string&, const ModelConfig&, const std::vector<ParamInfo>&, double*);

}  // namespace tt::model
