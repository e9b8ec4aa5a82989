// Checkpoints: run_dir/checkpoints/step_N/, N the optimizer steps taken. This file owns the layout.
//
// Files of format version 2 (what this treetrain writes):
//   config.json, model.safetensors   Hugging Face layout weights (F32), loadable by transformers
//   optimizer.safetensors            AdamW state: "m.<param name>" and "v.<param name>" (F32)
//   config.yaml                      the resolved RunConfig (RunConfig::to_yaml)
//   gemm_tuning.json                 the GEMM tuning table (CUDA with train.gemm_autotune;
//                                     trainer/gemm_tuning.h), when there is one
//   action_bins.json                 the action bins of episode data with continuous actions
//                                     (data/actions.h), to decode the model's action tokens
//   trainer_state.json               {"version": 2, "step": N, "loader": {"epoch", "cursor"}, "seed",
//                                     "data": {"path", "size_bytes"}, "backend",
//                                     "skipped": {"total", "in_a_row"},
//                                     "files": {"<name>": {"bytes": B, "crc32": "8 hex digits"}, ...}}
// "skipped" counts the updates train.on_nonfinite: skip_step skipped (absent: none; an older
// treetrain wrote no such field). "files" is the manifest: every other file of the folder and its size. A later feature that adds
// a file (action statistics, tuning tables, ...) lists it there; readers check that each listed
// file is present with its size and ignore files they do not know, so adding a file needs no new
// version. A version is for a change that an older reader would misread.
// Version 1 (treetrain before the manifest; trainer_state.json says "version": 1, or has no
// "version") is still read: its files are the five above, without sizes. A manifest entry without
// "crc32" (written before treetrain recorded it) is checked by size only. A version above 2 is
// refused with an error naming it (a newer treetrain wrote it; it is left where it is).
//
// Writes are atomic: everything goes into checkpoints/.step_N.tmp-<pid>, each file and the folder
// are fsynced, and the folder is renamed to step_N (an existing step_N is first renamed to
// .step_N.old-<pid>, then removed). Only folders named step_<digits> are checkpoints.
//
// Validity: a step_N folder is valid when trainer_state.json reads (a known version, every field
// typed) and says step N, and every file of the manifest (version 1: of the five) is there with
// its size. Resuming also checks the contents of the newest such one, each file's CRC-32 against
// the manifest's (a file changed after it was written: bit rot, an overwrite in place), and its
// safetensors headers: every parameter
// of the run's model, F32, with its shape, its data inside the file (when the checkpoint's
// config.json is the run's model; a checkpoint of another model is an error naming the
// difference, since the run's config is what is wrong then, not the checkpoint).
// Resume (resume_checkpoint) takes the newest valid checkpoint; each invalid step_N newer than it
// is renamed step_N.invalid-<UTC time> with a warning (by the writer, rank 0; with data
// parallelism the other ranks take rank 0's choice), so a stray step_999999999999999999 or a
// step_4 whose state says step 2 is never taken.
// keep_checkpoints counts valid checkpoints only, and holds at every start (the writer prunes after
// resuming: a run killed between a checkpoint and its pruning keeps one more until then).
//
// Leftovers of a killed writer are removed at start by the writer (clean_checkpoint_leftovers),
// when the process that made them is gone (no live process of that pid on this host; one writer
// per run_dir, rank 0, which holds run_dir's lock: run_dir.h): .step_N.tmp-<pid> (a write that
// did not finish), .step_N.deleting-<pid> (a removal: prune_checkpoints renames step_N so before
// removing it), .step_N.old-<pid> (a replaced step_N: restored as step_N when the write stopped
// before the new one was renamed in, else removed), the temporary file of treetrain's atomic
// writes into run_dir (run_dir/.<name>.tmp-<pid> of metrics.jsonl's rewrite, gemm_tuning.json and
// a dropped-metrics file; base/files.h; no other names, whoever wrote them),
// and a step_N folder with files missing that is
// older than the newest valid checkpoint (a removal interrupted by an older treetrain).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/config.h"
#include "model/param_table.h"
#include "trainer/backend.h"
#include "trainer/config.h"

