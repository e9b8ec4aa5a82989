// Checkpoints: atomic writes, the manifest, validity checks and resume (see checkpoint.h).
#include "trainer/checkpoint.h"

#include <nettle/sha2.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/hf_io.h"
#include "model/safetensors.h"
#include "base/check.h"
#include "base/json.h"
#include "base/crc.h"
#include "base/files.h"
#include "trainer/gemm_tuning.h"
#include "trainer/run_dir.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

const char* const kStateFile = "trainer_state.json";
const char* const kModelFile = "model.safetensors";
const char* const kOptimFile = "optimizer.safetensors";
const char* const kConfigFile = "config.yaml";
// Files every checkpoint holds besides trainer_state.json (a version 2 manifest lists at least these).
const std::vector<std::string> kRequiredFiles = {"config.json", kModelFile, kOptimFile, kConfigFile};

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
  if (name[prefix.size()] == '0' && name.size() > prefix.size() + 1) return -1;  // step_002: not a name treetrain writes
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(prefix.size()));
}

bool is_complete(const fs::path& dir) {
  for (const std::string& f : kRequiredFiles)
    if (!fs::is_regular_file(dir / f)) return false;
  return fs::is_regular_file(dir / kStateFile);
}

// The optimizer file's tensors, "m.<name>" and "v.<name>" of each parameter, filled from the
// backend a piece at a time (no host copy of the whole state).
std::vector<model::StWriteTensor> optimizer_tensors(const Backend& backend) {
  std::vector<model::StWriteTensor> out;
  for (const model::ParamInfo& p : backend.params_info())
    for (const bool second : {false, true}) {
      model::StWriteTensor t;
      t.shape = p.shape;
      t.name = (second ? "v." : "m.") + p.name;
      t.fill = [&backend, second, offset = p.offset](int64_t first, int64_t n, float* dst) {
        backend.optim_slice_host(second, offset + first, n, dst);
      };
      out.push_back(std::move(t));
    }
  return out;
}

// Checks that the optimizer file holds an F32 "m.<name>" and "v.<name>" of each parameter's shape
// (before anything of the backend changes); returns the largest parameter's element count.
int64_t check_moments(const model::SafetensorsReader& st, const std::vector<model::ParamInfo>& info) {
  int64_t largest = 0;
  for (const model::ParamInfo& p : info) {
    for (const char* prefix : {"m.", "v."}) {
      const std::string name = prefix + p.name;
      auto it = st.tensors().find(name);
      if (it == st.tensors().end()) throw Error(str(st.path(), ": missing tensor '", name, "'"));
      const model::StTensor& t = it->second;
      if (t.dtype != "F32") throw Error(str(st.path(), ": tensor '", name, "' is ", t.dtype, ", expected F32"));
      if (t.shape != p.shape)
        throw Error(str(st.path(), ": tensor '", name, "' has the wrong shape for parameter ", p.name));
    }
    largest = std::max(largest, p.numel);
  }
  return largest;
}

