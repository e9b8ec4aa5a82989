// The GEMM tuning table on disk: run_dir/gemm_tuning.json, and a copy in every checkpoint.
//
// With train.gemm_autotune (the default) the CUDA backend times cuBLASLt's candidates once per
// GEMM shape bucket (cuda::GemmHandle, ops/cuda/gemm.h) and keeps the winners in a table. The
// trainer writes the table to run_dir/gemm_tuning.json (atomically) after every step that added
// entries, and into each checkpoint; a resumed run restores it (run_dir's file, else the
// checkpoint's), so it chooses the algorithms the interrupted run chose and repeats it bitwise.
// Data-parallel ranks agree after each step that tuned: every rank takes the merged table (for a
// key tuned on several ranks, the lowest rank's choice). A table made under another cuBLASLt or
// GPU (its signature) is not restored: the run says so and tunes anew.
//
// Format: {"format": "treetrain-gemm-tuning", "version": 1, "signature": "<cublasLt, GPU>",
//          "entries": [{"key": [10 integers], "algo": "<128 hex digits>"}, ...]}
#pragma once

#include <string>
#include <vector>

#include "ops/cuda/gemm_tuned.h"

namespace tt::trainer {

inline constexpr const char* kGemmTuningFile = "gemm_tuning.json";

struct GemmTuning {
  std::string signature;
  std::vector<cuda::GemmTuned> entries;
};

std::string gemm_tuning_json(const GemmTuning& t);
// Throws tt::Error naming `file` and the field, and what was expected.
GemmTuning parse_gemm_tuning(const std::string& text, const std::string& file);
// The union of the ranks' tables (by rank); a key present on several ranks takes the lowest
// rank's algorithm. Sorted by key.
std::vector<cuda::GemmTuned> merge_gemm_tuning(const std::vector<std::vector<cuda::GemmTuned>>& by_rank);

}  // namespace tt::trainer
