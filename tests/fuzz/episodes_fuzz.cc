// libFuzzer target: one episodes JSONL line (data/episodes.h) in a folder that holds
// frames/a.png and frames/b.jpg, so lines naming them reach the step checks, and the action-bins
// statistics file (data/actions.h) from the same bytes. The parsers may only throw tt::Error; any
// other exception, a crash, a sanitizer report, a leak or a hang is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "base/check.h"
#include "data/actions.h"
#include "data/episodes.h"

namespace {

const std::string& frames_dir() {
  static const std::string dir = [] {
    const std::filesystem::path d = "/tmp/episodes_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d / "frames");
    std::ofstream(d / "frames" / "a.png") << "x";
    std::ofstream(d / "frames" / "b.jpg") << "x";
    return d.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    tt::data::parse_episode_line(line, "fuzz:1", frames_dir(), 64);
  } catch (const tt::Error&) {
  }
  try {
    const tt::data::ActionBins b = tt::data::ActionBins::from_json(line, "fuzz.json");
    std::vector<float> a(b.dims(), 0.25f);
    b.decode(b.encode(a));
  } catch (const tt::Error&) {
  }
  return 0;
}
