#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hf_io.h"
#include "model/safetensors.h"
#include "base/check.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

const char* const kStateFile = "trainer_state.json";
const char* const kOptimFile = "optimizer.safetensors";
const char* const kConfigFile = "config.yaml";
const std::vector<std::string> kCheckpointFiles = {"config.json", "model.safetensors", kOptimFile, kStateFile,
                                                   kConfigFile};
constexpr int kStateVersion = 1;

void fsync_path(const fs::path& p, bool is_dir) {
  const int fd = ::open(p.c_str(), O_RDONLY | (is_dir ? O_DIRECTORY : 0));
  if (fd < 0) throw Error(str(p.string(), ": cannot open for fsync: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(str(p.string(), ": fsync failed: ", std::strerror(err)));
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error(str(p.string(), ": write failed"));
}

// step_<digits> -> step, else -1.
int64_t parse_step_dir(const std::string& name) {
  const std::string prefix = "step_";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 18) return -1;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(prefix.size()));
}

bool is_complete(const fs::path& dir) {
  for (const std::string& f : kCheckpointFiles)
    if (!fs::is_regular_file(dir / f)) return false;
  return true;
}

std::vector<model::StWriteTensor> optimizer_tensors(const std::vector<model::ParamInfo>& info,
                                                    const std::vector<float>& m, const std::vector<float>& v) {
  std::vector<model::StWriteTensor> out;
  for (const model::ParamInfo& p : info) {
    model::StWriteTensor t;
    t.shape = p.shape;
    t.name = "m." + p.name;
    t.f32 = m.data() + p.offset;
    out.push_back(t);
    t.name = "v." + p.name;
    t.f32 = v.data() + p.offset;
    out.push_back(t);
  }
  return out;
}

std::vector<float> read_moment(const std::map<std::string, model::StTensor>& tensors, const std::string& prefix,
                               const std::vector<model::ParamInfo>& info, int64_t n, const std::string& file) {
  std::vector<float> out(n);
  for (const model::ParamInfo& p : info) {
    const std::string name = prefix + p.name;
    auto it = tensors.find(name);
    if (it == tensors.end()) throw Error(str(file, ": missing tensor '", name, "'"));
    const model::StTensor& t = it->second;
    if (t.dtype != "F32") throw Error(str(file, ": tensor '", name, "' is ", t.dtype, ", expected F32"));
    if (t.shape != p.shape || (int64_t)t.values.size() != p.numel)
      throw Error(str(file, ": tensor '", name, "' has the wrong shape for parameter ", p.name));
    for (int64_t i = 0; i < p.numel; ++i) out[p.offset + i] = (float)t.values[i];
  }
  return out;
}

// Prefixes the file unless the message already names it.
Error naming(const std::string& file, const Error& e) {
  const std::string msg = e.what();
  return Error(msg.find(file) != std::string::npos ? msg : file + ": " + msg);
}

// The value at a dotted path of j ("loader.epoch"); errors name the file and the field.
const nlohmann::json& field_at(const nlohmann::json& j, const std::string& path, const std::string& file) {
  const nlohmann::json* v = &j;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string name = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (!v->is_object() || !v->contains(name)) throw Error(str(file, ": missing field \"", path, "\""));
    v = &v->at(name);
    if (dot == std::string::npos) return *v;
    at = dot + 1;
  }
}

int64_t int_field(const nlohmann::json& j, const std::string& path, const std::string& file, int64_t min) {
  const nlohmann::json& v = field_at(j, path, file);
  const bool ok = v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)INT64_MAX);
  if (!ok || v.get<int64_t>() < min)
    throw Error(str(file, ": field \"", path, "\": expected an integer >= ", min, ", got ", v.dump()));
  return v.get<int64_t>();
}

}  // namespace