// The optimizer state into the backend a parameter at a time (two buffers of the largest
// parameter's size on the host, not the whole state). A negative second moment (a damaged file,
// finite) would make the update's square root NaN a step later, blamed on the update: an error
// naming the tensor and the element.
void load_moments(model::SafetensorsReader& st, const std::vector<model::ParamInfo>& info, Backend& backend) {
  const int64_t largest = check_moments(st, info);
  std::vector<float> m((size_t)largest), v((size_t)largest);
  for (const model::ParamInfo& p : info) {
    st.read("m." + p.name, m.data());
    st.read("v." + p.name, v.data());
    for (int64_t i = 0; i < p.numel; ++i)
      if (v[i] < 0)
        throw Error(str(st.path(), ": tensor 'v.", p.name, "' element ", i, " is ", (double)v[i],
                        ", expected >= 0 (a second moment is an average of squared gradients)"));
    backend.set_optim_slice(p.offset, m.data(), v.data(), p.numel);
  }
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

// The format version of a trainer_state.json object: 1 without "version" (or with 1), 2 with the
// manifest; a newer one is refused.
int64_t state_version(const nlohmann::json& j, const std::string& file) {
  if (!j.contains("version")) return 1;
  const int64_t v = int_field(j, "version", file, 1);
  if (v > kCheckpointVersion)
    throw Error(str(file, ": checkpoint format version ", v, " is newer than this treetrain reads (1 to ",
                    kCheckpointVersion, "); resume it with the treetrain that wrote it, or a newer one"));
  return v;
}

// What is wrong with the tensors `want` (name -> shape, F32) in safetensors `file` ("" when
// nothing), from its header alone: present, F32, the shape, the data inside the file.
std::string tensors_problem(const fs::path& file,
                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& want) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) return str(file.string(), ": ", ec.message());
  std::ifstream in(file, std::ios::binary);
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) return str(file.string(), ": shorter than a safetensors header");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > size - 8 || header_len > (uint64_t{100} << 20))
    return str(file.string(), ": header of ", header_len, " bytes in a file of ", size);
  std::string text(header_len, '\0');
  if (!in.read(text.data(), (std::streamsize)header_len)) return str(file.string(), ": cannot read the header");
  const nlohmann::json h = parse_json_or_discarded(text);
  if (!h.is_object()) return str(file.string(), ": the header is not a JSON object");
  const uint64_t data_len = size - 8 - header_len;
  for (const auto& [name, shape] : want) {
    if (!h.contains(name)) return str(file.string(), ": no tensor '", name, "'");
    const nlohmann::json& t = h.at(name);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const bool typed = t.is_object() && t.contains("dtype") && t.at("dtype") == "F32" && t.contains("shape") &&
                       t.at("shape").is_array() && t.contains("data_offsets") && t.at("data_offsets").is_array() &&
                       t.at("data_offsets").size() == 2 && t.at("data_offsets")[0].is_number_unsigned() &&
                       t.at("data_offsets")[1].is_number_unsigned();
    if (!typed) return str(file.string(), ": tensor '", name, "' is not an F32 entry with shape and data_offsets");
    if (t.at("shape") != nlohmann::json(shape))
      return str(file.string(), ": tensor '", name, "' has shape ", t.at("shape").dump(), ", the model's is ",
                 nlohmann::json(shape).dump());
    const uint64_t b = t.at("data_offsets")[0].get<uint64_t>(), e = t.at("data_offsets")[1].get<uint64_t>();
    if (b > e || e - b != (uint64_t)numel * 4 || e > data_len)
      return str(file.string(), ": tensor '", name, "' has data [", b, ", ", e, ") in a data buffer of ", data_len,
                 " bytes");
  }
  return "";
}

// A leftover of a checkpoint write or removal: ".step_<N>.<kind>-<pid>" -> (N, kind, pid); N < 0
// when the name is not one.
struct Leftover {
  int64_t step = -1;
  std::string kind;  // "tmp" | "old" | "deleting"
  int64_t pid = -1;
};

Leftover parse_leftover(const std::string& name) {
  Leftover l;
  if (name.rfind(".step_", 0) != 0) return l;
  const size_t dot = name.find('.', 1), dash = name.rfind('-');
  if (dot == std::string::npos || dash == std::string::npos || dash < dot) return l;
  const int64_t step = parse_step_dir(name.substr(1, dot - 1));
  const std::string kind = name.substr(dot + 1, dash - dot - 1), pid = name.substr(dash + 1);
  if (step < 0 || (kind != "tmp" && kind != "old" && kind != "deleting") || pid.empty() || pid.size() > 9 ||
      pid.find_first_not_of("0123456789") != std::string::npos)
    return l;
  l.step = step;
  l.kind = kind;
  l.pid = std::stoll(pid);
  return l;
}

// Whether `pid` may still be writing: another live process of this host. This process at start
// writes nothing yet, so a leftover named with its own pid (a container reusing pids) is stale.
bool pid_in_progress(int64_t pid) {
  if (pid <= 0 || pid == (int64_t)::getpid()) return false;
  return ::kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

// A step_N folder missing some of its files and older than a valid checkpoint: what an
// interrupted removal (of an older treetrain, which removed step_N in place) leaves.
bool half_deleted(const fs::path& dir) {
  std::vector<std::string> expected = kRequiredFiles;
  if (fs::is_regular_file(dir / kStateFile)) {
    try {
      const TrainerState st = read_trainer_state((dir / kStateFile).string());
      for (const auto& [name, bytes] : st.files) expected.push_back(name);
    } catch (const Error&) {
      return false;  // not a removal: its state is there but unreadable
    }
  } else {
    expected.push_back(kStateFile);
  }
  for (const std::string& f : expected)
    if (!fs::exists(dir / f)) return true;
  return false;
}

// A step_N folder renamed aside: step_N.invalid-<UTC time>[-k].
fs::path aside_name(const fs::path& dir) {
  const std::string stamp = utc_stamp();
  fs::path out = dir.string() + ".invalid-" + stamp;
  for (int k = 2; fs::exists(out); ++k) out = dir.string() + ".invalid-" + stamp + "-" + std::to_string(k);
  return out;
}

}  // namespace

