// The episodes JSONL format (see episodes.h).
#include "data/episodes.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/files.h"
#include "base/json.h"

namespace tt::data {
namespace {

namespace fs = std::filesystem;

const nlohmann::json& field(const nlohmann::json& o, const char* key, const std::string& where) {
  if (!o.contains(key)) throw Error(str(where, ": missing field \"", key, "\""));
  return o.at(key);
}

std::vector<float> floats(const nlohmann::json& a, const std::string& where, const char* key) {
  if (!a.is_array()) throw Error(str(where, ": field \"", key, "\": expected a list of numbers, got ", a.dump()));
  std::vector<float> out;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number())
      throw Error(str(where, ": field \"", key, "\"[", i, "]: expected a number, got ", a[i].dump()));
    const double v = a[i].get<double>();
    if (!std::isfinite(v) || std::fabs(v) > 3.0e38)
      throw Error(str(where, ": field \"", key, "\"[", i, "]: expected a number within fp32's range (|x| <= 3e38), got ",
                      a[i].dump()));
    out.push_back((float)v);
  }
  return out;
}

std::vector<int32_t> ids(const nlohmann::json& a, const std::string& where, const char* key, int64_t vocab) {
  if (!a.is_array()) throw Error(str(where, ": field \"", key, "\": expected a list of token ids, got ", a.dump()));
  std::vector<int32_t> out;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = a[i].is_number_integer() && a[i].get<int64_t>() >= 0 &&
                    (vocab > 0 ? a[i].get<int64_t>() < vocab : a[i].get<int64_t>() <= INT32_MAX);
    if (!ok)
      throw Error(str(where, ": field \"", key, "\"[", i, "]: expected a token id in [0, ",
                      vocab > 0 ? vocab : (int64_t)INT32_MAX + 1, "), got ", a[i].dump()));
    out.push_back(a[i].get<int32_t>());
  }
  return out;
}

}  // namespace

