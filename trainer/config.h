// Typed, strict run configuration: YAML parses into one struct per concern.
// Unknown keys and bad values are errors that name the key and file:line; cross-field checks live
// in RunConfig::validate(). The resolved config is written next to every checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace tt::trainer {

struct DataConfig {
  std::string path;                     // JSONL file (relative paths: to the config file's folder)
  std::string format = "rollouts";      // rollouts | tree
  std::string packing = "tree";         // tree | per_path (the baseline)
  int64_t max_tokens_per_batch = 4096;  // budget of one micro-batch
  bool shuffle = true;
};

struct TrainConfig {
  int64_t max_steps = 100;
  uint64_t seed = 1;
  std::string loss_norm = "path_mean";  // path_mean | token_mean
  double grad_clip = 1.0;               // global-norm clip; 0 disables
  int64_t grad_accum = 1;               // micro-batches per optimizer step
  bool resume = false;
  int64_t log_every = 1;
  int64_t checkpoint_every = 0;  // 0: only at the end
  int64_t keep_checkpoints = 2;  // newest checkpoints kept; 0 keeps all
};

struct OptimConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct ScheduleConfig {
  int64_t warmup_steps = 0;
  std::string decay = "cosine";  // cosine | linear | constant
  double min_lr_ratio = 0.1;     // final lr = lr * min_lr_ratio
};

struct RunConfig {
  std::string source;    // the config file, for messages
  std::string run_dir = "runs/default";
  std::string device = "auto";  // auto | cpu | cuda
  model::ModelConfig model;
  std::string init_from;  // model.init_from: HF layout directory ("" = fresh init)
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ScheduleConfig schedule;

  void validate() const;
  std::string to_yaml() const;  // resolved config, loads back to the same RunConfig
};

// Loads a YAML file and applies `--set key.path=value` overrides (each an error naming the key
// when it does not exist). Relative paths resolve against the config file's folder.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides);
RunConfig parse_config_text(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides);

}  // namespace tt::trainer