TrainerState read_trainer_state(const std::string& file) {
  const nlohmann::json j = read_json_file(file);
  if (!j.is_object()) throw Error(str(file, ": expected a JSON object, got ", j.type_name()));
  TrainerState st;
  st.version = state_version(j, file);
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
  if (j.at("data").is_object() && j.at("data").contains("sha256")) {
    const nlohmann::json& h = j.at("data").at("sha256");
    if (!h.is_string() || h.get<std::string>().size() != 64 ||
        h.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
      throw Error(str(file, ": field \"data.sha256\": expected 64 lowercase hex digits, got ", h.dump()));
    st.data_sha256 = h.get<std::string>();
  }
  if (j.at("data").is_object() && j.at("data").contains("cameras")) {
    st.cameras = int_field(j, "data.cameras", file, 1);
    if (st.cameras > 4096)
      throw Error(str(file, ": field \"data.cameras\": expected 1 to 4096 images a step, got ", st.cameras));
  }
  if (j.contains("skipped")) {
    st.skipped_steps = int_field(j, "skipped.total", file, 0);
    st.consecutive_skips = int_field(j, "skipped.in_a_row", file, 0);
    if (st.consecutive_skips > st.skipped_steps)
      throw Error(str(file, ": field \"skipped.in_a_row\": expected at most skipped.total (", st.skipped_steps,
                      "), got ", st.consecutive_skips));
  }
  if (st.version >= 2) {
    const nlohmann::json& files = field_at(j, "files", file);
    if (!files.is_object()) throw Error(str(file, ": field \"files\": expected an object, got ", files.dump()));
    for (const auto& [name, entry] : files.items()) {
      if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name == kStateFile)
        throw Error(str(file, ": field \"files\": '", name, "' is not a file name of the checkpoint"));
      const bool ok = entry.is_object() && entry.contains("bytes") && entry.at("bytes").is_number_unsigned() &&
                      entry.at("bytes").get<uint64_t>() <= (uint64_t)INT64_MAX &&
                      (!entry.contains("crc32") ||
                       (entry.at("crc32").is_string() && parse_crc32_hex(entry.at("crc32").get<std::string>()) >= 0));
      if (!ok)
        throw Error(str(file, ": field \"files\": '", name,
                        "': expected {\"bytes\": <integer >= 0>, \"crc32\": \"<8 lowercase hex digits>\" (optional)}, got ",
                        entry.dump()));
      st.files[name] = entry.at("bytes").get<int64_t>();
      if (entry.contains("crc32")) st.file_crc[name] = (uint32_t)parse_crc32_hex(entry.at("crc32").get<std::string>());
    }
    for (const std::string& f : kRequiredFiles)
      if (!st.files.count(f)) throw Error(str(file, ": field \"files\": the manifest does not list ", f));
  }
  return st;
}

