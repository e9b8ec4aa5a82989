// The training loop.
//
// One optimizer step: take train.grad_accum micro-batches from the loader, compute the loss
// normaliser over the whole step (path_mean: the number of paths; token_mean: the number of
// targets over all flattened paths), run forward(batch, 1 / normaliser) and backward on each
// (gradients accumulate), take the global gradient norm, fold the clip factor
// min(1, grad_clip / (norm + 1e-6)) into AdamW's grad_scale, and update with the scheduled lr.
// Weight decay applies only to parameters with ParamInfo::decay.
//
// Partitioning (partition.capacity_tokens = C > 0, docs/PARTITIONING.md): a micro-batch that
// holds a single tree of more than C unique tokens (the loader emits trees larger than
// data.max_tokens_per_batch alone) runs Backend::forward_backward_partitioned on that tree's
// split tree and plan, made on the tree's first use and kept for later epochs; its loss and
// gradients are those of the unpartitioned batch, so the normaliser and metrics are unchanged.
// Micro-batches of several trees, or of one tree of at most C tokens, run unpartitioned.
//
// A run resumed from a checkpoint (train.resume) restores weights, AdamW moments, the step and
// the loader position, so it computes exactly (bitwise) the losses of an uninterrupted run.
// Metrics go to run_dir/metrics.jsonl, one JSON object per step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/loader.h"
#include "data/partition.h"
#include "data/tree.h"
#include "trainer/backend.h"
#include "trainer/config.h"

namespace tt::trainer {

struct StepMetrics {
  int64_t step = 0;  // 1-based: the update just taken
  double loss = 0;   // normalised loss of the step, before the update
  double lr = 0;
  double grad_norm = 0;     // global norm before clipping
  double tokens_per_s = 0;  // unique (tree) tokens processed per second of the step (gateway
                            // rows are read, not recomputed, so partitioning adds none)
  int64_t n_tree = 0;
  int64_t n_flat = 0;
  double por = 0;  // 1 - n_tree / n_flat
  int64_t paths = 0;
  int64_t pieces = 0;    // partition pieces run this step (0: no micro-batch was partitioned)
  double elapsed_s = 0;  // since the trainer started
};

class Trainer {
 public:
  // Loads the data, picks the backend, and resumes from the newest checkpoint (train.resume)
  // or initialises the model (model.init_from or a seeded init). Starting fresh in a run_dir
  // that already holds checkpoints is an error (set train.resume or pick another run_dir).
  explicit Trainer(const RunConfig& cfg);
  ~Trainer();

  int64_t step() const { return step_; }
  int64_t start_step() const { return start_step_; }  // the step resumed from (0 when fresh)
  const RunConfig& config() const { return cfg_; }
  Backend& backend() { return *backend_; }
  const data::BatchLoader& loader() const { return *loader_; }

  // One optimizer step (does not log, write metrics or checkpoint).
  StepMetrics train_step();
  // Writes run_dir/checkpoints/step_<step()> and prunes old ones; returns its path.
  std::string save_checkpoint();
  // Steps until train.max_steps with console logs, metrics.jsonl and checkpoints (every
  // checkpoint_every steps and at the end). Returns the metrics of the steps it took.
  std::vector<StepMetrics> run();

 private:
  // A tree trained piece by piece: split_long_nodes(tree, C) and plan_partition(split, C).
  struct PartitionedTree {
    data::Tree split;
    data::Partition plan;
  };
  // The plan of loader tree `index`, made (and logged) on first use.
  const PartitionedTree& partitioned(int64_t index);

  RunConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<data::BatchLoader> loader_;
  std::unordered_map<int64_t, PartitionedTree> partitioned_;  // by tree index
  int64_t data_size_ = -1;
  int64_t step_ = 0;
  int64_t start_step_ = 0;
  int64_t last_saved_step_ = -1;
  double t_start_ = 0;  // seconds, steady clock
};

}  // namespace tt::trainer
