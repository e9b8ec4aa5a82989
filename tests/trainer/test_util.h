// Helpers shared by the trainer's (and the distributed CLI's) tests: a fresh folder under the
// test's temporary directory, the message of the tt::Error a call throws, a file's bytes, a
// safetensors element patched in place, and a run's metrics.jsonl lines.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/crc.h"
#include "tests/base/error_of.h"

namespace tt::trainer::testing {

// $TEST_TMPDIR/name (or the system's temporary folder), emptied and created.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::filesystem::path d = (t ? std::filesystem::path(t) : std::filesystem::temp_directory_path()) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

using tt::testing::error_of;  // the message of the tt::Error that f throws ("" when none)

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// After a test edits a checkpoint file in place: the manifest beside it (trainer_state.json)
// records the file's new CRC-32, as if the checkpoint had been written so (the edit is then what
// the checks after the manifest's must find). Nothing when there is no manifest entry.
inline void rehash_manifest(const std::filesystem::path& file) {
  const std::filesystem::path state = file.parent_path() / "trainer_state.json";
  std::ifstream in(state);
  if (!in) return;
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  const std::string name = file.filename().string();
  if (!j.contains("files") || !j["files"].contains(name) || !j["files"][name].contains("crc32")) return;
  j["files"][name]["crc32"] = tt::crc32_hex(tt::file_crc32(file.string()));
  std::ofstream(state, std::ios::trunc) << j.dump(2) << "\n";
}

// Element `index` of F32 tensor `tensor` of a safetensors file set to x in place (the file keeps
// its size, and a checkpoint's manifest its CRC-32: rehash_manifest).
inline void poke_f32(const std::filesystem::path& file, const std::string& tensor, int64_t index, float x) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), 8);
  std::string json(header, '\0');
  f.read(json.data(), (std::streamsize)header);
  const nlohmann::json h = nlohmann::json::parse(json);
  ASSERT_EQ(h.at(tensor).at("dtype"), "F32");
  const int64_t begin = h.at(tensor).at("data_offsets")[0].get<int64_t>();
  f.seekp(8 + (std::streamoff)header + begin + 4 * index);
  f.write(reinterpret_cast<const char*>(&x), 4);
  ASSERT_TRUE(f.good());
  f.close();
  rehash_manifest(file);
}

// The lines of run_dir/metrics.jsonl, parsed.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

// Parameters after updates taken by fp32 arithmetic in another summation order: every one of got
// within 1e-4 of want's largest update (from p0) plus 1e-6 of the parameter (the fp32 rounding of
// p itself); want's update must not be zero (a comparison of unchanged weights proves nothing).
inline void expect_params_match(const std::vector<float>& got, const std::vector<float>& want,
                                const std::vector<float>& p0, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(p0.size(), want.size());
  double dmax = 0;
  for (size_t i = 0; i < p0.size(); ++i) dmax = std::max(dmax, (double)std::abs(want[i] - p0[i]));
  ASSERT_GT(dmax, 0.0) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4 * dmax + 1e-6 * std::abs(p0[i])) << what << " param " << i;
}

}  // namespace tt::trainer::testing