std::string checkpoints_dir(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string save_checkpoint(const std::string& run_dir, const RunConfig& cfg, const Backend& backend,
                            const TrainerState& state, const std::string& gemm_tuning,
                            const std::string& action_bins) {
  const fs::path root = checkpoints_dir(run_dir);
  const std::string name = "step_" + std::to_string(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / ("." + name + ".tmp-" + std::to_string(::getpid()));
  // Written into tmp: a failure (a full disk) removes what it wrote and names the checkpoint; the
  // earlier checkpoints are untouched.
  try {
    fs::create_directories(root);
    fs::remove_all(tmp);
    fs::create_directories(tmp);

    backend.save_hf(tmp.string());
    model::write_safetensors((tmp / kOptimFile).string(), optimizer_tensors(backend), "F32",
                             {{"step", std::to_string(state.step)}, {"format", "treetrain-adamw"}});
    write_file(tmp / kConfigFile, cfg.to_yaml());
    if (!gemm_tuning.empty()) write_file(tmp / kGemmTuningFile, gemm_tuning);  // listed by the manifest
    if (!action_bins.empty()) write_file(tmp / "action_bins.json", action_bins);
    nlohmann::json files = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(tmp))
      if (e.is_regular_file())
        files[e.path().filename().string()] = {{"bytes", (int64_t)e.file_size()},
                                               {"crc32", crc32_hex(file_crc32(e.path().string()))}};
    nlohmann::json data = {{"path", state.data_path}, {"size_bytes", state.data_size}};
    if (!state.data_sha256.empty()) data["sha256"] = state.data_sha256;
    if (state.cameras > 0) data["cameras"] = state.cameras;
    nlohmann::json j = {
        {"version", kCheckpointVersion},
        {"step", state.step},
        {"loader", {{"epoch", state.loader.epoch}, {"cursor", state.loader.cursor}}},
        {"seed", state.seed},
        {"data", data},
        {"backend", backend.name()},
        {"skipped", {{"total", state.skipped_steps}, {"in_a_row", state.consecutive_skips}}},
        {"files", files},
    };
    write_file(tmp / kStateFile, j.dump(2) + "\n");

    for (const auto& e : fs::directory_iterator(tmp))
      if (e.is_regular_file()) fsync_path(e.path().string(), false);
    fsync_path(tmp.string(), true);
    if (!is_complete(tmp)) throw Error(str(tmp.string(), ": checkpoint is missing files after writing"));
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw Error(str("checkpoint ", final_dir.string(), " not written: ", e.what(),
                    " (its partial files are removed; earlier checkpoints are kept)"));
  }

  // Replacing an existing step_N: move it aside first, so step_N is always a complete folder.
  fs::path old;
  if (fs::exists(final_dir)) {
    old = root / ("." + name + ".old-" + std::to_string(::getpid()));
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_path(root.string(), true);
  if (!old.empty()) fs::remove_all(old);
  return final_dir.string();
}

std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const fs::path root = checkpoints_dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root)) {
    const int64_t step = parse_step_dir(e.path().filename().string());
    if (step >= 0 && e.is_directory()) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string checkpoint_problem(const std::string& dir, const model::ModelConfig* model,
                               const std::vector<model::ParamInfo>* params, bool contents) {
  const fs::path d = dir;
  const int64_t step = parse_step_dir(d.filename().string());
  if (step < 0) return str(dir, ": not a step_<N> folder");
  const std::string state_file = (d / kStateFile).string();
  if (!fs::is_regular_file(d / kStateFile)) return str(state_file, ": missing");
  {  // A newer version is an error, not a problem of the checkpoint.
    std::ifstream in(state_file);
    std::ostringstream text;
    text << in.rdbuf();
    const nlohmann::json j = parse_json_or_discarded(text.str());
    if (j.is_object() && j.contains("version") && j.at("version").is_number_integer() &&
        j.at("version").get<int64_t>() > kCheckpointVersion)
      state_version(j, state_file);
  }
  TrainerState st;
  try {
    st = read_trainer_state(state_file);
  } catch (const Error& e) {
    return e.what();
  }
  if (st.step != step) return str(state_file, ": says step ", st.step, ", but the folder is step_", step);
  if (st.version >= 2) {
    for (const auto& [name, bytes] : st.files) {
      std::error_code ec;
      const uint64_t size = fs::file_size(d / name, ec);
      if (ec) return str((d / name).string(), ": listed in the manifest, but ", ec.message());
      if ((int64_t)size != bytes) return str((d / name).string(), ": ", size, " bytes, the manifest says ", bytes);
    }
  } else {
    for (const std::string& f : kRequiredFiles)
      if (!fs::is_regular_file(d / f)) return str((d / f).string(), ": missing");
  }
  if (model == nullptr || params == nullptr) return "";
  model::ModelConfig saved;
  try {
    saved = model::read_hf_config(dir);
  } catch (const Error& e) {
    return naming((d / "config.json").string(), e).what();
  }
  // The contents: each file as it was written (a size alone misses bytes changed in place); a
  // file that cannot be read (a bad sector, a folder renamed meanwhile) is this checkpoint's
  // problem too.
  if (contents)
    for (const auto& [name, want] : st.file_crc) {
      uint32_t got = 0;
      try {
        got = file_crc32((d / name).string());
      } catch (const Error& e) {
        return e.what();
      }
      if (got != want)
        return str((d / name).string(), ": its CRC-32 is ", crc32_hex(got), ", the manifest says ", crc32_hex(want),
                   " (the file changed after it was written)");
    }
  if (saved.to_hf_json() != model->to_hf_json()) return "";  // another model: load_checkpoint names the difference
  std::vector<std::pair<std::string, std::vector<int64_t>>> weights, moments;
  for (const model::ParamInfo& p : *params) {
    weights.emplace_back(model::hf_tensor_name(*model, p.name), p.shape);  // the HF layout's names
    moments.emplace_back("m." + p.name, p.shape);
    moments.emplace_back("v." + p.name, p.shape);
  }
  std::string problem = tensors_problem(d / kModelFile, weights);
  if (problem.empty()) problem = tensors_problem(d / kOptimFile, moments);
  return problem;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [step, path] : step_folders(run_dir)) {
    try {
      if (checkpoint_problem(path).empty()) out.emplace_back(step, path);
    } catch (const Error&) {
      // A newer format version: not this treetrain's to count or remove.
    }
  }
  return out;
}