TrainerState read_trainer_state(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw Error(str(file, ": cannot open"));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw Error(str(file, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(str(file, ": expected a JSON object, got ", j.type_name()));
  const int64_t version = int_field(j, "version", file, 0);
  if (version != kStateVersion) throw Error(str(file, ": field \"version\": ", version, ", expected ", kStateVersion));
  TrainerState st;
  st.step = int_field(j, "step", file, 0);
  st.loader.epoch = int_field(j, "loader.epoch", file, 0);
  st.loader.cursor = int_field(j, "loader.cursor", file, 0);
  const nlohmann::json& seed = field_at(j, "seed", file);
  if (!seed.is_number_unsigned() && !(seed.is_number_integer() && seed.get<int64_t>() >= 0))
    throw Error(str(file, ": field \"seed\": expected an integer >= 0, got ", seed.dump()));
  st.seed = seed.get<uint64_t>();
  const nlohmann::json& path = field_at(j, "data.path", file);
  if (!path.is_string()) throw Error(str(file, ": field \"data.path\": expected a string, got ", path.dump()));
  st.data_path = path.get<std::string>();
  st.data_size = int_field(j, "data.size_bytes", file, -1);
  return st;
}

std::string checkpoints_dir(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string save_checkpoint(const std::string& run_dir, const RunConfig& cfg, const Backend& backend,
                            const TrainerState& state) {
  const fs::path root = checkpoints_dir(run_dir);
  fs::create_directories(root);
  const std::string name = "step_" + std::to_string(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / ("." + name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  backend.save_hf(tmp.string());
  std::vector<float> m, v;
  backend.optim_state_host(&m, &v);
  model::write_safetensors((tmp / kOptimFile).string(), optimizer_tensors(backend.params_info(), m, v), "F32",
                           {{"step", std::to_string(state.step)}, {"format", "treetrain-adamw"}});
  write_file(tmp / kConfigFile, cfg.to_yaml());
  nlohmann::json j = {
      {"version", kStateVersion},
      {"step", state.step},
      {"loader", {{"epoch", state.loader.epoch}, {"cursor", state.loader.cursor}}},
      {"seed", state.seed},
      {"data", {{"path", state.data_path}, {"size_bytes", state.data_size}}},
      {"backend", backend.name()},
  };
  write_file(tmp / kStateFile, j.dump(2) + "\n");

  for (const auto& e : fs::directory_iterator(tmp))
    if (e.is_regular_file()) fsync_path(e.path(), false);
  fsync_path(tmp, true);
  if (!is_complete(tmp)) throw Error(str(tmp.string(), ": checkpoint is missing files after writing"));

  // Replacing an existing step_N: move it aside first, so step_N is always a complete folder.
  fs::path old;
  if (fs::exists(final_dir)) {
    old = root / ("." + name + ".old-" + std::to_string(::getpid()));
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root, true);
  if (!old.empty()) fs::remove_all(old);
  return final_dir.string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path root = checkpoints_dir(run_dir);
  if (!fs::is_directory(root)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const int64_t step = parse_step_dir(e.path().filename().string());
    if (step < 0 || !e.is_directory()) continue;
    if (!is_complete(e.path())) {
      spdlog::warn("ignoring incomplete checkpoint {}", e.path().string());
      continue;
    }
    out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = list_checkpoints(run_dir);
  return all.empty() ? "" : all.back().second;
}

TrainerState load_checkpoint(const std::string& dir, const RunConfig& cfg, Backend& backend) {
  const fs::path d = dir;
  // Trainer state.
  const std::string state_file = (d / kStateFile).string();
  const TrainerState st = read_trainer_state(state_file);
  // Same model.
  const std::string hf_config = (d / "config.json").string();
  model::ModelConfig saved;
  try {
    saved = model::read_hf_config(dir);
  } catch (const Error& e) {
    throw naming(hf_config, e);
  }
  const nlohmann::json a = saved.to_hf_json(), b = cfg.model.to_hf_json();
  if (a != b) {
    std::string diff;
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key()) || a.at(it.key()) != it.value())
        diff += str(" ", it.key(), ": checkpoint ", a.contains(it.key()) ? a.at(it.key()).dump() : "(none)",
                    ", config ", it.value().dump(), ";");
    throw Error(str(hf_config, ": the checkpoint's model differs from the model section:", diff));
  }
  // Same data.
  std::error_code ec;
  const auto size = fs::file_size(cfg.data.path, ec);
  if (!ec && st.data_size >= 0 && (int64_t)size != st.data_size)
    throw Error(str(state_file, ": written for data ", st.data_path, " (", st.data_size, " bytes), but data.path ",
                    cfg.data.path, " has ", size, " bytes; the loader position would not match"));
  if (st.data_path != cfg.data.path)
    spdlog::warn("checkpoint {} was written for data {}, resuming with {} (same size)", dir, st.data_path,
                 cfg.data.path);
  if (st.seed != cfg.train.seed)
    spdlog::warn("checkpoint {} used train.seed {}, the config says {}: the data order will differ", dir, st.seed,
                 cfg.train.seed);
  // Weights, then the optimizer state (load_hf resets it).
  try {
    backend.load_hf(dir);
  } catch (const Error& e) {
    throw naming((d / "model.safetensors").string(), e);
  }
  const std::string optim_file = (d / kOptimFile).string();
  std::map<std::string, model::StTensor> tensors;
  try {
    tensors = model::read_safetensors(optim_file);
  } catch (const Error& e) {
    throw naming(optim_file, e);
  }
  const auto& info = backend.params_info();
  std::vector<float> m = read_moment(tensors, "m.", info, backend.num_params(), optim_file);
  std::vector<float> v = read_moment(tensors, "v.", info, backend.num_params(), optim_file);
  backend.set_optim_state(m, v);
  return st;
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  if (keep <= 0) return;
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    spdlog::info("removing old checkpoint {}", all[i].second);
    fs::remove_all(all[i].second);
  }
}

}  // namespace tt::trainer