namespace tt::trainer {

// The format version save_checkpoint writes; read_trainer_state reads 1 and 2.
constexpr int kCheckpointVersion = 2;

struct TrainerState {
  int64_t version = kCheckpointVersion;  // format of the checkpoint it was read from
  int64_t step = 0;                      // optimizer steps taken
  data::LoaderState loader;
  uint64_t seed = 0;       // train.seed the loader order was drawn with
  std::string data_path;   // the data file, its size and content, for a sanity check on resume
  int64_t data_size = -1;
  std::string data_sha256;  // 64 lowercase hex digits; empty: not recorded (older checkpoints)
  int64_t cameras = 0;  // episode data: images a step (serve checks requests against it); 0: not episodes
  int64_t skipped_steps = 0;      // updates skipped so far (train.on_nonfinite: skip_step)
  int64_t consecutive_skips = 0;  // of them, the ones just before this checkpoint
  std::map<std::string, int64_t> files;      // the manifest (version 2): file name -> bytes
  std::map<std::string, uint32_t> file_crc;  // and -> its CRC-32, where the manifest has one
};

std::string checkpoints_dir(const std::string& run_dir);

// Writes run_dir/checkpoints/step_<state.step> atomically (replacing one of that step) and
// returns its path. gemm_tuning: the text of its gemm_tuning.json (trainer/gemm_tuning.h), or ""
// for none; action_bins: the text of its action_bins.json (data/actions.h: the continuous-action
// bins of episode data), or "" for none. Both are listed by the manifest.
std::string save_checkpoint(const std::string& run_dir, const RunConfig& cfg, const Backend& backend,
                            const TrainerState& state,
                            const std::string& gemm_tuning = "", const std::string& action_bins = "");

// Valid checkpoints of run_dir (the checks above without the safetensors headers), oldest first
// (step, path).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);
// The newest valid checkpoint, or "" when there is none.
std::string latest_checkpoint(const std::string& run_dir);
// Every step_<digits> folder of run_dir, valid or not, oldest first (step, path).
std::vector<std::pair<int64_t, std::string>> step_folders(const std::string& run_dir);
// For a run_dir whose step folders are all invalid: "N checkpoint folder(s), none of them valid
// (newest <path>: <what is wrong>)"; "" when it has none.
std::string invalid_checkpoints_summary(const std::string& run_dir);

// What is wrong with checkpoint folder `dir` ("" when it is valid). With `model` and `params`
// (resuming) also every file's CRC-32 against the manifest's (unless !contents: a rank that takes
// the checkpoint rank 0 checked) and the safetensors headers against that model (when the
// checkpoint's config.json is it).
// Throws tt::Error for a version newer than this treetrain reads.
std::string checkpoint_problem(const std::string& dir, const model::ModelConfig* model = nullptr,
                               const std::vector<model::ParamInfo>* params = nullptr, bool contents = true);

// Removes the leftovers of writers that are gone (see above); logs what it removed or restored.
void clean_checkpoint_leftovers(const std::string& run_dir);

// The checkpoint a resumed run starts from: the newest valid one with the run's `model`
// (contents and safetensors headers included), or "" when there is none; each invalid step_N
// newer than it is moved aside (step_N.invalid-<time>) with a warning. Called by the writer
// (rank 0) alone: other ranks take its choice.
// Throws tt::Error when the newest checkpoint is of a newer format version.
std::string resume_checkpoint(const std::string& run_dir, const model::ModelConfig& model,
                              const std::vector<model::ParamInfo>& params);

// The run settings of `cfg` that differ from those checkpoint `dir` was written with (its
// config.yaml), as " key: then -> now;" items, "" when none or when the checkpoint has no
// readable config.yaml. The model (compared strictly by load_checkpoint), data.path and
// train.seed (warned about there), where the run writes and how often, and the device are left
// out: what remains changes the data order (data.shuffle) or what the remaining steps train (the
// objective, the optimizer, the schedule with train.max_steps). load_checkpoint logs it as a
// warning.
std::string settings_changed_since(const std::string& dir, const RunConfig& cfg);

// Reads a checkpoint's trainer_state.json (versions 1 and 2); throws tt::Error naming the file and
// the field that is missing or mistyped, or the version when it is newer.
TrainerState read_trainer_state(const std::string& file);

// SHA-256 of a file's bytes, as 64 lowercase hex digits (nettle); tt::Error naming the file when
// it cannot be read.
std::string file_sha256(const std::string& path);

// Loads weights, AdamW state and trainer state from a checkpoint folder into backend. Checks the
// model config against cfg.model and the data file against cfg.data.path: its size, and its
// content against data_sha256() (file_sha256(cfg.data.path), called only where the checkpoint
// recorded a digest and the sizes agree). Errors name the file; after one, the backend may hold
// part of the checkpoint (its weights, some of its optimizer state): a caller starts over or stops.
TrainerState load_checkpoint(const std::string& dir, const RunConfig& cfg, Backend& backend,
                             const std::function<std::string()>& data_sha256);

// Removes all but the newest `keep` valid checkpoints (keep = 0 keeps all); invalid folders are
// neither counted nor removed.
// Each goes by a rename to .step_N.deleting-<pid>, then removal.
void prune_checkpoints(const std::string& run_dir, int64_t keep);

}  // namespace tt::trainer