void clean_checkpoint_leftovers(const std::string& run_dir) {
  std::error_code ec;
  const fs::path root = checkpoints_dir(run_dir);
  if (fs::is_directory(root, ec)) {
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(root)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      const Leftover l = parse_leftover(p.filename().string());
      if (l.step < 0 || pid_in_progress(l.pid)) continue;
      const fs::path step_dir = root / ("step_" + std::to_string(l.step));
      if (l.kind == "old" && !fs::exists(step_dir)) {
        // The write of a new step_N stopped between moving the old one aside and renaming the new
        // one in: the old one is whole (the new one, .tmp-, goes below or went already).
        fs::rename(p, step_dir);
        spdlog::warn("restored checkpoint {} from {}, left by process {} (gone)", step_dir.string(), p.string(), l.pid);
        continue;
      }
      fs::remove_all(p);
      spdlog::info("removed {}, left by process {} (gone)", p.string(), l.pid);
    }
    const auto valid = list_checkpoints(run_dir);
    if (!valid.empty())
      for (const auto& [step, path] : step_folders(run_dir))
        if (step < valid.back().first && half_deleted(path) && checkpoint_problem(path) != "") {
          fs::remove_all(path);
          spdlog::info("removed {}: a half-deleted checkpoint (files missing) older than {}", path,
                       valid.back().second);
        }
  }
  // An atomic write of treetrain's own into the run folder (metrics.jsonl's rewrite, the GEMM
  // tuning table, a dropped-metrics file: base/files.h) stopped before its rename. Only those
  // names: run_dir may be on a filesystem other hosts write too, whose pids this host cannot see.
  auto ours = [](const std::string& name, long pid) {
    for (const char* file : {"metrics.jsonl", kGemmTuningFile})
      if (name == atomic_temp_path(file, pid)) return true;
    return name.rfind(".metrics.jsonl.dropped-", 0) == 0;
  };
  if (fs::is_directory(run_dir, ec))
    for (const auto& e : fs::directory_iterator(run_dir)) {
      const std::string name = e.path().filename().string();
      const long pid = atomic_temp_pid(name);
      if (pid < 0 || !ours(name, pid) || !e.is_regular_file(ec) || pid_in_progress(pid)) continue;
      fs::remove(e.path(), ec);
      spdlog::info("removed {}, left by process {} (gone)", e.path().string(), pid);
    }
}

std::string resume_checkpoint(const std::string& run_dir, const model::ModelConfig& model,
                              const std::vector<model::ParamInfo>& params) {
  auto folders = step_folders(run_dir);
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    const std::string problem = checkpoint_problem(it->second, &model, &params);
    if (problem.empty()) return it->second;
    const fs::path aside = aside_name(it->second);
    std::error_code ec;
    fs::rename(it->second, aside, ec);
    if (ec)
      throw Error(str(it->second, ": invalid (", problem, "), and it cannot be moved aside to ", aside.string(), ": ",
                      ec.message()));
    spdlog::warn("checkpoint {} is invalid ({}); moved it aside to {}", it->second, problem, aside.string());
  }
  return "";
}

std::string invalid_checkpoints_summary(const std::string& run_dir) {
  const auto folders = step_folders(run_dir);
  if (folders.empty()) return "";
  std::string why;
  try {
    why = checkpoint_problem(folders.back().second);
  } catch (const Error& e) {  // a newer format version
    why = e.what();
  }
  return str(folders.size(), " checkpoint folder", folders.size() == 1 ? "" : "s", ", none of them valid (newest ",
             folders.back().second, ": ", why, ")");
}

std::string latest_checkpoint(const std::string& run_dir) {
  const auto all = list_checkpoints(run_dir);
  return all.empty() ? "" : all.back().second;
}

