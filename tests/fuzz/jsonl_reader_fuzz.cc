// libFuzzer target: one JSONL line through both readers (data/reader.h) and, for every tree they
// accept, both packings and the batch check. A reader may only throw tt::Error; any other
// exception, a crash, a sanitizer report, a leak or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/check.h"
#include "data/packing.h"
#include "data/reader.h"

namespace {

constexpr int64_t kVocab = 64;

void pack_and_check(const tt::data::Tree& tree) {
  if (tree.n_flat() > 100000) return;  // per_path copies every path: keep each input fast
  for (tt::data::Packing p : {tt::data::Packing::kTree, tt::data::Packing::kPerPath})
    tt::data::check_packed_batch(tt::data::pack({&tree}, p), kVocab);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  try {
    for (const tt::data::Tree& t : tt::data::parse_rollouts_trees(line, "fuzz:1", kVocab)) pack_and_check(t);
  } catch (const tt::Error&) {
  }
  try {
    pack_and_check(tt::data::parse_tree_line(line, "fuzz:1", kVocab));
  } catch (const tt::Error&) {
  }
  return 0;
}
