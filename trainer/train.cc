#include "trainer/train.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/episode_tree.h"
#include "data/frames.h"
#include "data/reader.h"
#include "distributed/env.h"
#include "model/partitioned.h"
#include "distributed/nccl_communicator.h"
#include "distributed/rendezvous.h"
#include "base/check.h"
#include "base/files.h"
#include "base/parallel.h"
#include "trainer/checkpoint.h"
#include "trainer/data_checks.h"
#include "trainer/gemm_tuning.h"
#include "trainer/run_dir.h"
#include "trainer/schedule.h"
#include "trainer/tensorboard.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string metrics_path(const RunConfig& cfg) { return (fs::path(cfg.run_dir) / "metrics.jsonl").string(); }

std::string human_rate(double x) {
  std::ostringstream os;
  os.precision(3);
  if (x >= 1e6) os << x / 1e6 << "M";
  else if (x >= 1e3) os << x / 1e3 << "k";
  else os << x;
  return os.str();
}

// "1h02m", "3m05s", "12s".
std::string human_duration(double s) {
  const int64_t t = (int64_t)std::llround(std::max(0.0, std::min(s, 1e9)));
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof(buf), "%llds", (long long)t);
  return buf;
}

// The scalars TensorBoard shows (run_dir/tb), named as in metrics.jsonl: one line each.
std::vector<EventWriter::Scalar> tensorboard_scalars(const StepMetrics& m) {
  return {
      {"loss", m.loss},
      {"nll", m.nll},
      {"lr", m.lr},
      {"grad_norm", m.grad_norm},
      {"tokens_per_s", m.tokens_per_s},
      {"mfu", m.mfu},
      {"por", m.por},
      {"executed_flops", m.executed_flops},
      {"skipped_steps", (double)m.skipped_steps},
  };
}