std::string settings_changed_since(const std::string& dir, const RunConfig& cfg) {
  const std::string file = (fs::path(dir) / kConfigFile).string();
  if (!fs::is_regular_file(file)) return "";
  RunConfig saved;
  try {
    // Its model section is written out whole: init_from (which may have moved since) is not read.
    saved = parse_config_text(read_text(file, "the checkpoint's config"), file, {"model.init_from="});
  } catch (const Error& e) {
    spdlog::warn("{}: cannot compare the run's settings with it: {}", file, e.what());
    return "";
  }
  auto left_out = [](const std::string& key) {
    for (const char* prefix : {"model.", "vision.", "distributed."})
      if (key.rfind(prefix, 0) == 0) return true;
    for (const char* k : {"run_dir", "device", "data.path", "train.seed", "train.resume", "train.checkpoint_every",
                          "train.keep_checkpoints", "train.log_every", "train.final_checkpoint", "train.gemm_autotune",
                          "partition.recompute"})  // memory against time only: the same gradients
      if (key == k) return true;
    return false;
  };
  const auto then = saved.values(), now = cfg.values();
  std::string out;
  for (size_t k = 0; k < then.size() && k < now.size(); ++k)
    if (then[k].second != now[k].second && !left_out(then[k].first))
      out += str(" ", then[k].first, ": ", then[k].second, " -> ", now[k].second, ";");
  return out;
}

std::string file_sha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str(path, ": cannot open for reading: ", std::strerror(errno)));
  sha256_ctx ctx;
  sha256_init(&ctx);
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), (std::streamsize)buf.size());
    if (in.gcount() > 0) sha256_update(&ctx, (size_t)in.gcount(), reinterpret_cast<const uint8_t*>(buf.data()));
  }
  if (in.bad()) throw Error(str(path, ": read failed"));
  uint8_t digest[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, digest);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : digest) hex += {kHex[b >> 4], kHex[b & 15]};
  return hex;
}

TrainerState load_checkpoint(const std::string& dir, const RunConfig& cfg, Backend& backend,
                             const std::function<std::string()>& data_sha256) {
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
  if (!st.data_sha256.empty()) {
    const std::string now = data_sha256();
    if (st.data_sha256 != now)
      throw Error(str(state_file, ": written for data ", st.data_path, " (sha256 ", st.data_sha256, "), but data.path ",
                      cfg.data.path, " holds other content of the same size (sha256 ", now,
                      "); the loader position would not match"));
  }
  if (st.data_path != cfg.data.path)
    spdlog::warn("checkpoint {} was written for data {}, resuming with {} ({})", dir, st.data_path, cfg.data.path,
                 st.data_sha256.empty() ? "same size" : "same content");
  if (st.seed != cfg.train.seed)
    spdlog::warn("checkpoint {} used train.seed {}, the config says {}: the data order will differ", dir, st.seed,
                 cfg.train.seed);
  if (const std::string changed = settings_changed_since(dir, cfg); !changed.empty())
    spdlog::warn("resuming {} with settings that differ from its config.yaml:{} (data.shuffle and train.seed change "
                 "the data order from here on, the others what the remaining steps train)",
                 dir, changed);
  // Weights, then the optimizer state (load_hf resets it).
  try {
    backend.load_hf(dir);
  } catch (const Error& e) {
    throw naming((d / "model.safetensors").string(), e);
  }
  const std::string optim_file = (d / kOptimFile).string();
  try {  // a parameter at a time into the backend (not the file as doubles, nor the state twice on the host)
    model::SafetensorsReader st(optim_file);
    load_moments(st, backend.params_info(), backend);
  } catch (const Error& e) {
    throw naming(optim_file, e);
  }
  return st;
}

void prune_checkpoints(const std::string& run_dir, int64_t keep) {
  if (keep <= 0) return;
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    spdlog::info("removing old checkpoint {}", all[i].second);
    // Renamed first, so an interrupted removal leaves a .step_N.deleting-<pid> leftover (removed at
    // the next start), never a step_N folder with files missing.
    const fs::path p = all[i].second;
    const fs::path doomed = p.parent_path() / ("." + p.filename().string() + ".deleting-" + std::to_string(::getpid()));
    fs::remove_all(doomed);
    fs::rename(p, doomed);
    fs::remove_all(doomed);
  }
}

}  // namespace tt::trainer
