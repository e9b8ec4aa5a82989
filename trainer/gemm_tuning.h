// The GEMM tuning table on disk: run_dir/gemm_tuning.json, and a copy in every checkpoint.
//
// With train.gemm_autotune (the default) the CUDA backend times cuBLASLt's candidates once per
// GEMM shape bucket (cuda::GemmHandle, ops/cuda/gemm.h). A winner timed in step s is adopted
// after step s (data-parallel ranks first agree: for a key timed on several ranks, the lowest
// rank's winner), so the GEMMs of step s itself run the heuristic's choice on every rank and no
// computation's rounding depends on timing noise. The table, each entry tagged with its step, goes
// to run_dir/gemm_tuning.json (atomically) after every step that adopted entries, and into each
// checkpoint. A run resuming at step c (or starting at 0 in a run_dir that holds a table)
// restores the entries of steps <= c as adopted and the later ones as hints: when the steps that
// timed them come again, the hinted winner is taken instead of timing, and adopted after the same
// step. So a resumed run chooses the interrupted run's algorithms at every step, on every rank,
// and repeats it bitwise. A table made under another cuBLASLt or GPU (its signature) is not
// restored: the run says so and tunes anew.
//
// Format: {"format": "treetrain-gemm-tuning", "version": 1, "signature": "<cublasLt, GPU>",
//          "entries": [{"key": [10 integers], "algo": "<128 hex digits>", "step": S}, ...]}
// ("step" absent: 0).
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
