// Typed, strict run configuration: YAML parses into one struct per concern.
// Unknown keys and bad values are errors that name the key and file:line (or the --set override);
// range and cross-field checks live in RunConfig::validate() and name them too. The resolved
// config is written next to every checkpoint.
//
// Layout of a config file (every key optional except data.path):
//   run_dir: runs/quickstart        device: auto | cpu | cuda
//   model:    Hugging Face names (architecture, vocab_size, hidden_size, ..., layer_types: a list,
//             one mixer per layer, [] = all full_attention) and init_from
//   data:     path, format, packing, max_tokens_per_batch, shuffle, history (episodes: full |
//             {window: W}), action_bins
//   vision:   the VLA's tower and connector, HF SiglipVisionConfig / LlavaConfig names
//             (hidden_size, ..., image_size, patch_size, freeze, image_token_index, state_dim, ...;
//             model/config.h VisionConfig); absent: a text model
//   train:    max_steps, seed, loss_norm, grad_clip, grad_accum, resume, log_every,
//             checkpoint_every, keep_checkpoints, final_checkpoint, gemm_autotune, gdn_products, on_nonfinite,
//             max_skipped_steps
//   optim:    lr, beta1, beta2 (or betas: [b1, b2]), eps, weight_decay
//   schedule: warmup_steps (longer than train.max_steps: a warning), decay, min_lr_ratio
//   partition: capacity_tokens, recompute (docs/PARTITIONING.md)
//   segments: length, tail, tbptt, long_range: {layers, heads, retrieve} (segment-level
//             execution, model/segments.h; off by default)
//   distributed: mode, comm, timeout_s, collective_timeout_s (data parallelism, distributed/README.md)
//
// Paths:
//  - run_dir: a relative run_dir is relative to the working directory of the process (the
//    directory `bazel run` was started from), so the same config puts runs where you are.
//  - data.path and model.init_from: relative paths written in a config FILE are relative to the
//    folder of that file; given with --set (or in a sweep's set / grid / list) they are relative
//    to the working directory. Either way they are made absolute when parsed, so the config.yaml
//    a run or a sweep writes points at the same files wherever it is read from.
//
// model.init_from: the model section is read from DIR/config.json; any model key also written
// in the config must agree with it (an error names the key otherwise). Without init_from, an
// omitted head_dim is hidden_size / num_attention_heads (the Llama rule).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/segment_config.h"