RunConfig validated(const RunConfig& cfg) {
  cfg.validate();
  return cfg;
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg, std::unique_ptr<distributed::Communicator> comm)
    : cfg_(validated(cfg)), arch_(cfg_.model), t_start_(now_s()) {
  prepare_run_dir(cfg_);
  // A communicator handed in (tests) says the world; else the launcher's environment does.
  const distributed::DistEnv env = comm ? distributed::DistEnv{} : distributed::read_env(cfg_.distributed.mode);
  // The writer (rank 0) takes run_dir's lock before the ranks join, so a refused run fails on its
  // own instead of leaving the other ranks waiting in the rendezvous.
  if ((comm ? comm->rank() : env.rank) == 0) run_lock_ = RunDirLock(cfg_.run_dir);
  const std::string& device = cfg_.device;
  model::CudaExecOptions cuda_options;
  cuda_options.gemm_autotune = cfg_.train.gemm_autotune;
  cuda_options.gdn_products = cfg_.train.gdn_products == "bf16" ? cuda::GdnProducts::kBf16 : cuda::GdnProducts::kExact;
  backend_ = make_backend(device, cfg_.model, env.local_rank, env.local_world_size, cuda_options,
                          cfg_.data.max_tokens_per_batch);
  connect(std::move(comm), env);
  if (cfg_.train.gdn_products == "bf16" && (backend_->name() != "cuda" || !cfg_.model.has_linear_attention()))
    spdlog::warn("train.gdn_products: bf16 has no effect here: it concerns the CUDA kernels of linear_attention "
                 "layers ({})", backend_->name() != "cuda" ? "the cpu backend computes the delta rule exactly"
                                                           : "the model has none");
  spdlog::info("model: {} L={} C={} NH={} NKV={} HS={} I={} V={}: {} parameters on {}", cfg_.model.architecture,
               cfg_.model.num_hidden_layers, cfg_.model.hidden_size, cfg_.model.num_attention_heads,
               cfg_.model.num_key_value_heads, cfg_.model.head_dim, cfg_.model.intermediate_size,
               cfg_.model.vocab_size, backend_->num_params(), backend_->name());

  // Data.
  std::error_code ec;
  const auto size = fs::file_size(cfg_.data.path, ec);
  if (ec) throw Error(str("data.path: cannot read '", cfg_.data.path, "': ", ec.message()));
  data_size_ = (int64_t)size;
  // The writer records the bytes it trains on in its checkpoints; other ranks hash only to check a
  // resume (data_digest), so a large file is not read once more by every rank.
  if (rank() == 0 && (cfg_.train.final_checkpoint || cfg_.train.checkpoint_every > 0)) data_digest();
  std::vector<data::Tree> trees;
  if (cfg_.data.format == "episodes") {
    const model::VisionConfig& v = cfg_.model.vision;
    data::EpisodeTreeSpec spec;
    spec.tokens_per_frame = (int)v.tokens_per_frame();
    spec.image_token = (int32_t)v.image_token_index;
    spec.state_token = (int32_t)v.state_token_index;
    spec.window = (int)cfg_.data.history_window;
    data::ActionBins bins;
    trees = data::read_episode_trees(cfg_.data.path, cfg_.model.vocab_size, spec, (int)cfg_.data.action_bins, &bins);
    if (bins.dims() > 0) action_bins_json_ = bins.to_json();
    for (const std::string& w : bins.fit_warnings) spdlog::warn("{}: {}", cfg_.data.path, w);
    if (!trees.empty())
      for (const data::FrameRef& f : trees[0].media.frames)
        if (f.step == 0) cameras_ = std::max<int64_t>(cameras_, f.camera + 1);
    int64_t frames = 0, slots = 0, states = 0;
    for (const data::Tree& t : trees) {
      frames += (int64_t)t.media.frames.size();
      slots += t.frame_occurrences();
      states += (int64_t)t.media.states.size();
      if (!t.media.states.empty() && (int64_t)t.media.states[0].values.size() != v.state_dim)
        throw Error(str(cfg_.data.path, ": episode '", t.id, "' has states of ", t.media.states[0].values.size(),
                        " values, but vision.state_dim is ", v.state_dim, " (", cfg_.where("vision.state_dim"), ")"));
    }
    spdlog::info("data: {} episodes, {} unique frames shown {} times ({:.2f}x reuse), {} state rows, {}", trees.size(),
                 frames, slots, frames > 0 ? (double)slots / frames : 0.0, states,
                 bins.dims() > 0 ? str(bins.dims(), "-dim continuous actions in ", bins.bins, " bins") : "discrete actions");
  } else {
    trees = data::read_trees(cfg_.data.path, data::parse_format(cfg_.data.format, "data.format"), cfg_.model.vocab_size);
    if (cfg_.model.vision.enabled())
      spdlog::warn("data: a vision section with data.format {}: the tower runs on no frames", cfg_.data.format);
  }
  if (trees.empty()) throw Error(str(cfg_.data.path, ": no trees (data.path)"));
  for (const std::string& w : check_training_data(trees, cfg_)) spdlog::warn("{}", w);
  int64_t n_tree = 0, n_flat = 0, n_paths = 0;
  for (const data::Tree& t : trees) {
    n_tree += t.n_tree();
    n_flat += t.n_flat();
    n_paths += t.n_paths();
  }
  spdlog::info("data: {} trees, {} paths, {} unique tokens, {} flattened (POR {:.3f}) from {}", trees.size(),
               n_paths, n_tree, n_flat, n_flat > 0 ? 1.0 - (double)n_tree / n_flat : 0.0, cfg_.data.path);
  const data::Packing packing = cfg_.data.packing == "per_path" ? data::Packing::kPerPath : data::Packing::kTree;
  const int64_t capacity = cfg_.partition.capacity_tokens;
  if (capacity > 0) {
    int64_t over_capacity = 0, over_budget = 0;
    for (const data::Tree& t : trees) {
      over_capacity += t.n_tree() > capacity;
      over_budget += t.n_tree() > cfg_.data.max_tokens_per_batch;
    }
    spdlog::info("partition: {} tokens per piece; {} of {} trees are larger ({} larger than "
                 "data.max_tokens_per_batch {}, each a micro-batch of its own)",
                 capacity, over_capacity, trees.size(), over_budget, cfg_.data.max_tokens_per_batch);
  }
  if (packing == data::Packing::kPerPath) {
    int64_t spread = 0;
    for (const data::Tree& t : trees) spread += t.n_flat() > cfg_.data.max_tokens_per_batch;
    if (spread > 0)
      spdlog::info("data: {} of {} trees have more than data.max_tokens_per_batch = {} tokens per_path; each comes "
                   "alone, its paths spread over micro-batches of one step",
                   spread, trees.size(), cfg_.data.max_tokens_per_batch);
  }
  if (cfg_.segments.enabled()) {
    int64_t deeper = 0;
    for (const data::Tree& t : trees) deeper += t.max_depth() > cfg_.segments.length;
    spdlog::info("segments: {} of {} trees are deeper than segments.length {} and train segment by segment "
                 "(tail {}, tbptt {}, {} long-range layers, retrieve {})",
                 deeper, trees.size(), cfg_.segments.length, cfg_.segments.tail, cfg_.segments.tbptt,
                 cfg_.segments.long_range.layers.size(), cfg_.segments.long_range.retrieve);
  }
  // A tree or path over the budget: which file, where the budget was set, what helps.
  auto over_budget = [&](const Error& e, const std::string& more) {
    return Error(str(cfg_.where("data.max_tokens_per_batch"), ": data.path ", cfg_.data.path, ": ", e.what(),
                     packing == data::Packing::kTree ? " (or set partition.capacity_tokens to cut larger trees into "
                                                       "pieces)"
                                                     : "",
                     more));
  };
  try {
    loader_ = std::make_unique<data::BatchLoader>(std::move(trees), packing, cfg_.data.max_tokens_per_batch,
                                                  cfg_.train.seed, cfg_.data.shuffle,
                                                  capacity > 0 || cfg_.segments.enabled() ? data::Oversize::kAlone
                                                  : packing == data::Packing::kPerPath    ? data::Oversize::kSplitPaths
                                                                                          : data::Oversize::kError);
  } catch (const Error& e) {
    throw over_budget(e, "");
  }

  // The trees that may run partitioned (over partition.capacity_tokens: one over the budget always
  // does, alone, and its plan's figures are kept for the steps' costs; one at or under it does
  // whenever a step's packing leaves it alone in a micro-batch, append_micro; each is planned
  // again when it runs) or segment by segment (deeper than segments.length): planned now, so a
  // plan that cannot run (too many gateway ranges, a piece over the budget) or, below, cannot fit
  // stops the run before its first step. With segments on
  // the loader lets any tree through alone (Oversize::kAlone), but one no deeper than
  // segments.length runs whole: it must fit the budget as without segments (data::check_fits:
  // per_path each of its paths, tree packing the tree unless partitioned), checked here too and not
  // in its step.
  const int64_t budget = cfg_.data.max_tokens_per_batch;
  const bool rec = cfg_.partition.recompute;
  int64_t need = -1;  // the most a partitioned tree holds at once, and that tree
  int64_t worst = -1;
  if (capacity > 0) {  // the trees over the capacity planned on the host's threads, in data order
    std::vector<int64_t> over;
    for (int64_t i = 0; i < (int64_t)loader_->trees().size(); ++i)
      if (loader_->trees()[i].n_tree() > capacity) over.push_back(i);
    std::vector<PartitionFigures> figures(over.size());
    std::vector<std::string> summary(over.size());
    const double t0 = now_s();
    parallel_for((int64_t)over.size(), [&](int64_t k) {
      // Over the budget: always partitioned, its work figures kept; at or under it: the memory
      // check's figures only.
      const bool over_budget = loader_->trees()[over[k]].n_tree() > budget;
      const PartitionedTree p = over_budget ? partitioned(over[k]) : partition_plan(over[k]);
      figures[k] = figures_of(p);
      if (over_budget) summary[k] = partition_summary(p);
    });
    for (size_t k = 0; k < over.size(); ++k) {
      const PartitionFigures& f = figures[k];
      const int64_t b = backend_->partition_resident_bytes(rec ? f.max_piece_tokens : f.peak_tokens,
                                                           rec ? f.kept_peak_tokens : 0);
      if (b > need) need = b, worst = over[k];
      if (summary[k].empty()) continue;  // over the budget: always partitioned, logged now as it will run
      partition_figures_.emplace(over[k], f);
      spdlog::info("{}", summary[k]);
    }
    if (!over.empty())
      spdlog::info("partition: {} trees over {} tokens planned in {:.1f} s", over.size(), capacity, now_s() - t0);
  }
  // Trees deeper than segments.length, planned on the host's threads; the first that cannot run
  // stops the run in data order with the shallow trees' checks below.
  const auto [seg_bad, seg_error] =
      cfg_.segments.enabled() ? plan_segmented_trees() : std::pair<int64_t, std::exception_ptr>{-1, nullptr};
  for (int64_t i = 0; i < (int64_t)loader_->trees().size(); ++i) {
    const data::Tree& t = loader_->trees()[i];
    if (i == seg_bad) std::rethrow_exception(seg_error);
    if (!cfg_.segments.enabled() || t.max_depth() > cfg_.segments.length) continue;  // planned above
    const bool per_path = packing == data::Packing::kPerPath;
    if ((per_path || capacity == 0) && data::packed_size(t, packing) > budget) {
      try {
        data::check_fits(t, packing, budget, /*split_paths=*/per_path);
      } catch (const Error& e) {
        throw over_budget(e, str(" (with segments only trees deeper than segments.length ", cfg_.segments.length,
                                 " train segment by segment; this one's depth is ", t.max_depth(), ")"));
      }
    }
  }
  // And what the largest of them holds at once (a chain of pieces' activations, or with
  // partition.recompute one piece's and the K/V rows), against the memory free now: a tree that
  // cannot fit stops the run here, not in the step that draws it.
  if (need >= 0) {
    const PartitionedTree w = partition_plan(worst);
    const int64_t need_rec = backend_->partition_resident_bytes(w.plan.max_piece_tokens, w.plan.kept_peak_tokens);
    const std::string problem =
        partition_memory_problem(w.split.id, w.split.n_tree(), w.plan, rec, need, need_rec, backend_->free_memory_bytes(),
                                 backend_->device() >= 0 ? str("GPU ", backend_->device(), " has") : "the host has");
    if (!problem.empty())
      throw Error(str(cfg_.where("partition.capacity_tokens"), ": data.path ", cfg_.data.path, ": ", problem));
  }

  // Model state: resume (from the newest valid checkpoint; rank 0 moves invalid ones aside), or
  // start fresh. Rank 0, the writer, first removes what killed writers left.
  if (rank() == 0) clean_checkpoint_leftovers(cfg_.run_dir);
  std::string ckpt;
  if (!cfg_.train.resume) {
    ckpt = latest_checkpoint(cfg_.run_dir);
  } else {
    // Rank 0 chooses (reading every file for its CRC-32, moving invalid ones aside) and the others
    // take its choice: one rank reads the checkpoint's bytes twice, not every rank, and no rank
    // races rank 0's renames.
    ckpt = rank() == 0 ? resume_checkpoint(cfg_.run_dir, cfg_.model, backend_->params_info()) : "";
    if (comm_) ckpt = comm_->all_gather_host(ckpt)[0];
    if (rank() != 0 && !ckpt.empty()) {
      const std::vector<model::ParamInfo> params = backend_->params_info();
      if (const std::string problem = checkpoint_problem(ckpt, &cfg_.model, &params, /*contents=*/false);
          !problem.empty())
        throw Error(str(comm_->tag(), ": rank 0 resumes from ", ckpt, ", which this rank cannot use: ", problem,
                        " (every rank must see rank 0's run_dir: a shared filesystem)"));
    }
  }
  if (cfg_.train.resume && !ckpt.empty()) {
    const TrainerState st = load_checkpoint(ckpt, cfg_, *backend_, [this] { return data_digest(); });
    if (const std::string bad = backend_->first_nonfinite(true, false, true); !bad.empty())
      throw NonFiniteError(str(ckpt, ": ", bad, " holds non-finite values (train.resume); move the checkpoint aside "
                               "to resume from an earlier one"));
    try {
      loader_->restore(st.loader);
    } catch (const Error& e) {
      throw Error(str(ckpt, "/trainer_state.json: ", e.what(), " (data.path ", cfg_.data.path, ")"));
    }
    skipped_steps_ = st.skipped_steps;
    consecutive_skips_ = st.consecutive_skips;
    step_ = start_step_ = last_saved_step_ = st.step;
    spdlog::info("resumed from {} (step {}, epoch {}, cursor {})", ckpt, st.step, st.loader.epoch, st.loader.cursor);
    if (rank() == 0) prune_checkpoints(cfg_.run_dir, cfg_.train.keep_checkpoints);
    restore_gemm_tuning(ckpt);
    check_ranks_agree();
    return;
  }
  if (!ckpt.empty())
    throw Error(str("run_dir ", cfg_.run_dir, " already holds checkpoints (newest ", ckpt,
                    "); set train.resume: true to continue that run, or use another run_dir"));
  if (!cfg_.train.resume) {
    // None valid: a fresh run would write its step_N over them. Resuming moves them aside instead.
    if (const std::string invalid = invalid_checkpoints_summary(cfg_.run_dir); !invalid.empty())
      throw Error(str("run_dir ", cfg_.run_dir, " already holds ", invalid,
                      "; set train.resume: true to continue that run (it moves invalid checkpoints aside, to "
                      "step_N.invalid-<time>), or use another run_dir"));
  }
  if (cfg_.train.resume) spdlog::info("train.resume: no checkpoint in {}, starting fresh", checkpoints_dir(cfg_.run_dir));
  if (!cfg_.init_from.empty()) {
    backend_->load_hf(cfg_.init_from);
    if (const std::string bad = backend_->first_nonfinite(true, false, false); !bad.empty())
      throw NonFiniteError(str(cfg_.init_from, ": ", bad, " holds non-finite values (model.init_from)"));
    spdlog::info("weights from {} (model.init_from)", cfg_.init_from);
  } else {
    backend_->init(cfg_.train.seed);
    spdlog::info("fresh init, seed {}", cfg_.train.seed);
  }
  restore_gemm_tuning("");
  check_ranks_agree();
}

