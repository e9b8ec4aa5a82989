// The GEMM tuning table file (see gemm_tuning.h).
#include "trainer/gemm_tuning.h"

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/json.h"

namespace tt::trainer {
namespace {

constexpr const char* kFormat = "treetrain-gemm-tuning";
constexpr int kVersion = 1;

std::string hex(const std::array<uint64_t, 8>& a) {
  std::string out;
  char buf[17];
  for (uint64_t w : a) {
    std::snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)w);
    out += buf;
  }
  return out;
}

bool unhex(const std::string& s, std::array<uint64_t, 8>* a) {
  if (s.size() != 128) return false;
  for (int w = 0; w < 8; ++w) {
    uint64_t v = 0;
    for (int i = 0; i < 16; ++i) {
      const char c = s[16 * w + i];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v << 4 | (uint64_t)d;
    }
    (*a)[w] = v;
  }
  return true;
}

}  // namespace

std::string gemm_tuning_json(const GemmTuning& t) {
  nlohmann::json entries = nlohmann::json::array();
  for (const cuda::GemmTuned& e : t.entries)
    entries.push_back({{"key", e.key}, {"algo", hex(e.algo)}, {"step", e.step}});
  const nlohmann::json j = {
      {"format", kFormat}, {"version", kVersion}, {"signature", t.signature}, {"entries", entries}};
  return j.dump(1) + "\n";
}

GemmTuning parse_gemm_tuning(const std::string& text, const std::string& file) {
  nlohmann::json j;
  try {
    j = parse_json_strict(text);
  } catch (const std::exception& e) {
    throw Error(str(file, ": invalid JSON: ", e.what()));
  }
  auto field = [&](const nlohmann::json& o, const char* name, const std::string& path) -> const nlohmann::json& {
    if (!o.is_object() || !o.contains(name)) throw Error(str(file, ": missing field \"", path, "\""));
    return o.at(name);
  };
  if (!j.is_object()) throw Error(str(file, ": expected a JSON object, got ", j.type_name()));
  const nlohmann::json& format = field(j, "format", "format");
  if (format != kFormat) throw Error(str(file, ": field \"format\": expected \"", kFormat, "\", got ", format.dump()));
  const nlohmann::json& version = field(j, "version", "version");
  if (version != kVersion)
    throw Error(str(file, ": field \"version\": expected ", kVersion, " (what this treetrain reads), got ",
                    version.dump()));
  GemmTuning t;
  const nlohmann::json& sig = field(j, "signature", "signature");
  if (!sig.is_string()) throw Error(str(file, ": field \"signature\": expected a string, got ", sig.dump()));
  t.signature = sig.get<std::string>();
  const nlohmann::json& entries = field(j, "entries", "entries");
  if (!entries.is_array()) throw Error(str(file, ": field \"entries\": expected an array, got ", entries.dump()));
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = str("entries[", i, "]");
    const nlohmann::json& key = field(entries[i], "key", at + ".key");
    cuda::GemmTuned e;
    bool ok = key.is_array() && key.size() == e.key.size();
    for (size_t k = 0; ok && k < key.size(); ++k) {
      ok = key[k].is_number_integer() && key[k].get<int64_t>() >= 0;
      if (ok) e.key[k] = key[k].get<int64_t>();
    }
    if (!ok) throw Error(str(file, ": field \"", at, ".key\": expected 10 integers >= 0, got ", key.dump()));
    const nlohmann::json& algo = field(entries[i], "algo", at + ".algo");
    if (!algo.is_string() || !unhex(algo.get<std::string>(), &e.algo))
      throw Error(str(file, ": field \"", at, ".algo\": expected 128 lowercase hex digits, got ", algo.dump()));
    if (entries[i].contains("step")) {
      const nlohmann::json& st = entries[i].at("step");
      if (!st.is_number_integer() || st.get<int64_t>() < 0)
        throw Error(str(file, ": field \"", at, ".step\": expected an integer >= 0, got ", st.dump()));
      e.step = st.get<int64_t>();
    }
    t.entries.push_back(e);
  }
  return t;
}

std::vector<cuda::GemmTuned> merge_gemm_tuning(const std::vector<std::vector<cuda::GemmTuned>>& by_rank) {
  std::map<std::array<int64_t, 10>, cuda::GemmTuned> merged;
  for (const std::vector<cuda::GemmTuned>& table : by_rank)
    for (const cuda::GemmTuned& e : table) merged.emplace(e.key, e);  // the first (lowest) rank's stays
  std::vector<cuda::GemmTuned> out;
  for (const auto& [key, e] : merged) out.push_back(e);
  return out;
}

}  // namespace tt::trainer
