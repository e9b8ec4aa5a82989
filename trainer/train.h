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
// Segments (segments.length = S > 0, model/segments.h): a tree deeper than S tokens runs
// segment by segment (Backend::forward_backward_segmented on data::plan_segments of the tree, or
// under per_path packing of each of its paths), a micro-batch of its own; shallower trees pack
// as usual (one segment is ordinary training). The loader emits trees over the budget alone;
// every segment piece must fit data.max_tokens_per_batch. Metrics count what the segments
// execute (model::segment_work).
//
// A run resumed from a checkpoint (train.resume) restores weights, AdamW moments, the step and
// the loader position, so it computes exactly (bitwise) the losses of an uninterrupted run.
// Metrics go to run_dir/metrics.jsonl, one JSON object per step, with throughput (tokens/s) and
// model FLOP utilisation (model_flops below over kPeakFlops x step time) for every backend, and
// to TensorBoard events in run_dir/tb (trainer/tensorboard.h; the scalars are listed in
// tensorboard_scalars, train.cc, one line each). The console line adds steps/s and an ETA over
// the steps since its last line, and shows MFU only on a GPU backend.
//
// Data parallelism (distributed/README.md): with a communicator of W > 1 ranks, every rank draws
// the step's train.grad_accum micro-batches from the same seeded loader, keeps its share of their
// trees (dealt by estimated cost, distributed/shard.h) and packs them into its own micro-batches;
// the normaliser and the metrics' counts are summed over ranks before forward, the gradients
// (identical bytes on every rank; the CPU communicator sums in fp64 in rank order) and the loss
// after backward, so every rank takes the update of one process with the same global batch (up
// to fp32 summation order).
// Only rank 0 writes metrics.jsonl, TensorBoard events and checkpoints; every rank resumes from
// rank 0's checkpoint (run_dir on a shared filesystem), and ranks check at start that they agree
// on the config and the step.
//
// Communicators: distributed.comm cpu (host gradients: the CPU backend) or nccl (device
// gradients: the CUDA backend; auto picks by Backend::grads_on_device()), one process per GPU
// (make_backend binds the local rank's GPU). The gradients are reduced in
// buckets (distributed::GradBuckets, ~25 MiB of whole parameters, last layers first): during the
// step's last micro-batch the backend reports each layer's gradients as its backward is enqueued
// (Backend::forward_backward_notify), and each bucket's all-reduce starts at once on the
// communicator's own stream, ordered after that backward work by an event, so it overlaps the
// rest of backward; after the last backward the remaining buckets start (the input embedding's,
// ready only at the very end) and the compute stream waits for them by an event (no host sync)
// before the norm, clipping and AdamW. A last micro-batch trained partitioned reports nothing
// (its pieces accumulate until the end) and is reduced after its backward. Small host values (the
// normaliser, the counts, the loss) go through the rendezvous (Communicator::all_reduce_host).
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "data/partition.h"
#include "model/segments.h"
#include "data/tree.h"
#include "distributed/buckets.h"
#include "distributed/communicator.h"
#include "distributed/env.h"
#include "distributed/shard.h"
#include "model/config.h"
#include "model/decoder.h"
#include "trainer/backend.h"
#include "trainer/config.h"
#include "trainer/run_dir.h"