void Trainer::restore_gemm_tuning(const std::string& ckpt) {
  const std::string signature = backend_->gemm_tuning_signature();
  if (signature.empty()) return;
  std::string file = (fs::path(cfg_.run_dir) / kGemmTuningFile).string();
  if (!fs::exists(file) && !ckpt.empty()) file = (fs::path(ckpt) / kGemmTuningFile).string();
  if (!fs::exists(file)) {
    spdlog::info("gemm autotune: no table yet; each new GEMM shape bucket is timed once, and the table kept in {}",
                 (fs::path(cfg_.run_dir) / kGemmTuningFile).string());
    return;
  }
  const GemmTuning t = parse_gemm_tuning(read_text(file, "the GEMM tuning table"), file);
  if (t.signature != signature) {
    spdlog::warn("gemm autotune: {} was tuned for '{}', this is '{}': not restored, tuning anew (the run will not "
                 "choose the interrupted run's algorithms)",
                 file, t.signature, signature);
    return;
  }
  // Adopted at the resume point: entries of steps <= step_; later ones replay as hints.
  for (const cuda::GemmTuned& e : t.entries) (e.step <= step_ ? tuning_ : hints_).push_back(e);
  backend_->set_gemm_tuning(tuning_);
  backend_->set_gemm_hints(hints_);
  spdlog::info("gemm autotune: {} tuned GEMM shape buckets restored from {} ({} adopted by step {}, {} as hints for "
               "later steps)",
               t.entries.size(), file, tuning_.size(), step_, hints_.size());
}

std::string Trainer::gemm_tuning_file_text(int64_t done) const {
  std::vector<cuda::GemmTuned> all = tuning_;
  for (cuda::GemmTuned h : hints_) {
    const bool adopted = std::any_of(all.begin(), all.end(), [&](const cuda::GemmTuned& e) { return e.key == h.key; });
    if (adopted) continue;
    h.step = std::max(h.step, done + 1);  // not adopted by step `done`: still a hint for a resume there
    all.push_back(h);
  }
  std::sort(all.begin(), all.end(), [](const cuda::GemmTuned& a, const cuda::GemmTuned& b) { return a.key < b.key; });
  return gemm_tuning_json({backend_->gemm_tuning_signature(), all});
}

void Trainer::share_gemm_tuning(int64_t step, const std::vector<cuda::GemmTuned>& pending, int64_t pending_anywhere) {
  if (pending_anywhere == 0) return;
  const std::string signature = backend_->gemm_tuning_signature();
  std::vector<cuda::GemmTuned> adopted = pending;
  if (comm_) {  // the lowest rank's winner for every key any rank timed: all ranks adopt the same
    const std::vector<std::string> all = comm_->all_gather_host(gemm_tuning_json({signature, pending}));
    std::vector<std::vector<cuda::GemmTuned>> by_rank;
    for (int r = 0; r < (int)all.size(); ++r) {
      const GemmTuning t = parse_gemm_tuning(all[r], str(comm_->tag(), ": rank ", r, "'s GEMM tuning table"));
      if (t.signature != signature)
        throw Error(str(comm_->tag(), ": rank ", r, " tunes GEMMs for '", t.signature, "', rank ", rank(), " for '",
                        signature, "' (data parallelism needs the same GPU and cuBLASLt on every rank)"));
      by_rank.push_back(t.entries);
    }
    adopted = merge_gemm_tuning(by_rank);
  }
  int64_t added = 0;  // the same on every rank: the merged list and tuning_ are
  for (cuda::GemmTuned e : adopted) {
    const bool known = std::any_of(tuning_.begin(), tuning_.end(), [&](const cuda::GemmTuned& t) { return t.key == e.key; });
    if (known) continue;
    e.step = step;
    tuning_.push_back(e);
    ++added;
  }
  if (added == 0) return;
  std::sort(tuning_.begin(), tuning_.end(), [](const cuda::GemmTuned& a, const cuda::GemmTuned& b) { return a.key < b.key; });
  backend_->set_gemm_tuning(tuning_);
  if (rank() != 0) return;
  const std::string file = (fs::path(cfg_.run_dir) / kGemmTuningFile).string();
  write_text_atomic(file, gemm_tuning_file_text(step));
  const Backend::GemmTuneTotals now = backend_->gemm_tune_totals();
  spdlog::info("gemm autotune: step {} timed {} new GEMM shape buckets in {:.2f} s ({} winners adopted on all ranks, "
               "from the next step; {} plans took a table entry so far); {} entries in {}",
               step, now.tuned - tune_seen_.tuned, now.tune_s - tune_seen_.tune_s, adopted.size(), now.reused,
               tuning_.size(), file);
}

