// Checkpoints: run_dir/checkpoints/step_N/ holding
//   config.json, model.safetensors   Hugging Face layout weights (F32), loadable by transformers
//   optimizer.safetensors            AdamW state: "m.<param name>" and "v.<param name>" (F32)
//   trainer_state.json               step, loader position, data file path and size
//   config.yaml                      the resolved RunConfig (RunConfig::to_yaml)
// Writes are atomic: everything goes into checkpoints/.step_N.tmp-<pid>, each file and the folder
// are fsynced, and the folder is renamed to step_N. Only folders named exactly step_<digits>
// holding all five files are ever picked, so a torn write (a leftover .tmp folder) is ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"
#include "trainer/backend.h"
#include "trainer/config.h"

namespace tt::trainer {

struct TrainerState {
  int64_t step = 0;  // optimizer steps taken
  data::LoaderState loader;
  uint64_t seed = 0;       // train.seed the loader order was drawn with
  std::string data_path;   // the data file, and its size, for a sanity check on resume
  int64_t data_size = -1;
};

std::string checkpoints_dir(const std::string& run_dir);

// Writes run_dir/checkpoints/step_<state.step> atomically (replacing one of that step) and
// returns its path.
std::string save_checkpoint(const std::string& run_dir, const RunConfig& cfg, const Backend& backend,
                            const TrainerState& state);

// Complete checkpoints of run_dir, oldest first (step, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);
// The newest complete checkpoint, or "" when there is none.
std::string latest_checkpoint(const std::string& run_dir);

// Reads a checkpoint's trainer_state.json; throws tt::Error naming the file and the field that is
// missing or mistyped.
TrainerState read_trainer_state(const std::string& file);

// Loads weights, AdamW state and trainer state from a checkpoint folder into backend. Checks the
// model config against cfg.model and the data file against cfg.data.path. Errors name the file.
TrainerState load_checkpoint(const std::string& dir, const RunConfig& cfg, Backend& backend);

// Removes all but the newest `keep` complete checkpoints (keep = 0 keeps all).
void prune_checkpoints(const std::string& run_dir, int64_t keep);

}  // namespace tt::trainer