namespace tt::trainer {

// Dense bf16 peak of one H100/H200 SXM, the denominator of MFU.
constexpr double kPeakFlops = 989e12;

// FLOPs of one training step come from the layer kinds' FLOP API (model/flops.h,
// model::Architecture::flops) over the step's micro-batches (model::Work::of each): under tree
// packing the unique tokens and the tree's pairs, so MFU counts only the work the tree needs;
// under per_path packing every path's tokens and pairs. Model FLOPs (the MFU numerator) charge the
// LM head on every packed row; executed FLOPs only on rows that predict a target.

struct StepMetrics {
  int64_t step = 0;  // 1-based: the update just taken
  double loss = 0;   // normalised loss of the step, before the update (sum_t w_t CE_t / normaliser:
                     // with signed weights the weighted objective, which can be negative)
  double nll = 0;    // unweighted mean token NLL over the step's flattened targets (the weights'
                     // signs and the normaliser aside: a language-model loss to watch)
  double lr = 0;
  double grad_norm = 0;     // global norm before clipping
  double tokens_per_s = 0;  // unique (tree) tokens processed per second of the step (gateway
                            // rows are read, not recomputed, so partitioning adds none)
  int64_t n_tree = 0;
  int64_t n_flat = 0;
  double por = 0;  // 1 - n_tree / n_flat
  int64_t paths = 0;
  int64_t pieces = 0;    // partition or segment pieces run this step (0: none)
  double elapsed_s = 0;  // since the trainer started
  double step_s = 0;     // wall time of the step (loader, forward/backward, norm, update)
  double model_tflops = 0;  // model FLOPs of the step per second, in TFLOP/s
  double mfu = 0;           // model_tflops * 1e12 / kPeakFlops
  double executed_flops = 0;  // FLOPs the step executed (this rank's micro-batches; with
                              // partition.recompute, the extra forwards too; MFU counts them not)
  double gemm_tune_s = 0;     // seconds this rank spent timing GEMM candidates (train.gemm_autotune)
  bool skipped = false;       // train.on_nonfinite: skip_step skipped this step's update
  int64_t skipped_steps = 0;  // steps skipped so far in this process
  int64_t world_size = 1;   // data-parallel ranks; the counts, loss and tokens/s above are global
  double imbalance = 1;     // max / mean of the ranks' estimated step cost (1: perfect balance)
  double reduce_s = 0;      // wall time from the end of the step's last backward to the global
                            // gradient norm: the gradient all-reduce that backward did not hide,
                            // the loss all-reduce and the norm (one process: the norm alone)
  double device_peak_gib = 0;  // peak device memory held by the model's allocator in the step
                               // (weights, gradients, optimizer state, activations); 0 on the CPU
};

// A non-finite loss, gradient norm, weight or AdamW moment that stops the run (treetrain exits
// with code 3 for it).
class NonFiniteError : public Error {
 public:
  explicit NonFiniteError(const std::string& msg) : Error(msg) {}
};

class Trainer {
 public:
  // Loads the data, picks the backend, and resumes from the newest checkpoint (train.resume)
  // or initialises the model (model.init_from or a seeded init). Starting fresh in a run_dir
  // that already holds checkpoint folders, valid or not, is an error (set train.resume or pick
  // another run_dir). The writer (rank 0) holds run_dir's lock (run_dir.h) while it lives.
  // `comm`: the data-parallel communicator (tests pass one); without it, the launcher's
  // environment decides (distributed.mode): one process, or a rendezvous at MASTER_ADDR.
  explicit Trainer(const RunConfig& cfg, std::unique_ptr<distributed::Communicator> comm = nullptr);
  ~Trainer();