Trainer::~Trainer() = default;

void Trainer::connect(std::unique_ptr<distributed::Communicator> comm, const distributed::DistEnv& env) {
  if (!comm) {
    if (!env.distributed()) return;
    const std::string kind =
        cfg_.distributed.comm != "auto" ? cfg_.distributed.comm : (backend_->grads_on_device() ? "nccl" : "cpu");
    // Checked before joining: every rank has the same config, so all fail alike and at once.
    if (kind == "nccl" && !backend_->grads_on_device())
      throw Error(str(env.describe(), ": distributed.comm: nccl reduces device buffers, but the ", backend_->name(),
                      " backend keeps its gradients on the host (device: cuda, or distributed.comm: auto|cpu)"));
    if (kind == "cpu" && backend_->grads_on_device())
      throw Error(str(env.describe(), ": distributed.comm: cpu reduces host buffers, but the ", backend_->name(),
                      " backend keeps its gradients on the device (distributed.comm: auto|nccl)"));
    spdlog::info("distributed: {} joining {} ranks at {}:{} (from the {} environment), {} communicator{}",
                 env.describe(), env.world_size, env.master_addr, env.master_port, env.source, kind,
                 backend_->device() >= 0 ? str(", GPU ", backend_->device()) : std::string());
    distributed::RendezvousOptions options;
    options.timeout_s = cfg_.distributed.timeout_s;
    options.collective_timeout_s = cfg_.distributed.collective_timeout_s;
    std::unique_ptr<distributed::Rendezvous> rv = distributed::Rendezvous::connect(env, options);
    if (kind == "nccl") {
      comm = distributed::make_nccl_communicator(std::move(rv), backend_->device(),
                                                 static_cast<cudaStream_t>(backend_->compute_stream()));
    } else {
      comm = distributed::make_cpu_communicator(std::move(rv));
    }
  }
  if (comm->world_size() == 1) return;
  if (backend_->grads_data() == nullptr)
    throw Error(str(comm->tag(), ": the ", backend_->name(), " backend cannot train data-parallel (no gradient buffer)"));
  if (comm->device_buffers() != backend_->grads_on_device())
    throw Error(str(comm->tag(), ": the ", comm->name(), " communicator reduces ",
                    comm->device_buffers() ? "device" : "host", " buffers, but the ", backend_->name(),
                    " backend keeps its gradients on the ", backend_->grads_on_device() ? "device" : "host",
                    " (distributed.comm)"));
  comm_ = std::move(comm);
  std::vector<distributed::ParamRange> ranges;
  for (const model::ParamInfo& p : backend_->params_info()) ranges.push_back({p.offset, p.numel});
  buckets_ = std::make_unique<distributed::GradBuckets>(ranges);
  spdlog::info("distributed: {} of {} ranks, {} communicator, gradients in {} buckets of about {} MiB; rank 0 writes "
               "metrics and checkpoints",
               comm_->tag(), comm_->world_size(), comm_->name(), buckets_->buckets().size(),
               distributed::GradBuckets::kDefaultBucketBytes >> 20);
}

std::pair<std::string, std::string> first_different_lines(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (;;) {
    const bool more_a = (bool)std::getline(sa, la), more_b = (bool)std::getline(sb, lb);
    if (!more_a && !more_b) return {"", ""};
    if (!more_a || !more_b || la != lb)
      return {more_a ? la : "(the end of its config)", more_b ? lb : "(the end of its config)"};
  }
}

void Trainer::check_ranks_agree() {
  if (!comm_) return;
  // The build (its executable's SHA-256: another build may compute or lay out anything
  // differently), then the resolved config (run_dir included) and the step every rank starts from.
  std::string build = "unknown";
  try {
    build = file_sha256("/proc/self/exe");
  } catch (const Error&) {
  }
  // Last, the data each rank read (the same data.path may hold other bytes on another node's
  // disk): its size and a hash of the trees as parsed.
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof fingerprint, "%016llx",
                (unsigned long long)data::trees_fingerprint(loader_->trees()));
  const std::string mine = str("treetrain build ", build, "\nstart step ", start_step_, "\n", cfg_.to_yaml(), "\ndata ",
                               data_size_, " bytes, ", loader_->trees().size(), " trees, fingerprint ", fingerprint);
  const std::vector<std::string> all = comm_->all_gather_host(mine);
  for (int r = 1; r < (int)all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const auto [la, lb] = first_different_lines(all[0], all[r]);
    const bool builds = la.rfind("treetrain build ", 0) == 0 && lb.rfind("treetrain build ", 0) == 0;
    const bool data = la.rfind("data ", 0) == 0 && lb.rfind("data ", 0) == 0;
    throw Error(str(comm_->tag(), ": rank ", r, " disagrees with rank 0: '", lb, "' vs '", la, "' (",
                    builds ? "every rank must run the same treetrain build"
                    : data ? str("every rank must read the same data: data.path ", cfg_.data.path,
                                 " holds other trees on rank ", r, "'s machine")
                           : "every rank needs the same config, --set overrides and checkpoints: a shared run_dir",
                    ")"));
  }
}

void Trainer::take_shard(std::vector<data::PackedBatch>* micro, std::vector<MicroRun>* runs,
                         StepMetrics* m) {
  const data::Packing packing = cfg_.data.packing == "per_path" ? data::Packing::kPerPath : data::Packing::kTree;
  const std::vector<data::Tree>& trees = loader_->trees();
  if (tree_cost_.empty()) tree_cost_.assign(trees.size(), -1.0);
  std::vector<int64_t> step_trees;  // the global batch, in loader order
  for (int64_t i = 0; i < cfg_.train.grad_accum; ++i) {
    const std::vector<int64_t> t = loader_->next_indices();
    step_trees.insert(step_trees.end(), t.begin(), t.end());
  }
  std::vector<double> cost;
  for (int64_t t : step_trees) {
    if (tree_cost_[t] < 0 && cfg_.segments.enabled() && trees[t].max_depth() > cfg_.segments.length) {
      // A tree deeper than a segment runs segment by segment: what its segments execute (a long
      // sequence's attention linear in its length, not quadratic as its tree packing's).
      tree_cost_[t] = arch_.flops(segmented(t).work, model::Pass::kTrain).executed;
    } else if (tree_cost_[t] < 0) {
      tree_cost_[t] = distributed::tree_cost(arch_, trees[t], packing);
      // A tree over the budget runs partitioned: frames shown in several pieces run their tower in
      // each; with partition.recompute, its non-leaf pieces run forward twice.
      if (cfg_.partition.capacity_tokens > 0 && trees[t].n_tree() > cfg_.data.max_tokens_per_batch) {
        const PartitionFigures& f = partition_figures(t);
        tree_cost_[t] += arch_.flops(f.repeated, model::Pass::kTrain).executed +
                         arch_.flops(f.recompute, model::Pass::kForward).executed;
      }
    }
    cost.push_back(tree_cost_[t]);
  }
  const distributed::Shards shards = distributed::balance(cost, world_size());
  m->imbalance = shards.imbalance();
  std::vector<int64_t> mine, sizes;
  for (int64_t i : shards.items[rank()]) {
    mine.push_back(step_trees[i]);
    sizes.push_back(data::packed_size(trees[step_trees[i]], packing));
  }
  for (const std::vector<int64_t>& group : distributed::pack_greedy(sizes, cfg_.data.max_tokens_per_batch)) {
    std::vector<int64_t> indices;
    for (int64_t g : group) indices.push_back(mine[g]);
    append_micro(indices, micro, runs);
  }
}