namespace tt::trainer {

// Bounds RunConfig::validate() checks beside the model's (model/config.h):
//  - data.max_tokens_per_batch in [1, 2^31 - 1]: packed indices are int32, and tokens x
//    model.num_attention_heads < 2^31 (the rows of the per-head q/k norm);
//  - train.max_steps, schedule.warmup_steps <= 2^53: steps are exact in the fp64 schedule;
//  - train.grad_accum <= 2^20 micro-batches per step;
//  - distributed.timeout_s, collective_timeout_s <= 10^7 s (they become clock durations).
constexpr int64_t kMaxTokensPerBatch = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxSteps = int64_t{1} << 53;
constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
constexpr double kMaxTimeoutS = 1e7;

struct DataConfig {
  std::string path;                     // JSONL file (relative paths: to the config file's folder)
  std::string format = "rollouts";      // rollouts | tree | tokens (one document a line) | episodes
                                        // (data/episodes.h: needs a vision section)
  std::string packing = "tree";         // tree | per_path (the baseline)
  // Budget of one micro-batch. per_path: a tree over it spreads its paths over micro-batches of
  // one step (each path must fit); tree: a tree over it is an error unless partitioning is on.
  int64_t max_tokens_per_batch = 4096;
  bool shuffle = true;
  // episodes: what each step's context holds. YAML `history: full` (0: every earlier observation)
  // or `history: {window: W}` (the instruction and the last W observations).
  int64_t history_window = 0;
  int64_t action_bins = 256;  // episodes with continuous actions: bins per dimension (data/actions.h)
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
  bool final_checkpoint = true;  // write a checkpoint at the end (off: benchmarks of big models)
  // cuda: time cuBLASLt's candidates once per GEMM shape bucket, the choices kept in
  // run_dir/gemm_tuning.json and restored on resume (trainer/gemm_tuning.h); off: the heuristic's
  // first algorithm.
  bool gemm_autotune = true;
  // cuda, Gated DeltaNet (linear_attention) layers: how the delta rule's chunk walks multiply
  // (ops/cuda/gdn.h GdnProducts). exact: fp32 products (each operand split into bf16 parts), the
  // layer within fp32 rounding of the fp64 reference. bf16: one bf16 mma a product, the state and
  // v_new rounded to bf16 for them as FLA's and FlashQLA's kernels do (a few 2^-9 of relative
  // error in the layer's outputs and gradients), faster walks. The CPU backend is exact either way.
  std::string gdn_products = "exact";  // exact | bf16
  // A step whose loss or gradient norm is not finite: stop (an error naming the step and the first
  // tensor with a non-finite gradient; exit code 3), or skip_step (no update, counted in the
  // metrics; more than max_skipped_steps in a row stops). An update that leaves a weight or AdamW
  // moment non-finite always stops, before any checkpoint is written.
  std::string on_nonfinite = "stop";  // stop | skip_step
  int64_t max_skipped_steps = 10;     // consecutive skipped steps allowed with skip_step
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

// Tree partitioning (data/partition.h, model/partitioned.h): a micro-batch that holds a single
// tree of more than capacity_tokens unique tokens is trained piece by piece (pieces of at most
// capacity_tokens tokens, joined by gateways), with exactly the loss and gradients of training it
// whole. Trees larger than data.max_tokens_per_batch then become micro-batches of their own
// instead of an error. Needs data.packing: tree and capacity_tokens <= data.max_tokens_per_batch
// (a piece is a micro-batch's worth of tokens); with a vision section, capacity_tokens >= a
// frame's tokens, (vision.image_size / vision.patch_size)^2 (a piece holds whole frames).
struct PartitionConfig {
  int64_t capacity_tokens = 0;  // tokens per piece; 0 = off
  // A piece with child pieces keeps only its K/V rows (and a hybrid's offered states) between its
  // forward and its backward, and runs its forward again before its backward: one piece's
  // activations resident at a time instead of a whole chain's, for one more forward of the
  // non-leaf pieces. The same loss and gradients (docs/PARTITIONING.md).
  bool recompute = false;
};

// Data parallelism (distributed/README.md). Whether a run is distributed comes from the launcher's
// environment (treetrain launch, torchrun, srun); this section says how to read it and how to
// talk. The global batch is the same as one process's: train.grad_accum micro-batches per step
// from the one seeded loader, whose trees are dealt to the ranks by estimated cost; the loss
// normaliser and the gradients are summed over ranks before clipping and AdamW, so N ranks take
// the update one process would. Only rank 0 writes metrics and checkpoints.
struct DistributedConfig {
  std::string mode = "auto";           // auto | torchrun | slurm | off (distributed/env.h)
  std::string comm = "auto";           // auto | cpu | nccl; auto: nccl for device gradients, else cpu
  double timeout_s = 60;               // joining the rendezvous; detecting a lost peer host
  double collective_timeout_s = 1800;  // the longest wait inside one collective (a hung peer)
};

struct RunConfig {
  std::string source;    // the config file, for messages
  // Where each key got its value, for messages: "file:line" (the config file, or the
  // config.json of model.init_from), or "--set key=value". Keys left at their defaults are absent
  // (messages then name `source`). Not part of the config itself (to_yaml does not write it).
  std::map<std::string, std::string> origin;
  std::string run_dir = "runs/default";
  std::string device = "auto";  // auto | cpu | cuda
  model::ModelConfig model;
  std::string init_from;  // model.init_from: HF layout directory ("" = fresh init)
  // model.num_experts (transformers' name, Qwen3-Next / Qwen3.5-MoE): accepted as written in HF
  // configs, 0 only (dense MLPs); a mixture of experts is an error naming the key, never a
  // silently dense model.
  int64_t num_experts = 0;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  ScheduleConfig schedule;
  PartitionConfig partition;
  // Segment-level execution (model/segments.h): paths longer than segments.length train segment by
  // segment (carried tail, truncated BPTT, retrieval), data.max_tokens_per_batch then bounds a
  // segment's piece, not a sequence; the CPU backend runs it so far.
  model::SegmentConfig segments;
  DistributedConfig distributed;

  // Range and cross-field checks; throws tt::Error "<where>: <key> must be ... (got ...)", where
  // is the key's origin (file:line or --set key=value), else `source`.
  void validate() const;
  // What is allowed but likely unintended (schedule.warmup_steps > train.max_steps: the schedule
  // is defined, the lr never reaches optim.lr), one message each, naming the key and where it
  // was set; treetrain logs them as warnings.
  std::vector<std::string> warnings() const;
  // Where `key` was set (origin), else `source` ("<config>" when empty).
  std::string where(const std::string& key) const;
  std::string to_yaml() const;  // resolved config, loads back to the same RunConfig
  // Every key with its value as to_yaml writes it, in to_yaml's order.
  std::vector<std::pair<std::string, std::string>> values() const;
};

// Loads a YAML file and applies `--set key.path=value` overrides (each an error naming the key
// when it does not exist). Relative paths resolve against the config file's folder. The result
// is validated.
RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides);
// The same from text. `source` names the text in messages; relative data.path / init_from written
// in the text resolve against base_dir when it is non-empty (load_config passes the file's folder).
RunConfig parse_config_text(const std::string& yaml_text, const std::string& source,
                            const std::vector<std::string>& overrides,
                            const std::string& base_dir = "");

}  // namespace tt::trainer
