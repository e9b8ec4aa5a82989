// Sweeps: expansion of grid (cartesian) and list (zipped) parameters into runs with readable
// run_dirs and resolved configs, strict keys with file:line errors, the SLURM array script, the
// results table, the shipped example configs/sweep_example.yaml, and scripts/slurm/train.sbatch.
#include "trainer/sweep.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/check.h"
#include "tests/distributed/test_util.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A base run config in dir/base.yaml (its data file need not exist to expand a sweep).
fs::path write_base(const fs::path& dir) {
  std::ofstream(dir / "base.yaml") << "run_dir: " << (dir / "base_run").string() << "\n"
                                   << "device: cpu\n"
                                   << "model:\n  vocab_size: 32\n  hidden_size: 16\n  intermediate_size: 32\n"
                                      "  num_hidden_layers: 1\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"
                                   << "data:\n  path: data.jsonl\n"
                                   << "train:\n  max_steps: 10\n";
  return dir / "base.yaml";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string error_of(const std::string& text, const fs::path& dir) {
  try {
    parse_sweep_text(text, "sweep.yaml", dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SweepTest, GridTimesZippedListGivesNamedRuns) {
  const fs::path dir = distributed::testing::test_dir("sweep_expand");
  write_base(dir);
  const std::string text = "base: base.yaml\n"
                           "run_dir: " + (dir / "runs").string() + "\n"
                           "set:\n  train.max_steps: 3\n"
                           "grid:\n  optim.lr: [1.0e-3, 3.0e-3]\n  train.seed: [1, 2]\n"
                           "list:\n  model.hidden_size: [16, 32]\n  model.intermediate_size: [32, 64]\n";
  const Sweep sw = parse_sweep_text(text, "sweep.yaml", dir.string());
  EXPECT_EQ(sw.base, (dir / "base.yaml").string());
  ASSERT_EQ(sw.runs.size(), 8u);  // 2 zipped entries x 2 x 2
  EXPECT_EQ(sw.runs[0].name, "0_hidden_size-16_intermediate_size-32_lr-1.0e-3_seed-1");
  EXPECT_EQ(sw.runs[1].name, "1_hidden_size-16_intermediate_size-32_lr-1.0e-3_seed-2");  // last key fastest
  EXPECT_EQ(sw.runs[2].name, "2_hidden_size-16_intermediate_size-32_lr-3.0e-3_seed-1");
  EXPECT_EQ(sw.runs[7].name, "7_hidden_size-32_intermediate_size-64_lr-3.0e-3_seed-2");
  const SweepRun& r = sw.runs[6];
  EXPECT_EQ(r.params, (std::vector<std::pair<std::string, std::string>>{
                          {"model.hidden_size", "32"}, {"model.intermediate_size", "64"},
                          {"optim.lr", "3.0e-3"}, {"train.seed", "1"}}));
  EXPECT_EQ(r.config.model.hidden_size, 32);
  EXPECT_EQ(r.config.model.intermediate_size, 64);
  EXPECT_EQ(r.config.optim.lr, 3e-3);
  EXPECT_EQ(r.config.train.seed, 1u);
  EXPECT_EQ(r.config.train.max_steps, 3);  // from set:
  EXPECT_EQ(r.config.data.path, (dir / "data.jsonl").string());  // relative to the base config
  EXPECT_EQ(r.config.run_dir, (dir / "runs" / r.name).string());
  std::set<std::string> dirs;
  for (const SweepRun& run : sw.runs) dirs.insert(run.config.run_dir);
  EXPECT_EQ(dirs.size(), 8u);

  // Without run_dir: the base config's; with neither grid nor list: the base run alone.
  const Sweep one = parse_sweep_text("base: base.yaml\n", "s.yaml", dir.string());
  ASSERT_EQ(one.runs.size(), 1u);
  EXPECT_EQ(one.runs[0].config.run_dir, (dir / "base_run" / "0").string());
  // Leaves shared by two keys keep the full key; list values name as written.
  const Sweep two = parse_sweep_text("base: base.yaml\ngrid:\n  optim.beta1: [0.9]\n  optim.betas: [[0.8, 0.99]]\n",
                                     "s.yaml", dir.string());
  EXPECT_EQ(two.runs[0].name, "0_beta1-0.9_betas-0.8,0.99");
  EXPECT_EQ(two.runs[0].config.optim.beta2, 0.99);
}

TEST(SweepTest, ErrorsNameTheFileAndLine) {
  const fs::path dir = distributed::testing::test_dir("sweep_errors");
  write_base(dir);
  const std::string base = "base: base.yaml\n";
  EXPECT_TRUE(has(error_of(base + "grd:\n  optim.lr: [1]\n", dir),
                  "sweep.yaml:2: unknown key 'grd' (expected one of: base, run_dir, set, grid, list, slurm)"));
  const std::string unknown = error_of(base + "grid:\n  optim.lrr: [1.0e-3]\n", dir);
  EXPECT_TRUE(has(unknown, "sweep.yaml:3: grid: optim.lrr: unknown key 'optim.lrr' (expected one of: lr,")) << unknown;
  const std::string bad_value = error_of(base + "grid:\n  optim.lr: [1.0e-3,\n    fast]\n", dir);
  EXPECT_TRUE(has(bad_value, "sweep.yaml:4: grid: optim.lr: optim.lr: expected a number, got 'fast'")) << bad_value;
  const std::string rule = error_of(base + "list:\n  optim.lr: [-1.0]\n", dir);
  EXPECT_TRUE(has(rule, "sweep.yaml:3: list: optim.lr: ")) << rule;
  EXPECT_TRUE(has(rule, "optim.lr must be > 0")) << rule;
  const std::string lengths = error_of(base + "list:\n  optim.lr: [1.0e-3, 2.0e-3]\n  train.seed: [1]\n", dir);
  EXPECT_TRUE(has(lengths, "sweep.yaml:4: list: train.seed has 1 values, but optim.lr has 2")) << lengths;
  const std::string twice = error_of(base + "set:\n  optim.lr: 1.0e-3\ngrid:\n  optim.lr: [1.0e-3]\n", dir);
  EXPECT_TRUE(has(twice, "sweep.yaml:5: key 'optim.lr' is already given at sweep.yaml:3")) << twice;
  EXPECT_TRUE(has(error_of(base + "grid:\n  optim.lr: 1.0e-3\n", dir), "sweep.yaml:3: grid: optim.lr: expected a non-empty list"));
  EXPECT_TRUE(has(error_of("grid:\n  optim.lr: [1]\n", dir), "sweep.yaml: base: expected the path of the run config"));
  EXPECT_TRUE(has(error_of(base + "slurm:\n  gpus: 8\n", dir), "sweep.yaml:3: unknown key 'slurm.gpus'"));
  EXPECT_TRUE(has(error_of(base + "slurm:\n  nodes: 0\n", dir), "sweep.yaml:3: slurm.nodes: expected an integer >= 1"));
  // Past int64: an error, not the largest integer.
  EXPECT_TRUE(has(error_of(base + "slurm:\n  nodes: 99999999999999999999999\n", dir),
                  "sweep.yaml:3: slurm.nodes: expected an integer >= 1, got '99999999999999999999999'"));
  // Quoted numbers are strings, as in a run config.
  const std::string quoted = error_of(base + "grid:\n  optim.lr: [\"3e-4\"]\n", dir);
  EXPECT_TRUE(has(quoted, "sweep.yaml:3: grid: optim.lr: optim.lr: expected a number, got the quoted string \"3e-4\"; "
                          "write it without quotes"))
      << quoted;
  const std::string quoted_set = error_of(base + "set:\n  train.max_steps: '3'\n", dir);
  EXPECT_TRUE(has(quoted_set, "train.max_steps: expected an integer, got the quoted string \"3\"")) << quoted_set;
  EXPECT_TRUE(has(error_of(base + "slurm:\n  nodes: \"2\"\n", dir),
                  "sweep.yaml:3: slurm.nodes: expected an integer (unquoted), got the quoted string \"2\""));
  EXPECT_TRUE(has(error_of(base + "grid: [\n", dir), "sweep.yaml:"));
  // Text after the document (YAML::Load would drop it) and a second document.
  EXPECT_EQ(error_of("{base: base.yaml}, grid\n", dir),
            "sweep.yaml:1:18: invalid YAML: ',' after the end of the document, expected one config per file");
  EXPECT_EQ(error_of(base + "---\ngrid: {}\n", dir), "sweep.yaml:2: a second YAML document, expected one config per file");
  // A value that breaks a cross-field rule with the base names its line; values that pass alone
  // but break the rule together name the run.
  const std::string alone = error_of(base + "grid:\n  partition.capacity_tokens: [8, 5000]\n", dir);
  EXPECT_TRUE(has(alone, "sweep.yaml:3: grid: partition.capacity_tokens: ")) << alone;
  EXPECT_TRUE(has(alone, "partition.capacity_tokens must be <= data.max_tokens_per_batch (4096): a piece must fit a "
                         "micro-batch (got 5000)"))
      << alone;
  const std::string together = error_of(
      base + "grid:\n  partition.capacity_tokens: [64]\n  data.max_tokens_per_batch: [32, 128]\n", dir);
  EXPECT_TRUE(has(together, "sweep.yaml: run 0_capacity_tokens-64_max_tokens_per_batch-32 "
                            "(partition.capacity_tokens=64, data.max_tokens_per_batch=32): "))
      << together;
  EXPECT_TRUE(has(together, "partition.capacity_tokens must be <= data.max_tokens_per_batch (32)")) << together;
}

TEST(SweepTest, RunConfigsAreWrittenAndLoadBack) {
  const fs::path dir = distributed::testing::test_dir("sweep_write");
  write_base(dir);
  const Sweep sw = parse_sweep_text("base: base.yaml\nrun_dir: " + (dir / "runs").string() +
                                        "\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n",
                                    "s.yaml", dir.string());
  const std::vector<std::string> paths = write_run_configs(sw);
  ASSERT_EQ(paths.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(paths[i], (fs::path(sw.runs[i].config.run_dir) / "config.yaml").string());
    EXPECT_EQ(trainer::load_config(paths[i], {}).to_yaml(), sw.runs[i].config.to_yaml());
  }
  // Written again unchanged: nothing set aside. Changed (the sweep file's set: grew a key): the
  // earlier config, what the run's checkpoints were trained with, is kept beside the new one.
  write_run_configs(sw);
  auto replaced = [&] {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(sw.runs[0].config.run_dir))
      if (e.path().filename().string().rfind("config.yaml.replaced-", 0) == 0) out.push_back(e.path());
    return out;
  };
  EXPECT_TRUE(replaced().empty());
  // The same sweep named by another path: only the first line differs, nothing set aside.
  write_run_configs(parse_sweep_text("base: base.yaml\nrun_dir: " + (dir / "runs").string() +
                                         "\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n",
                                     "sweeps/../s.yaml", dir.string()));
  EXPECT_TRUE(replaced().empty());
  const std::string before = slurp(paths[0]);
  const Sweep changed = parse_sweep_text("base: base.yaml\nrun_dir: " + (dir / "runs").string() +
                                             "\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\nset:\n  optim.weight_decay: 0.5\n",
                                         "s.yaml", dir.string());
  write_run_configs(changed);
  ASSERT_EQ(replaced().size(), 1u);
  EXPECT_EQ(slurp(replaced()[0]), before);
  EXPECT_EQ(trainer::load_config(paths[0], {}).optim.weight_decay, 0.5);
}

// run_dir in a grid (each run's is the sweep's run_dir/<name>), and two runs of the same config,
// are errors; a long value makes a folder name of at most 240 bytes.
TEST(SweepTest, RunDirKeysAndRepeatedRunsAreErrors) {
  const fs::path dir = distributed::testing::test_dir("sweep_repeats");
  write_base(dir);
  EXPECT_EQ(error_of("base: base.yaml\ngrid:\n  run_dir: [a, b]\n", dir),
            "sweep.yaml:3: grid: run_dir is the sweep's own (the top-level run_dir:); each run trains in "
            "run_dir/<run name>");
  const std::string e = error_of("base: base.yaml\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3, 0.001]\n", dir);
  EXPECT_EQ(e, "sweep.yaml: runs 0_lr-1.0e-3 and 2_lr-0.001 (optim.lr=0.001) train the same config; list each value "
               "once");
  EXPECT_EQ(error_of("base: base.yaml\nset:\n  run_dir: x\n", dir),
            "sweep.yaml:3: set: run_dir is the sweep's own (the top-level run_dir:); each run trains in "
            "run_dir/<run name>");
  const Sweep long_names = parse_sweep_text(
      "base: base.yaml\ngrid:\n  data.path: [" + std::string(400, 'a') + ".jsonl, " + std::string(400, 'b') + ".jsonl]\n",
      "s.yaml", dir.string());
  ASSERT_EQ(long_names.runs.size(), 2u);
  EXPECT_EQ(long_names.runs[0].name.size(), 240u);
  EXPECT_EQ(long_names.runs[1].name.rfind("1_", 0), 0u);
}

// A grid whose product passes the cap (or wraps size_t: 256^8 = 2^64) is an error, not zero runs.
TEST(SweepTest, AGridPastTheCapIsAnError) {
  const fs::path dir = distributed::testing::test_dir("sweep_huge");
  write_base(dir);
  std::string values = "[";
  for (int i = 0; i < 256; ++i) values += (i ? ", " : "") + std::to_string(i + 1);
  values += "]";
  std::string text = "base: base.yaml\ngrid:\n";
  for (const char* key : {"train.seed", "train.max_steps", "train.log_every", "schedule.warmup_steps",
                          "train.checkpoint_every", "train.keep_checkpoints", "train.grad_accum", "train.max_skipped_steps"})
    text += std::string("  ") + key + ": " + values + "\n";
  const std::string e = error_of(text, dir);
  EXPECT_EQ(e, "sweep.yaml: the grid has more than 100000 runs (at train.log_every); a sweep is limited to 1 to 100000");
}

TEST(SweepTest, SlurmArrayScript) {
  const fs::path dir = distributed::testing::test_dir("sweep_slurm");
  write_base(dir);
  const Sweep sw = parse_sweep_text("base: base.yaml\nrun_dir: " + (dir / "runs").string() +
                                        "\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3, 1.0e-2]\n"
                                        "slurm:\n  partition: gpu\n  time: \"02:00:00\"\n  nodes: 2\n"
                                        "  gpus_per_node: 8\n  cpus_per_task: 12\n  sbatch: [\"--qos=high\"]\n",
                                    "lr_sweep.yaml", dir.string());
  const std::string s = slurm_script(sw, "/opt/treetrain/bin/treetrain");
  for (const std::string line :
       {"#!/bin/bash\n", "#SBATCH --job-name=lr_sweep\n", "#SBATCH --array=0-2\n", "#SBATCH --nodes=2\n",
        "#SBATCH --ntasks-per-node=8\n", "#SBATCH --gpus-per-node=8\n", "#SBATCH --cpus-per-task=12\n",
        "#SBATCH --partition=gpu\n", "#SBATCH --time=02:00:00\n", "#SBATCH --qos=high\n",
        "export NCCL_NVLS_ENABLE=0\n", "config=\"${configs[$SLURM_ARRAY_TASK_ID]}\"\n",
        "export TT_JOB_SECRET=\"$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\"\n",
        "srun --kill-on-bad-exit=1 '/opt/treetrain/bin/treetrain' train --config \"$config\"\n"})
    EXPECT_TRUE(has(s, line)) << line << "\n---\n" << s;
  EXPECT_TRUE(has(s, "#SBATCH --output=" + (dir / "runs").string() + "/slurm-%A_%a.out\n")) << s;
  for (const SweepRun& run : sw.runs)
    EXPECT_TRUE(has(s, "  '" + run.config.run_dir + "/config.yaml'\n")) << run.name;
  EXPECT_FALSE(has(s, "--account"));  // unset options are left out
  // The #SBATCH lines come before the first command, or sbatch ignores them.
  EXPECT_LT(s.rfind("#SBATCH"), s.find("set -euo pipefail"));
  // A run_dir #SBATCH --output cannot take (a space, '%'): an error, not logs sent elsewhere.
  const Sweep spaced = parse_sweep_text("base: base.yaml\nrun_dir: '" + (dir / "my runs %j").string() +
                                            "'\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n",
                                        "lr_sweep.yaml", dir.string());
  std::string e;
  try {
    slurm_script(spaced, "/opt/treetrain/bin/treetrain");
  } catch (const Error& x) {
    e = x.what();
  }
  EXPECT_EQ(e, "sweep: run_dir '" + (dir / "my runs %j").string() +
                "' has a space, quote, backslash, line break or '%', which #SBATCH --output cannot take; choose a "
                "run_dir without "
                "them for --mode slurm");
}

TEST(SweepTest, ResultsTableReadsTheLastMetrics) {
  const fs::path dir = distributed::testing::test_dir("sweep_table");
  write_base(dir);
  const Sweep sw = parse_sweep_text("base: base.yaml\nrun_dir: " + (dir / "runs").string() +
                                        "\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n",
                                    "s.yaml", dir.string());
  fs::create_directories(sw.runs[0].config.run_dir);
  std::ofstream(fs::path(sw.runs[0].config.run_dir) / "metrics.jsonl")
      << R"({"step": 1, "loss": 9.5, "tokens_per_s": 10.0})" << "\n"
      << R"({"step": 2, "loss": 4.25, "tokens_per_s": 1234.5})" << "\n";
  const RunResult a = read_result(sw.runs[0].config.run_dir, "ok");
  EXPECT_EQ(a.step, 2);
  EXPECT_EQ(a.loss, 4.25);
  EXPECT_EQ(a.tokens_per_s, 1234.5);
  const RunResult b = read_result(sw.runs[1].config.run_dir, "failed (exit 1)");
  EXPECT_FALSE(b.has_metrics);
  EXPECT_TRUE(a.has_metrics);
  const std::string table = results_table(sw, {a, b});
  EXPECT_EQ(table,
            "run          status               step        loss      tokens/s\n"
            "0_lr-1.0e-3  ok                      2      4.2500        1234.5\n"
            "1_lr-3.0e-3  failed (exit 1)         -           -             -\n");
}

TEST(SweepTest, TheShippedExampleExpands) {
  const Sweep sw = load_sweep("configs/sweep_example.yaml");
  EXPECT_EQ(sw.runs.size(), 4u);
  for (const SweepRun& run : sw.runs) {
    EXPECT_EQ(run.config.train.max_steps, 50) << run.name;
    EXPECT_EQ(run.config.model.architecture, "qwen3");
  }
  EXPECT_TRUE(has(slurm_script(sw, "treetrain"), "#SBATCH --array=0-3\n"));
}

TEST(SlurmScriptTest, TrainScriptRunsOneTaskPerGpuWithNvlsOff) {
  std::ifstream in("scripts/slurm/train.sbatch");
  const std::string s((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(s.empty());
  for (const std::string line : {"#!/bin/bash\n", "#SBATCH --ntasks-per-node=8\n", "#SBATCH --gpus-per-node=8\n",
                                 "export NCCL_NVLS_ENABLE=0\n",
                                 "srun --kill-on-bad-exit=1 \"$TREETRAIN\" train --config \"$config\" "
                                 "--set distributed.mode=slurm \"$@\"\n"})
    EXPECT_TRUE(has(s, line)) << line;
  // sbatch reads #SBATCH lines only before the first command.
  EXPECT_LT(s.rfind("#SBATCH"), s.find("set -euo pipefail"));
  EXPECT_EQ(std::system("bash -n scripts/slurm/train.sbatch"), 0);
}

}  // namespace
}  // namespace tt::trainer