void Trainer::append_micro(const std::vector<int64_t>& group, std::vector<data::PackedBatch>* micro,
                           std::vector<MicroRun>* runs) {
  const data::Packing packing = cfg_.data.packing == "per_path" ? data::Packing::kPerPath : data::Packing::kTree;
  const std::vector<data::Tree>& trees = loader_->trees();
  const int64_t budget = cfg_.data.max_tokens_per_batch;
  std::vector<int64_t> whole;  // the trees that run as one batch
  for (int64_t t : group) {
    if (!cfg_.segments.enabled() || trees[t].max_depth() <= cfg_.segments.length) {
      whole.push_back(t);
      continue;
    }
    // Only its counts are read from this batch (the normaliser, n_tree, n_flat, paths).
    data::PackedBatch counts;
    counts.n_paths = trees[t].n_paths();
    counts.n_flat = trees[t].n_flat();
    counts.n_tree = packing == data::Packing::kTree ? trees[t].n_tree() : trees[t].n_flat();
    counts.n_flat_targets = trees[t].n_flat_targets();
    micro->push_back(std::move(counts));
    runs->push_back(MicroRun{t, true});
  }
  if (whole.empty()) return;
  if (packing == data::Packing::kPerPath && whole.size() == 1 && trees[whole[0]].n_flat() > budget) {
    // Its paths over several micro-batches of this step: the step's normaliser counts each once.
    const data::Tree& tree = trees[whole[0]];
    for (const auto& [first, end] : data::path_ranges(tree, budget)) {
      micro->push_back(data::pack_path_range(tree, first, end));
      load_frames(micro->back());
      runs->push_back(MicroRun{});
    }
    return;
  }
  std::vector<const data::Tree*> batch;
  for (int64_t t : whole) batch.push_back(&trees[t]);
  micro->push_back(data::pack(batch, packing));
  const int64_t capacity = cfg_.partition.capacity_tokens;
  const bool alone_and_large = capacity > 0 && whole.size() == 1 && micro->back().n_tree > capacity;
  // A tree run piece by piece decodes each piece's frames when the piece runs; its whole batch
  // only gives the step's counts.
  if (!alone_and_large) load_frames(micro->back());
  runs->push_back(MicroRun{alone_and_large ? whole[0] : -1, false});
}

std::vector<data::SegmentPlan> Trainer::segment_plans(int64_t index) const {
  const data::Tree& tree = loader_->trees()[index];
  std::vector<data::SegmentPlan> plans;
  try {
    if (cfg_.data.packing == "per_path") {
      for (int64_t k = 0; k < tree.n_paths(); ++k)
        plans.push_back(data::plan_segments(data::path_tree(tree, k), cfg_.segments.length));
    } else {
      plans.push_back(data::plan_segments(tree, cfg_.segments.length));
    }
  } catch (const Error& e) {
    throw Error(str(cfg_.where("segments.length"), ": data.path ", cfg_.data.path, ": ", e.what()));
  }
  for (const data::SegmentPlan& plan : plans)
    if (plan.pieces.max_piece_tokens > cfg_.data.max_tokens_per_batch)
      throw Error(str(cfg_.where("data.max_tokens_per_batch"), ": data.path ", cfg_.data.path, ": tree '", tree.id,
                      "': a segment piece of ", plan.pieces.max_piece_tokens,
                      " tokens exceeds data.max_tokens_per_batch ", cfg_.data.max_tokens_per_batch,
                      " (with segments the budget bounds a piece: the branches of one segment; raise the budget or "
                      "lower segments.length ", cfg_.segments.length, ")"));
  return plans;
}

Trainer::SegmentedTree Trainer::segment_figures(const std::vector<data::SegmentPlan>& plans) const {
  SegmentedTree s;
  for (const data::SegmentPlan& plan : plans) {
    s.pieces += plan.pieces.num_pieces();
    s.work += model::segment_work(cfg_.segments, plan, cfg_.model);
  }
  return s;
}

const Trainer::SegmentedTree& Trainer::segmented(int64_t index) {
  auto it = segmented_.find(index);
  if (it != segmented_.end()) return it->second;
  return segmented_.emplace(index, segment_figures(segment_plans(index))).first->second;
}

std::pair<int64_t, std::exception_ptr> Trainer::plan_segmented_trees() {
  const std::vector<data::Tree>& trees = loader_->trees();
  std::vector<int64_t> deep;
  for (int64_t i = 0; i < (int64_t)trees.size(); ++i)
    if (trees[i].max_depth() > cfg_.segments.length) deep.push_back(i);
  if (deep.empty()) return {-1, nullptr};
  std::vector<SegmentedTree> out(deep.size());
  const double t0 = now_s();
  const auto [bad, error] = parallel_for_first_error(
      (int64_t)deep.size(), [&](int64_t k) { out[k] = segment_figures(segment_plans(deep[k])); });
  if (error) return {deep[bad], error};
  int64_t pieces = 0;
  for (size_t k = 0; k < deep.size(); ++k) {
    pieces += out[k].pieces;
    segmented_.emplace(deep[k], std::move(out[k]));
  }
  spdlog::info("segments: {} trees planned into {} segment pieces in {:.1f} s ({} threads)", deep.size(), pieces,
               now_s() - t0, std::min<int64_t>((int64_t)deep.size(), host_threads()));
  return {-1, nullptr};
}

Trainer::PartitionedTree Trainer::partition_plan(int64_t index) const {
  const int64_t capacity = cfg_.partition.capacity_tokens;
  const data::Tree& tree = loader_->trees()[index];
  PartitionedTree p;
  try {
    p.split = data::split_long_nodes(tree, capacity);
    p.plan = data::plan_partition(p.split, capacity);
  } catch (const Error& e) {
    throw Error(str(cfg_.where("partition.capacity_tokens"), ": data.path ", cfg_.data.path, ": ", e.what()));
  }
  size_t deepest = 0;
  int deepest_piece = 0;
  for (int k = 0; k < p.plan.num_pieces(); ++k)
    if (p.plan.pieces[k].gateway.size() > deepest) {
      deepest = p.plan.pieces[k].gateway.size();
      deepest_piece = k;
    }
  if ((int64_t)deepest > backend_->max_external_kv())
    throw Error(str(cfg_.where("partition.capacity_tokens"), ": data.path ", cfg_.data.path, ": tree '", tree.id,
                    "' cut at partition.capacity_tokens ", capacity, " gives piece ", deepest_piece, " a gateway of ",
                    deepest, " ancestor ranges; the ", backend_->name(), " attention reads at most ",
                    backend_->max_external_kv(), " (a larger capacity makes the chain of pieces shorter)"));
  return p;
}