  int64_t step() const { return step_; }
  int64_t start_step() const { return start_step_; }  // the step resumed from (0 when fresh)
  const RunConfig& config() const { return cfg_; }
  Backend& backend() { return *backend_; }
  const data::BatchLoader& loader() const { return *loader_; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world_size() const { return comm_ ? comm_->world_size() : 1; }

  // One optimizer step (does not log, write metrics or checkpoint).
  StepMetrics train_step();
  // Writes run_dir/checkpoints/step_<step()> and prunes old ones; returns its path. Rank 0 only:
  // other ranks write nothing and return "".
  std::string save_checkpoint();
  // Steps until train.max_steps with console logs, metrics.jsonl and checkpoints (every
  // checkpoint_every steps and at the end). Returns the metrics of the steps it took.
  std::vector<StepMetrics> run();

 private:
  // A tree trained piece by piece: split_long_nodes(tree, C) and plan_partition(split, C).
  struct PartitionedTree {
    data::Tree split;
    data::Partition plan;
    // partition.recompute: the work of the non-leaf pieces' extra forward (the no-grad one that
    // keeps their K/V rows: the blocks, no LM head), which executed_flops adds.
    model::Work recompute;
    // Episode trees: the frames whose tower runs again in another piece (a frame shown in several
    // pieces; forward and backward), which executed_flops adds.
    model::Work repeated;
  };
  // The plan of loader tree `index` with its work figures, made again at each call (kept, the
  // plans would hold a second copy of the data). Thread-safe.
  PartitionedTree partitioned(int64_t index) const;
  // Its split and plan alone (no work figures, not logged), checked against the gateway ranges
  // the backend's attention reads.
  PartitionedTree partition_plan(int64_t index) const;
  // What the steps read of a partitioned tree's plan: its extra work (costs, executed FLOPs) and
  // its resident sizes.
  struct PartitionFigures {
    model::Work recompute, repeated;
    int64_t max_piece_tokens = 0, peak_tokens = 0, kept_peak_tokens = 0;
  };
  static PartitionFigures figures_of(const PartitionedTree& p);
  // Loader tree `index`'s figures: made at start for those over the budget, else (and logged) the
  // first time it runs partitioned. With `plan`, also its plan for the step (planned once either
  // way: the figures' own plan on their first call, partition_plan after).
  const PartitionFigures& partition_figures(int64_t index, PartitionedTree* plan = nullptr);
  std::string partition_summary(const PartitionedTree& p) const;  // the log line of a plan
  // A tree trained segment by segment: the work its plans execute and their pieces. The plans
  // themselves are made again when it runs (kept, they would hold a second copy of the data).
  struct SegmentedTree {
    model::Work work;
    int64_t pieces = 0;
  };
  // The plans of loader tree `index`: one (tree packing) or one per path (per_path), each piece
  // checked against the budget. Thread-safe.
  std::vector<data::SegmentPlan> segment_plans(int64_t index) const;
  SegmentedTree segment_figures(const std::vector<data::SegmentPlan>& plans) const;
  // Their figures, made on first use.
  const SegmentedTree& segmented(int64_t index);
  // Plans every tree deeper than segments.length on the host's threads and keeps the figures;
  // returns the first tree in data order that cannot run and its error ({-1, null}: none).
  std::pair<int64_t, std::exception_ptr> plan_segmented_trees();
  // How a micro-batch runs: whole (tree -1), or loader tree `tree` partitioned or segmented.
  struct MicroRun {
    int64_t tree = -1;
    bool segments = false;
  };
  // Data parallelism: joins the job the environment describes (or takes `comm`) and checks that
  // every rank has the same build, config, start step and data (check_ranks_agree).
  void connect(std::unique_ptr<distributed::Communicator> comm, const distributed::DistEnv& env);
  void check_ranks_agree();
  // This rank's micro-batches of the step (see the file comment) and the deal's imbalance.
  void take_shard(std::vector<data::PackedBatch>* micro, std::vector<MicroRun>* runs, StepMetrics* m);
  // Appends the micro-batches of one group of trees (a loader batch, or a rank's greedy group):
  // one packed batch; or, for a tree alone that exceeds the budget, its pieces to be run
  // partitioned (tree packing, runs: its index) or its paths spread over several micro-batches
  // (per_path packing: data::path_ranges); with segments, each tree deeper than a segment its
  // own micro-batch (runs: its index, segments), its batch there only for the step's counts.
  void append_micro(const std::vector<int64_t>& group, std::vector<data::PackedBatch>* micro,
                    std::vector<MicroRun>* runs);
  // GEMM autotuning (trainer/gemm_tuning.h): restores the table of run_dir (else of the
  // checkpoint `ckpt` resumed from); after a step, agrees the ranks' pending winners (this rank's:
  // pending; pending_anywhere: their count summed over ranks), adopts them and writes the table.
  void restore_gemm_tuning(const std::string& ckpt);
  void share_gemm_tuning(int64_t step, const std::vector<cuda::GemmTuned>& pending, int64_t pending_anywhere);
  // The file's text after step `done`: tuning_ and the hints not adopted yet, each of those tagged
  // after `done` at the earliest (a resume at `done` or before still takes them as hints).
  std::string gemm_tuning_file_text(int64_t done) const;
  // Decodes a micro-batch's frames into its pixels (data::load_frames at vision.image_size).
  void load_frames(data::PackedBatch& b) const;
  // Time, throughput and FLOP fields of a step that began at t0; executed, not model FLOPs besides:
  // `forward_only` (partition.recompute's extra forwards) and `repeated` (trained again: the towers
  // of frames shown in several pieces).
  void finish_metrics(StepMetrics& m, double t0, const model::Work& work,
                      const model::Work& forward_only = model::Work{},
                      const model::Work& repeated = model::Work{}) const;

  RunConfig cfg_;
  RunDirLock run_lock_;  // rank 0's, taken before anything in run_dir is read or written
  model::Architecture arch_;  // the model's kinds: FLOPs and shard costs
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<data::BatchLoader> loader_;
  std::unordered_map<int64_t, PartitionFigures> partition_figures_;  // by tree index
  std::unordered_map<int64_t, SegmentedTree> segmented_;      // by tree index
  std::unique_ptr<distributed::Communicator> comm_;  // null: one process
  std::unique_ptr<distributed::GradBuckets> buckets_;  // with comm_: the gradient buffer's buckets
  std::vector<double> tree_cost_;                     // (#trees) shard cost, -1 until first use
  int64_t data_size_ = -1;
  std::string data_sha256_;  // of data.path's bytes (data_digest)
  // SHA-256 of data.path, computed once on first use: at the start by the writer of checkpoints,
  // else only when a resumed checkpoint recorded one to compare.
  const std::string& data_digest();
  std::string action_bins_json_;  // episodes with continuous actions: written into every checkpoint
  int64_t cameras_ = 0;           // episodes: images a step (read_episodes checks that all agree)
  int64_t step_ = 0;
  int64_t start_step_ = 0;
  int64_t last_saved_step_ = -1;
  int64_t consecutive_skips_ = 0;
  int64_t skipped_steps_ = 0;
  Backend::GemmTuneTotals tune_seen_;  // the backend's tuning totals at the end of the last step
  std::vector<cuda::GemmTuned> tuning_;  // adopted entries, tagged with their step (sorted by key)
  std::vector<cuda::GemmTuned> hints_;   // restored entries of steps after the resume point
  double t_start_ = 0;  // seconds, steady clock
};

// The first line where texts a and b differ, each side's ("(the end of its config)" where one
// ends first); {"", ""} when they are equal. For the ranks' agreement check.
std::pair<std::string, std::string> first_different_lines(const std::string& a, const std::string& b);

// Fault injection for tests: run() finds its metrics stream failed at this step (as a full disk
// would fail it); -1: never.
namespace testing {
inline int64_t metrics_write_fails_at = -1;
}  // namespace testing

}  // namespace tt::trainer
