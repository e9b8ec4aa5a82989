// Training-step benchmark of a Robostral-shaped VLA on the "cuda" backend (issue 16): a
// SigLIP-base-shaped tower (12 layers, width 768, 12 heads, MLP 3072, patch 16, 224 px: 196 tokens
// a frame, gelu_pytorch_tanh) and the LLaVA projector into the Qwen3-1.7B-shaped decoder
// (bench/qwen3_shapes.h), on generated navigation episodes of 40 steps: a 16-token instruction,
// one camera frame per step, one discrete action token per step (the R2R-CE action space on the
// last 4 vocabulary ids). Frames are random in-memory pixels (FrameRef::pixels; the decoder and
// tower cost does not depend on the values).
//
// Per history (full, and {window: W}), each episode is its episode tree (data/episode_tree.h).
// Tree packing: the episodes of one step in one micro-batch, each frame through the tower once.
// Per-timestep packing (the baseline a user training per-step samples runs): every step's whole
// context its own sequence (per_path packing: the tower runs for every occurrence of a frame),
// packed into micro-batches of at most --budget tokens. A step is the trainer's (bench/step_timing.h):
// zero_grad, forward_backward per micro-batch, the gradient norm, AdamW with lr 0.
//
// Output (stdout, one JSON object): per history the training tokens per-timestep vs tree (the
// seed's 22x figure is the reference), frames through the tower per packing and frame reuse
// (slots / unique frames), step times, MFU and executed FLOPs, speedup against the executed-FLOP
// ratio; then a profiled forward_backward of one tree batch: the vision stage's share of GPU time
// (CudaProfile::vision_ms) beside the decoder's op classes.
//
// Flags: --episodes N (episodes per tree step, 2), --steps N (40), --window W (4), --budget T
// (per-timestep micro-batch tokens, 16384), --layers L (decoder layers, 28), --tree-steps N (5),
// --pp-steps N (2), --warmup N (1), --no-profile, --dry-run (no GPU: sizes and FLOPs only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "bench/qwen3_shapes.h"
#include "bench/step_timing.h"
#include "data/episode_tree.h"
#include "data/episodes.h"
#include "data/frames.h"
#include "data/packing.h"
#include "data/tree.h"
#include "model/config.h"
#include "model/decoder.h"
#include "trainer/backend.h"
#include "trainer/train.h"