Trainer::PartitionedTree Trainer::partitioned(int64_t index) const {
  const data::Tree& tree = loader_->trees()[index];
  PartitionedTree p = partition_plan(index);
  // Each piece runs the tower on the frames its slots show: a frame shown in several, in each.
  p.repeated.frames = data::tower_runs(p.split, p.plan) - tree.frames_shown();
  if (cfg_.partition.recompute) {
    for (int k = 0; k < p.plan.num_pieces(); ++k) {
      if (!model::keeps_rows_only(p.plan, k, true)) continue;
      model::Work w = model::Work::of(data::pack_piece(p.split, p.plan, k));
      w.head_rows = 0;  // the first forward stops before the LM head
      p.recompute += w;
    }
  }
  return p;
}

const Trainer::PartitionFigures& Trainer::partition_figures(int64_t index, PartitionedTree* plan) {
  auto it = partition_figures_.find(index);
  if (it != partition_figures_.end()) {
    if (plan) *plan = partition_plan(index);
    return it->second;
  }
  PartitionedTree p = partitioned(index);
  spdlog::info("{}", partition_summary(p));
  const PartitionFigures& f = partition_figures_.emplace(index, figures_of(p)).first->second;
  if (plan) *plan = std::move(p);
  return f;
}

Trainer::PartitionFigures Trainer::figures_of(const PartitionedTree& p) {
  PartitionFigures f;
  f.recompute = p.recompute;
  f.repeated = p.repeated;
  f.max_piece_tokens = p.plan.max_piece_tokens;
  f.peak_tokens = p.plan.peak_tokens;
  f.kept_peak_tokens = p.plan.kept_peak_tokens;
  return f;
}

std::string Trainer::partition_summary(const PartitionedTree& p) const {
  const int64_t capacity = cfg_.partition.capacity_tokens;
  int64_t with_gateways = 0;
  for (const data::Piece& piece : p.plan.pieces) with_gateways += piece.tokens;
  if (cfg_.partition.recompute)
    return str("partition: tree '", p.split.id, "' (", p.split.n_tree(), " tokens) -> ", p.plan.num_pieces(),
               " pieces of <= ", capacity, " tokens, activations of at most ", p.plan.max_piece_tokens,
               " tokens resident at once and K/V rows of up to ", p.plan.kept_peak_tokens,
               " tokens kept along a chain (partition.recompute: ", p.plan.recompute_tokens,
               " tokens' forward run twice); ", with_gateways, " tokens computed through gateways vs ",
               p.plan.naive_tokens, " naive (re-running ancestors)");
  return str("partition: tree '", p.split.id, "' (", p.split.n_tree(), " tokens) -> ", p.plan.num_pieces(),
             " pieces of <= ", capacity, " tokens, peak ", p.plan.peak_tokens, " tokens resident; ", with_gateways,
             " tokens computed through gateways vs ", p.plan.naive_tokens, " naive (re-running ancestors)");
}

const std::string& Trainer::data_digest() {
  if (data_sha256_.empty()) {
    const double t0 = now_s();
    data_sha256_ = file_sha256(cfg_.data.path);
    if (now_s() - t0 > 1.0)
      spdlog::info("data: sha256 of {} ({} bytes) in {:.1f}s", cfg_.data.path, data_size_, now_s() - t0);
  }
  return data_sha256_;
}