Episode parse_episode_line(const std::string& line, const std::string& where, const std::string& dir,
                           int64_t vocab_size) {
  nlohmann::json j;
  try {
    j = parse_json_strict(line);
  } catch (const std::exception& e) {
    throw Error(str(where, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) throw Error(str(where, ": expected a JSON object (one episode), got ", j.type_name()));
  Episode ep;
  const nlohmann::json& id = field(j, "id", where);
  ep.id = id.is_string() ? id.get<std::string>() : id.dump();
  ep.instruction = ids(field(j, "instruction", where), where, "instruction", vocab_size);
  const nlohmann::json& steps = field(j, "steps", where);
  if (!steps.is_array() || steps.empty())
    throw Error(str(where, ": field \"steps\": expected a non-empty list of steps, got ", steps.dump()));
  for (size_t t = 0; t < steps.size(); ++t) {
    const std::string at = str(where, ": step ", t);
    const nlohmann::json& s = steps[t];
    if (!s.is_object()) throw Error(str(at, ": expected an object, got ", s.type_name()));
    EpisodeStep st;
    const nlohmann::json& images = field(s, "images", at);
    if (!images.is_array() || images.empty())
      throw Error(str(at, ": field \"images\": expected a non-empty list of image files, got ", images.dump()));
    for (size_t c = 0; c < images.size(); ++c) {
      if (!images[c].is_string() || images[c].get<std::string>().find('\0') != std::string::npos)
        throw Error(str(at, ": field \"images\"[", c, "]: expected a file name, got ", images[c].dump()));
      const fs::path p = fs::path(dir) / images[c].get<std::string>();
      std::error_code ec;
      if (!fs::is_regular_file(p, ec))
        throw Error(str(at, ": field \"images\"[", c, "]: no image file ", p.string()));
      st.images.push_back(p.string());
    }
    if (s.contains("state")) st.state = floats(s.at("state"), at, "state");
    const bool cont = s.contains("action"), disc = s.contains("action_ids");
    if (cont == disc)
      throw Error(str(at, ": expected exactly one of \"action\" (continuous) and \"action_ids\" (discrete), got ",
                      cont ? "both" : "neither"));
    if (cont) st.action = floats(s.at("action"), at, "action");
    else st.action_ids = ids(s.at("action_ids"), at, "action_ids", vocab_size);
    if (st.action.empty() && st.action_ids.empty()) throw Error(str(at, ": an empty action"));
    if (t > 0) {
      const EpisodeStep& f = ep.steps[0];
      if (st.images.size() != f.images.size())
        throw Error(str(at, ": ", st.images.size(), " images, expected ", f.images.size(),
                        " (one per camera, as step 0)"));
      if (st.state.size() != f.state.size())
        throw Error(str(at, ": field \"state\" has ", st.state.size(), " values, expected ", f.state.size(),
                        " (as step 0)"));
      if (st.action.size() != f.action.size() || st.action_ids.size() != f.action_ids.size())
        throw Error(str(at, ": the action has ", st.action.size() + st.action_ids.size(), " ",
                        cont ? "values" : "ids", ", expected ", f.action.size() + f.action_ids.size(), " ",
                        f.action.empty() ? "ids" : "values", " (as step 0)"));
    }
    ep.steps.push_back(std::move(st));
  }
  return ep;
}

std::vector<Episode> read_episodes(const std::string& path, int64_t vocab_size) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(str(path, ": is a folder, expected the episodes JSONL file"));
  std::ifstream in(path);
  if (!in) throw Error(str(path, ": cannot open the episodes file"));
  const std::string dir = fs::path(path).parent_path().string();
  std::vector<Episode> out;
  std::string line;
  for (int64_t n = 1; read_line(in, line, path, n, "one episode (a JSON object)"); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str(path, ":", n);
    Episode ep = parse_episode_line(line, where, dir, vocab_size);
    if (!out.empty()) {
      const EpisodeStep &a = out[0].steps[0], &b = ep.steps[0];
      if (a.images.size() != b.images.size() || a.state.size() != b.state.size() ||
          a.action.size() != b.action.size() || a.action_ids.size() != b.action_ids.size())
        throw Error(str(where, ": episode '", ep.id, "' has ", b.images.size(), " cameras, ", b.state.size(),
                        " state values and ", b.action.empty() ? b.action_ids.size() : b.action.size(),
                        b.action.empty() ? " action ids" : " action values", "; the file's first episode has ",
                        a.images.size(), ", ", a.state.size(), " and ",
                        a.action.empty() ? a.action_ids.size() : a.action.size(),
                        a.action.empty() ? " action ids" : " action values"));
    }
    out.push_back(std::move(ep));
  }
  if (out.empty()) throw Error(str(path, ": no episodes"));
  return out;
}

std::string generated_frames_folder(const std::string& jsonl_path) {
  return fs::path(jsonl_path).stem().string() + "_frames";
}

GeneratedEpisodes::GeneratedEpisodes(const std::string& path)
    // The frames' paths in the file are relative to its folder: a link to a file elsewhere is refused.
    : path_(path),
      tmp_(atomic_temp_path(atomic_write_target(path, Links::kRefuse), (long)::getpid())),
      folder_(generated_frames_folder(path)),
      dir_(fs::path(path).parent_path()) {
  tmp_folder_ = folder_ + str(".tmp-", (long)::getpid());
  std::error_code ec;
  // An earlier dataset's frames folder is replaced (commit): only if it holds nothing but frames
  // this writer names (<episode>_<step>.png), so a folder of the user's own is never deleted.
  const fs::path old = dir_ / folder_;
  const fs::file_status st = fs::status(old, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      throw Error(str(path, ": ", old.string(), " exists and is not a folder; the frames go there: move it away"));
    auto ours = [](const fs::directory_entry& e) {  // a regular file <digits>_<digits>.png
      std::error_code fe;
      const std::string n = e.path().filename().string();
      const size_t us = n.find('_');
      return e.is_regular_file(fe) && us != std::string::npos && us > 0 && n.size() > us + 5 &&
             n.compare(n.size() - 4, 4, ".png") == 0 && n.find_first_not_of("0123456789") == us &&
             n.find_first_not_of("0123456789", us + 1) == n.size() - 4;
    };
    std::error_code ie;
    for (fs::directory_iterator it(old, ie), end; !ie && it != end; it.increment(ie))
      if (!ours(*it))
        throw Error(str(path, ": ", old.string(), " holds ", it->path().filename().string(),
                        ", which is not a frame a generated dataset names (<episode>_<step>.png); generating here "
                        "would replace that folder: move it away or choose another --out"));
    if (ie) throw Error(str(path, ": cannot read the frames folder ", old.string(), ": ", ie.message()));
  }
  ec.clear();
  if (!dir_.empty()) fs::create_directories(dir_, ec);
  out_.open(tmp_, std::ios::trunc);
  if (!out_) throw Error(str(path, ": cannot write (", tmp_, ")"));
  fs::remove_all(dir_ / tmp_folder_, ec);
  ec.clear();
  fs::create_directories(dir_ / tmp_folder_, ec);
  if (ec) {
    out_.close();
    std::remove(tmp_.c_str());
    throw Error(str(path, ": cannot create the frames folder ", (dir_ / tmp_folder_).string(), ": ", ec.message()));
  }
}

GeneratedEpisodes::~GeneratedEpisodes() {
  if (done_) return;
  std::error_code ec;
  out_.close();
  fs::remove(tmp_, ec);
  fs::remove_all(dir_ / tmp_folder_, ec);
}

std::string GeneratedEpisodes::frame_name(int64_t e, int t) const { return str(folder_, "/", e, "_", t, ".png"); }

std::string GeneratedEpisodes::frame_file(const std::string& name) const {
  return (dir_ / tmp_folder_ / fs::path(name).filename()).string();
}

void GeneratedEpisodes::commit() {
  out_.close();
  if (!out_) throw Error(str(path_, ": write failed (", tmp_, ")"));
  // An earlier dataset's frames are set aside, not deleted, until the new file is in place: any
  // failure on the way puts them back, beside the earlier file.
  const fs::path folder = dir_ / folder_, aside = dir_ / (folder_ + str(".old-", (long)::getpid()));
  std::error_code ec;
  const bool had = fs::exists(folder, ec);
  if (had) fs::rename(folder, aside, ec);
  if (!ec) fs::rename(dir_ / tmp_folder_, folder, ec);
  if (ec || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = ec ? ec.message() : std::strerror(errno);
    std::error_code ignored;
    if (had && fs::exists(aside, ignored)) {
      fs::rename(folder, dir_ / tmp_folder_, ignored);  // the new frames back to the temporary (removed below)
      fs::rename(aside, folder, ignored);
    }
    throw Error(str(path_, ": cannot move the generated file and frames into place: ", why));
  }
  done_ = true;
  if (had) fs::remove_all(aside, ec);
}

}  // namespace tt::data
