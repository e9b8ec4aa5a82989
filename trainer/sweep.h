// Sweeps: `treetrain sweep --config sweep.yaml [--mode local|slurm] [--out FILE] [--nproc N]`.
//
// A sweep file names a base run config and the parameters to vary, as the run config's key paths
// (trainer/config.h; the values are what `--set key=value` takes):
//
//   base: quickstart.yaml          # the run config; relative to this file
//   run_dir: runs/lr_sweep         # optional; default: the base config's run_dir
//   set:                           # optional: overrides for every run
//     train.max_steps: 50
//   grid:                          # cartesian product, the last key varying fastest
//     optim.lr: [1.0e-3, 3.0e-3]
//     train.seed: [1, 2]
//   list:                          # zipped: the i-th values go together (equal lengths)
//     model.hidden_size: [64, 128]
//     model.intermediate_size: [192, 384]
//   slurm:                         # optional: the array job of --mode slurm
//     partition: gpu
//     account: my_account
//     time: "04:00:00"
//     nodes: 1                     # per run
//     gpus_per_node: 8             # one task per GPU
//     cpus_per_task: 16
//     sbatch: ["--qos=high"]       # extra #SBATCH lines, verbatim
//
// Runs are the zipped list entries times the grid (list-major); with neither, one run. Run i has
// run_dir <run_dir>/<NN>_<name>-<value>_..., naming each varied key by its last component (the
// full key when two share it) and its value as written, e.g. runs/lr_sweep/03_lr-3.0e-3_seed-2.
// Every run's resolved config is written to <run dir>/config.yaml before anything runs, so a run
// is `treetrain train --config <run dir>/config.yaml`, by hand or from the SLURM array.
//
// Keys are strict like the run config: an unknown sweep key, a key path the run config does not
// have, a value it rejects, list entries of unequal length or a key given twice are errors that
// name the sweep file and line.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/config.h"

namespace tt::trainer {

struct SlurmOptions {
  std::string partition;
  std::string account;
  std::string time;
  int64_t nodes = 1;
  int64_t gpus_per_node = 1;
  int64_t cpus_per_task = 0;  // 0: not set
  std::vector<std::string> sbatch;
};

struct SweepRun {
  int index = 0;
  std::string name;                                         // "03_lr-3.0e-3_seed-2"
  std::vector<std::pair<std::string, std::string>> params;  // the varied keys and values
  trainer::RunConfig config;                                // resolved; run_dir absolute
};

struct Sweep {
  std::string source;    // the sweep file
  std::string base;      // the base run config (absolute)
  std::string run_dir;   // absolute
  std::vector<SweepRun> runs;
  SlurmOptions slurm;
};

Sweep load_sweep(const std::string& path);
// From text; `base_dir` resolves the relative base path (load_sweep passes the file's folder).
Sweep parse_sweep_text(const std::string& yaml_text, const std::string& source, const std::string& base_dir);

// Writes <run dir>/config.yaml for every run; returns the paths, by run.
std::vector<std::string> write_run_configs(const Sweep& sweep);

// The SLURM array script: one array task per run; each task runs `srun <binary> train --config
// <run dir>/config.yaml` with one task per GPU (NCCL_NVLS_ENABLE=0, see scripts/slurm/).
std::string slurm_script(const Sweep& sweep, const std::string& binary);

struct RunResult {
  std::string status;  // "ok" | "failed (exit N)" | "not run"
  bool has_metrics = false;  // the last line of metrics.jsonl was read (the table shows "-" otherwise)
  int64_t step = 0;          // from that line
  double loss = 0;
  double tokens_per_s = 0;
};
RunResult read_result(const std::string& run_dir, const std::string& status);
// A fixed-width table: run, status, step, loss, tokens/s.
std::string results_table(const Sweep& sweep, const std::vector<RunResult>& results);

// Runs the sweep's runs one after another as child processes of `binary` (`train --config`, or
// `launch --nproc N -- train --config` for nproc > 1); returns each run's result. A failed run
// does not stop the others.
std::vector<RunResult> run_local(const Sweep& sweep, const std::string& binary, int nproc);

}  // namespace tt::trainer