StepMetrics Trainer::train_step() {
  const double t0 = now_s();
  const int64_t n_micro = cfg_.train.grad_accum;
  std::vector<data::PackedBatch> micro;
  std::vector<MicroRun> runs;  // (micro.size()) how each runs
  StepMetrics m;
  m.step = step_ + 1;
  m.world_size = world_size();
  if (comm_) {
    take_shard(&micro, &runs, &m);
  } else {
    micro.reserve(n_micro);
    for (int64_t i = 0; i < n_micro; ++i) append_micro(loader_->next_indices(), &micro, &runs);
  }

  double normaliser = 0, flat_targets = 0;
  model::Work work;
  for (size_t i = 0; i < micro.size(); ++i) {
    const data::PackedBatch& b = micro[i];
    normaliser += cfg_.train.loss_norm == "token_mean" ? (double)b.n_flat_targets : (double)b.n_paths;
    flat_targets += (double)b.n_flat_targets;
    work += runs[i].segments ? segmented(runs[i].tree).work : model::Work::of(b);
    m.n_tree += b.n_tree;
    m.n_flat += b.n_flat;
    m.paths += b.n_paths;
  }
  if (comm_) {  // the step's totals over every rank (integers: exact in fp64)
    double totals[5] = {normaliser, (double)m.n_tree, (double)m.n_flat, (double)m.paths, flat_targets};
    comm_->all_reduce_host(totals, 5);
    normaliser = totals[0];
    m.n_tree = (int64_t)totals[1];
    m.n_flat = (int64_t)totals[2];
    m.paths = (int64_t)totals[3];
    flat_targets = totals[4];
  }
  if (!(normaliser > 0) && cfg_.train.loss_norm == "token_mean" && m.paths > 0) {
    // Only trees without a target (the data check warned of them): the mean over no targets is
    // taken as 0, a zero gradient, as path_mean's such trees add (AdamW's momentum and weight
    // decay still apply, whichever the normaliser).
    spdlog::warn("step {}: the step's {} paths have no target (train.loss_norm: token_mean): its loss and gradient "
                 "are 0",
                 m.step, m.paths);
    normaliser = 1;
  }
  if (!(normaliser > 0))
    throw Error(str("step ", m.step, ": the step's batches have no ", cfg_.train.loss_norm == "token_mean" ? "targets" : "paths",
                    " (train.loss_norm: ", cfg_.train.loss_norm, ")"));

  backend_->zero_grad();
  if (comm_) buckets_->begin(backend_->grads_data(), *comm_);
  model::Work recomputed;  // partition.recompute's second forwards
  model::Work repeated;    // towers of frames run again in another piece
  // Each call's loss in micro-batch order (an enqueued one's once read: one wait a step), summed
  // in that order after the loop.
  std::vector<double> losses;
  std::vector<size_t> enqueued;
  for (size_t i = 0; i < micro.size(); ++i) {
    if (runs[i].tree < 0) {
      try {
        enqueued.push_back(losses.size());
        losses.push_back(0);
        if (comm_ && i + 1 == micro.size()) {
          // The step's last backward: each parameter's gradient is final once reported, and its
          // bucket's all-reduce starts while backward goes on (buckets.h).
          backend_->enqueue_forward_backward(micro[i], 1.0 / normaliser, [&](int begin, int end) {
            for (int p = begin; p < end; ++p) buckets_->mark_ready(p);
          });
        } else {
          backend_->enqueue_forward_backward(micro[i], 1.0 / normaliser, nullptr);
        }
      } catch (const OutOfMemoryError& e) {  // on a micro-batch: say which, and what sizes it
        throw OutOfMemoryError(str("step ", m.step, ": micro-batch ", i + 1, " of ", micro.size(), " (",
                                   micro[i].n_tokens, " packed tokens): ", e.what(),
                                   "; a smaller data.max_tokens_per_batch (", cfg_.data.max_tokens_per_batch,
                                   " now) makes smaller micro-batches (a tree larger than it then needs "
                                   "partition.capacity_tokens, or per_path packing to spread its paths)"));
      }
    } else if (runs[i].segments) {
      for (const data::SegmentPlan& plan : segment_plans(runs[i].tree)) {
        losses.push_back(backend_->forward_backward_segmented(plan, cfg_.segments, 1.0 / normaliser,
                                                              [this](data::PackedBatch& b) { load_frames(b); }));
        m.pieces += plan.pieces.num_pieces();
      }
    } else {
      PartitionedTree p;  // planned again (plans are not kept), once
      const PartitionFigures& f = partition_figures(runs[i].tree, &p);
      try {
        losses.push_back(backend_->forward_backward_partitioned(p.split, p.plan, 1.0 / normaliser,
                                                                cfg_.partition.recompute,
                                                                [this](data::PackedBatch& b) { load_frames(b); }));
      } catch (const OutOfMemoryError& e) {  // on a chain of resident pieces: say what helps
        // Only where recompute would hold fewer activations: a chain longer than one piece.
        if (cfg_.partition.recompute || p.plan.peak_tokens <= p.plan.max_piece_tokens) throw;
        throw OutOfMemoryError(str("step ", m.step, ": tree '", p.split.id, "' (", p.split.n_tree(),
                                   " tokens in ", p.plan.num_pieces(), " pieces) holds the activations of up to ",
                                   p.plan.peak_tokens, " tokens at once (a chain of pieces stays resident until its "
                                   "backward): ", e.what(), "; set partition.recompute: true to keep those of one "
                                   "piece (at most ", p.plan.max_piece_tokens, " tokens) at a time (the others keep "
                                   "their K/V rows and run their forward again)"));
      }
      m.pieces += p.plan.num_pieces();
      recomputed += f.recompute;
      repeated += f.repeated;
    }
  }
  const std::vector<double> read = backend_->pending_losses();
  TT_CHECK(read.size() == enqueued.size(), "step ", m.step, ": ", read.size(), " losses read for ", enqueued.size(),
           " enqueued micro-batches");
  for (size_t k = 0; k < read.size(); ++k) losses[enqueued[k]] = read[k];
  for (double x : losses) m.loss += x;
  const double t_backward = now_s();
  double nll_sum = backend_->nll_sum();
  const Backend::GemmTuneTotals tune_now = backend_->gemm_tune_totals();
  m.gemm_tune_s = tune_now.tune_s - tune_seen_.tune_s;
  const std::vector<cuda::GemmTuned> pending = backend_->take_gemm_pending();  // winners of this step's new buckets
  double pending_anywhere = (double)pending.size();
  if (comm_) {  // gradients before the norm, clipping and AdamW: every rank takes the same update
    buckets_->finish();  // the buckets not yet started; the compute stream waits for all
    double totals[4] = {m.loss, (double)m.pieces, nll_sum, pending_anywhere};
    comm_->all_reduce_host(totals, 4);
    m.loss = totals[0];
    m.pieces = (int64_t)totals[1];
    nll_sum = totals[2];
    pending_anywhere = totals[3];
  }
  share_gemm_tuning(m.step, pending, (int64_t)pending_anywhere);  // every rank or none (the count is reduced)
  tune_seen_ = backend_->gemm_tune_totals();
  m.nll = flat_targets > 0 ? nll_sum / flat_targets : 0.0;
  m.grad_norm = std::sqrt(backend_->grad_sum_squares());
  m.reduce_s = now_s() - t_backward;
  m.device_peak_gib = (double)backend_->take_device_peak_bytes() / (1024.0 * 1024.0 * 1024.0);
  m.lr = lr_at(cfg_, m.step);
  if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
    const std::string bad = backend_->first_nonfinite(false, true, false);
    // The first step of a fresh model: its initial weights are the likely cause when drawn wide.
    const bool wide_init = step_ == 0 && cfg_.init_from.empty() && cfg_.model.initializer_range > 1;
    const std::string what = str("step ", m.step, ": loss ", m.loss, ", grad norm ", m.grad_norm, " is not finite",
                                 bad.empty() ? "" : str(" (first non-finite gradient: ", bad, ")"),
                                 wide_init ? str(" [initial weights drawn with model.initializer_range ",
                                                 cfg_.model.initializer_range, " (", cfg_.where("model.initializer_range"),
                                                 "); Hugging Face models use 0.02]")
                                           : "");
    if (cfg_.train.on_nonfinite == "skip_step" && consecutive_skips_ < cfg_.train.max_skipped_steps) {
      ++consecutive_skips_;
      ++skipped_steps_;
      spdlog::warn("{}: skipped, no update (train.on_nonfinite: skip_step; {} in a row, at most {})", what,
                   consecutive_skips_, cfg_.train.max_skipped_steps);
      step_ = m.step;
      m.skipped = true;
      m.skipped_steps = skipped_steps_;
      finish_metrics(m, t0, work, recomputed, repeated);
      return m;
    }
    throw NonFiniteError(str(what, cfg_.train.on_nonfinite == "skip_step"
                                       ? str("; more than train.max_skipped_steps (", cfg_.train.max_skipped_steps,
                                             ") in a row")
                                       : " (train.on_nonfinite: stop; skip_step skips such steps)"));
  }

  OptimStep p;
  p.lr = m.lr;
  p.beta1 = cfg_.optim.beta1;
  p.beta2 = cfg_.optim.beta2;
  p.eps = cfg_.optim.eps;
  p.weight_decay = cfg_.optim.weight_decay;
  p.step = m.step;
  if (cfg_.train.grad_clip > 0) p.grad_scale = std::min(1.0, cfg_.train.grad_clip / (m.grad_norm + 1e-6));
  if (!backend_->adamw_step(p)) {
    const std::string bad = backend_->first_nonfinite(true, false, true);
    throw NonFiniteError(str("step ", m.step, ": the update (lr ", p.lr, ") left ",
                             bad.empty() ? std::string("a value") : bad,
                             " non-finite; nothing of this step is written (",
                             last_saved_step_ < 0 ? std::string("no checkpoint has been written yet")
                                                  : str("the newest checkpoint is step ", last_saved_step_),
                             ")"));
  }
  step_ = m.step;
  consecutive_skips_ = 0;
  m.skipped_steps = skipped_steps_;
  finish_metrics(m, t0, work, recomputed, repeated);
  return m;
}

void Trainer::finish_metrics(StepMetrics& m, double t0, const model::Work& work,
                             const model::Work& forward_only, const model::Work& repeated) const {
  const double t1 = now_s();
  m.step_s = t1 - t0;
  m.tokens_per_s = t1 > t0 ? (double)m.n_tree / (t1 - t0) : 0.0;
  const model::Flops flops = arch_.flops(work, model::Pass::kTrain);
  m.executed_flops = flops.executed + arch_.flops(forward_only, model::Pass::kForward).executed +
                     arch_.flops(repeated, model::Pass::kTrain).executed;
  if (t1 > t0) {
    m.model_tflops = flops.model / (t1 - t0) / 1e12;
    m.mfu = flops.model / (kPeakFlops * (t1 - t0));
  }
  m.por = m.n_flat > 0 ? 1.0 - (double)m.n_tree / (double)m.n_flat : 0.0;
  m.elapsed_s = t1 - t_start_;
}

void Trainer::load_frames(data::PackedBatch& b) const {
  if (b.frames.empty()) return;
  data::FrameSpec spec;
  spec.image_size = (int)cfg_.model.vision.image_size;  // SigLIP's processor: mean = std = 0.5
  data::load_frames(b, spec);
}

