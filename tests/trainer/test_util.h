// Helpers shared by the trainer's (and the distributed CLI's) tests: a fresh folder under the
// test's temporary directory, the message of the tt::Error a call throws, a file's bytes, and a
// run's metrics.jsonl lines.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"

namespace tt::trainer::testing {

// $TEST_TMPDIR/name (or the system's temporary folder), emptied and created.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::filesystem::path d = (t ? std::filesystem::path(t) : std::filesystem::temp_directory_path()) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The message of the tt::Error that f throws ("" when none).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The lines of run_dir/metrics.jsonl, parsed.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

}  // namespace tt::trainer::testing