namespace {

using tt::Error;
using tt::str;
namespace data = tt::data;
namespace bench = tt::bench;

struct Shape {
  int episodes = 2, steps = 40, window = 4, instruction = 16, layers = 28;
  int64_t budget = 16384;
};

tt::model::ModelConfig robostral_shape(int layers) {
  tt::model::ModelConfig c = bench::qwen3_1_7b(layers);
  tt::model::VisionConfig& v = c.vision;
  v.hidden_size = 768;
  v.intermediate_size = 3072;
  v.num_hidden_layers = 12;
  v.num_attention_heads = 12;
  v.image_size = 224;
  v.patch_size = 16;
  v.hidden_act = "gelu_pytorch_tanh";
  v.layer_norm_eps = 1e-6;
  v.projector_hidden_act = "gelu";
  v.image_token_index = 0;
  return c;
}

// Episode e: instruction tokens, `steps` steps of one frame and one discrete action each.
data::Episode make_episode(const Shape& s, int e, int64_t vocab, std::mt19937_64& rng) {
  data::Episode ep;
  ep.id = str("nav", e);
  std::uniform_int_distribution<int32_t> tok(2, (int32_t)vocab - 5), act((int32_t)vocab - 4, (int32_t)vocab - 1);
  for (int i = 0; i < s.instruction; ++i) ep.instruction.push_back(tok(rng));
  for (int t = 0; t < s.steps; ++t) {
    data::EpisodeStep st;
    st.images = {str("episode", e, "/frame", t, ".png")};
    st.action_ids = {act(rng)};
    ep.steps.push_back(std::move(st));
  }
  return ep;
}

// In-memory pixels for every frame of a tree (one shared buffer: the values do not matter).
void attach_pixels(data::Tree& t, const std::shared_ptr<const std::vector<float>>& px) {
  for (data::FrameRef& f : t.media.frames) f.pixels = px;
}

// Every step's context as its own sequence (per_path), in micro-batches of at most `budget`.
std::vector<data::PackedBatch> per_timestep_batches(const std::vector<data::Tree>& trees, int64_t budget) {
  std::vector<data::PackedBatch> out;
  for (const data::Tree& t : trees)
    for (const auto& [first, end] : data::path_ranges(t, budget)) out.push_back(data::pack_path_range(t, first, end));
  return out;
}

// The batches' pixels as the trainer loads them (data::load_frames: in-memory frames here).
void fill_pixels(std::vector<data::PackedBatch>& batches, int S) {
  data::FrameSpec spec;
  spec.image_size = S;
  for (data::PackedBatch& b : batches) data::load_frames(b, spec);
}

struct Sizes {
  int64_t tokens = 0, frames = 0, slots = 0, targets = 0;
};
Sizes sizes(const std::vector<data::PackedBatch>& batches) {
  Sizes z;
  for (const data::PackedBatch& b : batches) {
    z.tokens += b.n_tokens;
    z.frames += (int64_t)b.frames.size();
    z.slots += (int64_t)b.slot_row.size();
    z.targets += (int64_t)b.tgt_src.size();
  }
  return z;
}

// The profiled step of `b` (step_timing.h profiled_step) as JSON: GPU time per op class.
nlohmann::json breakdown(tt::model::CudaModel& m, const data::PackedBatch& b, double loss_scale) {
  const tt::model::CudaProfile p = bench::profiled_step(m, b, loss_scale);
  return {{"tokens", b.n_tokens},         {"frames", b.frames.size()},  {"total_ms", p.total_ms()},
          {"vision_ms", p.vision_ms},     {"vision_share", p.vision_ms / p.total_ms()},
          {"gemm_ms", p.gemm_ms},         {"attention_ms", p.attention_ms},
          {"head_ms", p.head_ms},         {"norm_rope_swiglu_ms", p.norm_ms},
          {"other_ms", p.other_ms}};
}

int run(int argc, char** argv) {
  Shape s;
  int tree_steps = 5, pp_steps = 2, warmup = 1;
  bool dry_run = false, profile = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) throw Error(str(a, ": missing value"));
      return std::stoll(argv[++i]);
    };
    if (a == "--episodes") s.episodes = (int)next();
    else if (a == "--steps") s.steps = (int)next();
    else if (a == "--window") s.window = (int)next();
    else if (a == "--budget") s.budget = next();
    else if (a == "--layers") s.layers = (int)next();
    else if (a == "--tree-steps") tree_steps = (int)next();
    else if (a == "--pp-steps") pp_steps = (int)next();
    else if (a == "--warmup") warmup = (int)next();
    else if (a == "--no-profile") profile = false;
    else if (a == "--dry-run") dry_run = true;
    else throw Error(str("unknown flag ", a, " (see bench/vla_bench.cc)"));
  }
  TT_CHECK(s.episodes >= 1 && s.steps >= 1 && s.window >= 1 && s.budget >= 1, "vla_bench: bad shape flags");
  const tt::model::ModelConfig cfg = robostral_shape(s.layers);
  const tt::model::Architecture arch(cfg);
  const int S = (int)cfg.vision.image_size, P = (int)cfg.vision.tokens_per_frame();
  std::mt19937_64 rng(16);
  auto px = std::make_shared<std::vector<float>>((size_t)3 * S * S);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : *px) v = nd(rng);

  std::unique_ptr<tt::trainer::Backend> be;
  nlohmann::json out = {{"shape",
                         {{"episodes_per_step", s.episodes}, {"steps_per_episode", s.steps},
                          {"instruction_tokens", s.instruction}, {"tokens_per_frame", P}, {"image_size", S},
                          {"tower", {{"layers", cfg.vision.num_hidden_layers}, {"hidden", cfg.vision.hidden_size},
                                     {"heads", cfg.vision.num_attention_heads},
                                     {"intermediate", cfg.vision.intermediate_size}}},
                          {"decoder_layers", cfg.num_hidden_layers}, {"per_timestep_budget", s.budget}}},
                        {"peak_flops", tt::trainer::kPeakFlops}};
  if (!dry_run) {
    tt::model::CudaExecOptions cuda_options;
    cuda_options.gemm_autotune = true;
    be = tt::trainer::make_backend("cuda", cfg, 0, 1, cuda_options);
    be->init(1);
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    out["device"] = prop.name;
    out["parameters"] = be->num_params();
  }
  int64_t step_no = 0;
  data::PackedBatch profiled;
  double profiled_scale = 1;
  for (const int window : {0, s.window}) {
    const std::string name = window == 0 ? "full" : str("window", window);
    data::EpisodeTreeSpec spec;
    spec.tokens_per_frame = P;
    spec.window = window;
    // A window history branches (contexts stop being prefixes): one episode per step keeps the
    // tree batch near the full-history one's size.
    const int n_ep = window == 0 ? s.episodes : 1;
    std::vector<data::Tree> trees;
    for (int e = 0; e < n_ep; ++e) {
      trees.push_back(data::episode_tree(make_episode(s, e, cfg.vocab_size, rng), e, nullptr, spec));
      attach_pixels(trees.back(), px);
    }
    std::vector<const data::Tree*> ptrs;
    int64_t n_tree = 0, n_flat = 0, n_paths = 0;
    for (const data::Tree& t : trees) {
      ptrs.push_back(&t);
      n_tree += t.n_tree();
      n_flat += t.n_flat();
      n_paths += t.n_paths();
    }
    std::vector<data::PackedBatch> tree = {data::pack(ptrs, data::Packing::kTree)};
    std::vector<data::PackedBatch> pp = per_timestep_batches(trees, s.budget);
    const Sizes zt = sizes(tree), zp = sizes(pp);
    nlohmann::json j = {{"window", window},
                        {"episodes", n_ep},
                        {"samples", n_paths},
                        {"tokens_tree", n_tree},
                        {"tokens_per_timestep", n_flat},
                        {"token_ratio", (double)n_flat / (double)n_tree},
                        {"tower_frames_tree", zt.frames},
                        {"tower_frames_per_timestep", zp.frames},
                        {"frame_slots_tree", zt.slots},
                        {"frame_reuse_tree", (double)zt.slots / (double)zt.frames},
                        {"per_timestep_micro_batches", pp.size()}};
    const double scale = 1.0 / (double)n_paths;
    const tt::model::Flops ft = bench::step_flops(arch, tree), fp = bench::step_flops(arch, pp);
    j["model_flop_ratio"] = fp.model / ft.model;
    j["executed_flop_ratio"] = fp.executed / ft.executed;
    std::fprintf(stderr, "%s: %lld tree tokens, %lld per-timestep tokens (%.1fx), frames %lld vs %lld, %zu micro-batches\n",
                 name.c_str(), (long long)n_tree, (long long)n_flat, (double)n_flat / n_tree, (long long)zt.frames,
                 (long long)zp.frames, pp.size());
    if (!dry_run) {
      fill_pixels(tree, S);
      fill_pixels(pp, S);
      const bench::Run rt = bench::time_steps(*be, tree, scale, warmup, tree_steps, &step_no);
      const bench::Run rp = bench::time_steps(*be, pp, scale, warmup > 0 ? 1 : 0, pp_steps, &step_no);
      double f_tree = 0, t_tree = 0, f_pp = 0, t_pp = 0;
      j["tree"] = bench::report(arch, tree, rt, n_tree, &f_tree, &t_tree);
      j["per_timestep"] = bench::report(arch, pp, rp, n_tree, &f_pp, &t_pp);
      const double speedup = t_pp / t_tree;
      j["speedup"] = speedup;
      j["speedup_over_executed_flop_ratio"] = speedup / (fp.executed / ft.executed);
      j["loss_rel_diff"] = std::abs(rt.loss - rp.loss) / std::abs(rt.loss);
      if (window == 0) {
        profiled = tree[0];
        profiled_scale = scale;
      }
    }
    out["histories"][name] = j;
  }
  if (!dry_run) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    out["device_memory_used_gib"] = (double)(total_b - free_b) / (1 << 30);
    be.reset();
    if (profile) {
      tt::model::CudaExecOptions o;
      o.profile = true;
      tt::model::CudaModel m(cfg, tt::model::DecoderOptions{}, o);
      m.init(1);
      out["breakdown_full_tree"] = breakdown(m, profiled, profiled_scale);
    }
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vla_bench: error: %s\n", e.what());
    return 1;
  }
}