std::string Trainer::save_checkpoint() {
  if (rank() != 0) {
    last_saved_step_ = step_;
    return "";
  }
  TrainerState st;
  st.step = step_;
  st.loader = loader_->state();
  st.seed = cfg_.train.seed;
  st.data_path = cfg_.data.path;
  st.data_size = data_size_;
  st.data_sha256 = data_digest();
  st.cameras = cameras_;
  st.skipped_steps = skipped_steps_;
  st.consecutive_skips = consecutive_skips_;
  // Never a non-finite checkpoint (the update checks each step; this is the last line of defence).
  if (const std::string bad = backend_->first_nonfinite(true, false, true); !bad.empty())
    throw NonFiniteError(str("step ", step_, ": ", bad, " is not finite; the checkpoint is not written"));
  const std::string dir = trainer::save_checkpoint(
      cfg_.run_dir, cfg_, *backend_, st, backend_->gemm_tuning_signature().empty() ? "" : gemm_tuning_file_text(step_),
      action_bins_json_);
  last_saved_step_ = step_;
  spdlog::info("checkpoint {}", dir);
  prune_checkpoints(cfg_.run_dir, cfg_.train.keep_checkpoints);
  return dir;
}

std::vector<StepMetrics> Trainer::run() {
  const int64_t total = cfg_.train.max_steps;
  std::vector<StepMetrics> out;
  const bool writer = rank() == 0;  // data parallelism: rank 0 writes metrics and checkpoints
  const std::string mpath = metrics_path(cfg_);
  std::ofstream metrics;
  if (writer) {
    fs::create_directories(cfg_.run_dir);
    rewrite_metrics(mpath, start_step_);  // atomic: a resumed run drops what follows its checkpoint
    metrics.open(mpath, std::ios::app);
    if (!metrics) throw Error(str(mpath, ": cannot open for writing"));
  }

  if (step_ >= total) {
    spdlog::info("already at step {} of train.max_steps {}: nothing to do", step_, total);
    return out;
  }
  if (const std::string k = cfg_.segments.ignored_key(); !k.empty() && writer)
    spdlog::warn("{}: {} is set, but segments.length is 0 (segments off), so it is ignored", cfg_.where(k), k);
  if (cfg_.data.format != "episodes" && cfg_.data.action_bins != DataConfig{}.action_bins && writer)
    spdlog::warn("{}: data.action_bins is set, but data.format is '{}' (only episodes' continuous actions are "
                 "binned), so it is ignored",
                 cfg_.where("data.action_bins"), cfg_.data.format);
  spdlog::info("training steps {}..{} (grad_accum {}, {} tokens per micro-batch, {} packing, {})", step_ + 1, total,
               cfg_.train.grad_accum, cfg_.data.max_tokens_per_batch, cfg_.data.packing, cfg_.train.loss_norm);
  if (writer && !cfg_.train.final_checkpoint) {
    // Periodic checkpoints land at multiples of checkpoint_every before the last step.
    const int64_t every = cfg_.train.checkpoint_every;
    if (every == 0 || (step_ / every + 1) * every >= total)
      spdlog::warn("this run writes no checkpoint: train.final_checkpoint is false and train.checkpoint_every {} "
                   "{} (steps {}..{})",
                   every, every == 0 ? "means only at the end" : "has no multiple before the last step", step_ + 1,
                   total);
  }
  std::unique_ptr<EventWriter> tb;  // rank 0: TensorBoard events in run_dir/tb
  if (writer) {
    tb = std::make_unique<EventWriter>((fs::path(cfg_.run_dir) / "tb").string(), step_ + 1);
    spdlog::info("tensorboard: {} (tensorboard --logdir {})", tb->path(), (fs::path(cfg_.run_dir) / "tb").string());
  }
  int64_t metrics_failed = -1;  // the first step whose metrics line could not be written
  const int width = (int)std::to_string(total).size();
  const bool show_mfu = backend_->name() != "cpu";  // MFU against a GPU's peak means nothing on the CPU
  int64_t window_step = step_;               // the console's steps/s: over the steps since its last line
  double window_start = now_s() - t_start_;
  while (step_ < total) {
    const StepMetrics m = train_step();
    out.push_back(m);
    if (tb) tb->write_scalars(m.step, tensorboard_scalars(m));
    nlohmann::json j = {{"step", m.step},         {"loss", m.loss},       {"nll", m.nll},    {"lr", m.lr},
                              {"grad_norm", m.grad_norm}, {"tokens_per_s", m.tokens_per_s},
                              {"n_tree", m.n_tree},     {"n_flat", m.n_flat},   {"por", m.por},
                              {"paths", m.paths},       {"pieces", m.pieces},   {"elapsed_s", m.elapsed_s},
                              {"step_s", m.step_s},     {"model_tflops", m.model_tflops}, {"mfu", m.mfu}};
    j["executed_flops"] = m.executed_flops;
    j["gemm_tune_s"] = m.gemm_tune_s;
    j["skipped"] = m.skipped;              // this step's update was skipped (train.on_nonfinite: skip_step)
    j["skipped_steps"] = m.skipped_steps;  // skipped updates so far in the run
    j["reduce_s"] = m.reduce_s;
    if (m.device_peak_gib > 0) j["device_peak_gib"] = m.device_peak_gib;
    if (comm_) {
      j["world_size"] = m.world_size;
      j["imbalance"] = m.imbalance;
    }
    if (writer && metrics_failed < 0) {
      metrics << j.dump() << "\n";
      metrics.flush();
      if (m.step == testing::metrics_write_fails_at) metrics.setstate(std::ios::badbit);
      if (!metrics) {  // a full disk, a quota: say so now; training goes on to its checkpoints
        metrics_failed = m.step;
        metrics.close();
        spdlog::error("{}: write failed at step {} (a full disk?): no metrics are written from this step on (the "
                      "last line may be cut short); training goes on, and the run ends with this error after its "
                      "last checkpoint",
                      mpath, m.step);
      }
    }
    if (m.step % cfg_.train.log_every == 0 || m.step == start_step_ + 1 || m.step == total) {
      const double window_s = m.elapsed_s - window_start;
      const double steps_per_s = window_s > 0 ? (double)(m.step - window_step) / window_s : 0.0;
      window_step = m.step;
      window_start = m.elapsed_s;
      spdlog::info("step {:>{}}/{} | loss {:.4f} | nll {:.4f} | lr {:.2e} | gnorm {:.3f} | {} tok/s | {:.3g} steps/s | eta {}{} | "
                   "por {:.2f}{} | {:.1f}s",
                   m.step, width, total, m.loss, m.nll, m.lr, m.grad_norm, human_rate(m.tokens_per_s), steps_per_s,
                   steps_per_s > 0 ? human_duration((double)(total - m.step) / steps_per_s) : "?",
                   show_mfu ? fmt::format(" | mfu {:.1f}%", 100 * m.mfu) : "", m.por,
                   cfg_.partition.capacity_tokens > 0 ? " | pieces " + std::to_string(m.pieces) : "", m.elapsed_s);
    }
    if (cfg_.train.checkpoint_every > 0 && m.step % cfg_.train.checkpoint_every == 0 && m.step < total)
      save_checkpoint();
  }
  if (last_saved_step_ != step_ && cfg_.train.final_checkpoint) save_checkpoint();
  if (metrics_failed >= 0)
    throw Error(str(mpath, ": write failed at step ", metrics_failed, ": the metrics of steps ", metrics_failed, "..",
                    step_, " are missing",
                    last_saved_step_ >= 0 ? str(" (the checkpoint of step ", last_saved_step_, " is written)")
                                          : std::string(" (no checkpoint was written: train.final_checkpoint is false)")));
  if (!out.empty())
    spdlog::info("done: {} steps in {:.1f}s, loss {:.4f} -> {:.4f}", out.size(), out.back().elapsed_s,
                 out.front().loss, out.back().loss);
  return out;
}

}  // namespace tt::trainer
