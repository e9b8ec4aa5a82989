// Training-step benchmark of the "cuda" backend on a Qwen3-1.7B-shaped model (hidden 2048, 28
// layers, 16 heads, 8 KV heads, head dim 128, intermediate 6144, vocab 151936, tied head) on
// one GPU, about 16k unique tokens per step, for two generated workloads (data/synthetic.h):
//   agent: an agent-rollout tree {rollouts, prompt_len 4096, turns 6, turn_len 160, branches 4,
//          branch_turns 2}: the public rollout shape (4096-token prompt, 6 turns, 4 x 4
//          branches) with turns shortened to 160 tokens so the tree holds 17536 tokens;
//   nav:   a navigation-episode comb {comb, prefix_len 512, steps 40, history_len 128,
//          leaf_len 256}: 15872 tokens.
// Each in tree packing (one micro-batch: the tree) and per-path packing (every path its own
// causal sequence, the same trees, packed greedily into micro-batches of at most the tree's token
// count, the step running one forward_backward per micro-batch). A step is the trainer's:
// zero_grad, forward_backward per micro-batch, the gradient norm, AdamW (clip 1.0) with lr 0, so
// the weights stay put (the update costs the same) and the tree and per-path losses of the same
// weights can be compared. Step times are wall-clock medians after warm-up (every backend call
// that ends a step waits for the GPU).
//
// Output: one JSON object (stdout): per run the step time, tokens/s (unique tree tokens per
// second, the trainer's metric), packed tokens/s, model TFLOP/s and MFU (the FLOP API,
// model::Architecture::flops, over the packing's own work, against 989 TFLOP/s), the forward+backward
// and optimizer parts; per workload the per-path/tree step-time ratio (speedup), the per-path/tree
// FLOP ratio and speedup / FLOP ratio (1.0: the tree saves exactly the FLOPs it skips). The LM
// head runs only on rows that predict a target (model/lm_head.h), so the executed FLOPs (the
// same API) are the model FLOPs less 6 V C per row without a target: reported as executed_tflop
// and the ratio speedup / executed FLOP ratio. Then, with the backend released, a profiled CudaModel runs
// one forward_backward of the tree batch and of the first per-path micro-batch: GPU time per op
// class (GEMMs, attention, LM head, norms, other) and the GEMMs', attention's and head's TFLOP/s.
//
// Flags: --steps N (timed tree steps, 5), --warmup N (2), --pp-steps N (timed per-path steps, 3),
// --pp-warmup N (1), --layers L (28; 24 for the hybrid), --model qwen3_1_7b|hybrid_2b (the shapes
// of bench/qwen3_shapes.h), --workloads agent,nav, --no-profile (skip the breakdown),
// --no-gemm-autotune (autotuning is on, as train.gemm_autotune is by default; the warm-up steps do
// the timing), --gdn-products exact|bf16 (train.gdn_products; exact),
// --dry-run (no GPU: the workloads' sizes and FLOPs only).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/qwen3_shapes.h"
#include "bench/step_timing.h"
#include "data/packing.h"
#include "data/reader.h"
#include "data/synthetic.h"
#include "data/tree.h"
#include "model/config.h"
#include "model/decoder.h"
#include "base/check.h"
#include "trainer/backend.h"
#include "trainer/train.h"

namespace {

using tt::Error;
using tt::str;
namespace data = tt::data;

using tt::bench::head_rows;
using tt::bench::median;
using tt::bench::now_s;
using tt::bench::report;
using tt::bench::Run;
using tt::bench::step_flops;
using tt::bench::time_steps;

data::SyntheticSpec workload_spec(const std::string& name, int vocab) {
  data::SyntheticSpec s;
  s.num_trees = 1;
  s.vocab_size = vocab;
  s.seed = 17;
  if (name == "agent") {
    s.kind = "rollouts";
    s.prompt_len = 4096;
    s.turns = 6;
    s.turn_len = 160;
    s.branches = 4;
    s.branch_turns = 2;
  } else if (name == "nav") {
    s.kind = "comb";
    s.prefix_len = 512;
    s.steps = 40;
    s.history_len = 128;
    s.leaf_len = 256;
  } else {
    throw Error(str("--workloads: unknown workload '", name, "', expected agent or nav"));
  }
  return s;
}

// The generated JSONL, read back through the readers.
std::vector<data::Tree> read_workload(const data::SyntheticSpec& spec) {
  std::vector<data::Tree> trees;
  const std::vector<std::string> lines = data::generate_jsonl(spec);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string where = str(spec.kind, ":", i + 1);
    if (spec.kind == "rollouts") {
      for (data::Tree& t : data::parse_rollouts_trees(lines[i], where, spec.vocab_size)) trees.push_back(std::move(t));
    } else {
      trees.push_back(data::parse_tree_line(lines[i], where, spec.vocab_size));
    }
  }
  return trees;
}

// Every path of the trees as its own sequence, packed greedily (in path order) into
// micro-batches of at most `budget` tokens.
std::vector<data::PackedBatch> per_path_batches(const std::vector<data::Tree>& trees, int64_t budget) {
  std::vector<data::Tree> paths;
  for (const data::Tree& t : trees)
    for (int64_t k = 0; k < t.n_paths(); ++k) paths.push_back(data::path_tree(t, k));
  std::vector<data::PackedBatch> out;
  std::vector<const data::Tree*> group;
  int64_t tokens = 0;
  for (const data::Tree& p : paths) {
    if (!group.empty() && tokens + p.n_tree() > budget) {
      out.push_back(data::pack(group, data::Packing::kPerPath));
      group.clear();
      tokens = 0;
    }
    group.push_back(&p);
    tokens += p.n_tree();
  }
  if (!group.empty()) out.push_back(data::pack(group, data::Packing::kPerPath));
  return out;
}

// The profiled step of `b` (step_timing.h profiled_step) as JSON: GPU time per op class and rates.
nlohmann::json breakdown(tt::model::CudaModel& m, const data::PackedBatch& b, double loss_scale) {
  const tt::model::ModelConfig& c = m.config();
  const tt::model::CudaProfile p = tt::bench::profiled_step(m, b, loss_scale);
  if (c.has_linear_attention())  // (the rates below count dense layers; the GDN's delta rule is in
                                 // attention_ms, its row ops in norm_rope_swiglu_ms)
    return {{"tokens", b.n_tokens},        {"head_rows", head_rows({b})}, {"total_ms", p.total_ms()},
            {"gemm_ms", p.gemm_ms},        {"attention_and_delta_rule_ms", p.attention_ms},
            {"head_ms", p.head_ms},        {"norm_rope_swiglu_gdn_rows_ms", p.norm_ms},
            {"other_ms", p.other_ms}};
  const double L = (double)c.num_hidden_layers, C = (double)c.hidden_size, I = (double)c.intermediate_size;
  const double QD = (double)(c.num_attention_heads * c.head_dim), KD = (double)(c.num_key_value_heads * c.head_dim);
  const double layer_params = L * (C * QD + 2 * C * KD + QD * C + 3 * C * I);
  const double gemm = 6.0 * layer_params * b.n_tokens;
  const double attn = 14.0 * (double)c.head_dim * (double)c.num_attention_heads * L * (double)b.visible_pairs;
  const double head = 6.0 * (double)c.vocab_size * C * (double)head_rows({b});
  return {{"tokens", b.n_tokens},
          {"visible_pairs", b.visible_pairs},
          {"head_rows", head_rows({b})},
          {"total_ms", p.total_ms()},
          {"gemm_ms", p.gemm_ms},
          {"attention_ms", p.attention_ms},
          {"head_ms", p.head_ms},
          {"norm_rope_swiglu_ms", p.norm_ms},
          {"other_ms", p.other_ms},
          {"gemm_tflops", gemm / (p.gemm_ms * 1e-3) / 1e12},
          {"attention_tflops_14", attn / (p.attention_ms * 1e-3) / 1e12},
          {"head_tflops", head / (p.head_ms * 1e-3) / 1e12}};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int run(int argc, char** argv) {
  int steps = 5, warmup = 2, pp_steps = 3, pp_warmup = 1, layers = 0;  // 0: the model's own
  std::string workloads = "agent,nav", model = "qwen3_1_7b";
  bool dry_run = false, profile = true, gemm_autotune = true, gdn_bf16 = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(str(a, ": missing value"));
      return argv[++i];
    };
    if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--pp-steps") pp_steps = std::stoi(next());
    else if (a == "--pp-warmup") pp_warmup = std::stoi(next());
    else if (a == "--layers") layers = std::stoi(next());
    else if (a == "--model") model = next();
    else if (a == "--workloads") workloads = next();
    else if (a == "--dry-run") dry_run = true;
    else if (a == "--no-profile") profile = false;
    else if (a == "--gemm-autotune") gemm_autotune = true;
    else if (a == "--no-gemm-autotune") gemm_autotune = false;
    else if (a == "--gdn-products") {
      const std::string m = next();
      if (m != "exact" && m != "bf16") throw Error(str("--gdn-products: expected exact or bf16, got '", m, "'"));
      gdn_bf16 = m == "bf16";
    }
    else throw Error(str("unknown flag ", a, " (see bench/train_bench.cc)"));
  }
  if (model != "qwen3_1_7b" && model != "hybrid_2b")
    throw Error(str("--model: unknown model '", model, "', expected qwen3_1_7b or hybrid_2b"));
  const tt::model::ModelConfig cfg =
      model == "hybrid_2b" ? tt::bench::hybrid_2b(layers > 0 ? layers : 24)
                           : tt::bench::qwen3_1_7b(layers > 0 ? layers : 28);
  const tt::model::Architecture arch(cfg);
  if (dry_run) {
    for (const std::string& w : split(workloads)) {
      const std::vector<data::Tree> trees = read_workload(workload_spec(w, (int)cfg.vocab_size));
      std::vector<const data::Tree*> ptrs;
      int64_t n_tree = 0, longest = 0;
      for (const data::Tree& t : trees) {
        ptrs.push_back(&t);
        n_tree += t.n_tree();
        for (int64_t k = 0; k < t.n_paths(); ++k) longest = std::max<int64_t>(longest, (int64_t)t.path_tokens(k).size());
      }
      const data::PackedBatch tree = data::pack(ptrs, data::Packing::kTree);
      double f_pp = 0;
      int64_t tok_pp = 0, tgt_pp = 0;
      const std::vector<data::PackedBatch> pp = per_path_batches(trees, std::max(n_tree, longest));
      for (const data::PackedBatch& b : pp) {
        tok_pp += b.n_tokens;
        tgt_pp += (int64_t)b.tgt_src.size();
      }
      f_pp = step_flops(arch, pp).model;
      const double f_tree = step_flops(arch, {tree}).model;
      std::printf("%s: tree %d tokens, %zu targets, %lld pairs, %.1f TFLOP; per-path %zu micro-batches, %lld tokens, "
                  "%lld targets, %.1f TFLOP; FLOP ratio %.3f\n",
                  w.c_str(), tree.n_tokens, tree.tgt_src.size(), (long long)tree.visible_pairs, f_tree / 1e12,
                  pp.size(), (long long)tok_pp, (long long)tgt_pp, f_pp / 1e12, f_pp / f_tree);
    }
    return 0;
  }
  tt::model::CudaExecOptions cuda_options;
  cuda_options.gemm_autotune = gemm_autotune;
  cuda_options.gdn_products = gdn_bf16 ? tt::cuda::GdnProducts::kBf16 : tt::cuda::GdnProducts::kExact;
  std::unique_ptr<tt::trainer::Backend> be = tt::trainer::make_backend("cuda", cfg, 0, 1, cuda_options);
  const double t_init = now_s();
  be->init(1);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::fprintf(stderr, "train_bench: %s, %lld parameters, init %.2f s\n", prop.name, (long long)be->num_params(),
               now_s() - t_init);

  nlohmann::json out = {{"device", prop.name},
                        {"model", {{"architecture", cfg.architecture}, {"hidden", cfg.hidden_size},
                                   {"layers", cfg.num_hidden_layers}, {"heads", cfg.num_attention_heads},
                                   {"kv_heads", cfg.num_key_value_heads}, {"head_dim", cfg.head_dim},
                                   {"intermediate", cfg.intermediate_size}, {"vocab", cfg.vocab_size},
                                   {"tied", cfg.tie_word_embeddings}, {"parameters", be->num_params()}}},
                        {"peak_flops", tt::trainer::kPeakFlops},
                        {"linear_attention",
                         cfg.has_linear_attention()
                             ? nlohmann::json{{"layer_types", cfg.layer_types},
                                              {"key_heads", cfg.linear_num_key_heads},
                                              {"value_heads", cfg.linear_num_value_heads},
                                              {"key_head_dim", cfg.linear_key_head_dim},
                                              {"value_head_dim", cfg.linear_value_head_dim},
                                              {"conv_kernel", cfg.linear_conv_kernel_dim},
                                              {"partial_rotary_factor", cfg.partial_rotary_factor}}
                             : nlohmann::json()},
                        {"gemm_autotune", gemm_autotune},
                        {"gdn_products", gdn_bf16 ? "bf16" : "exact"}};
  int64_t step_no = 0;
  struct Kept {
    std::string name;
    data::PackedBatch tree, path;
    double scale;
  };
  std::vector<Kept> batches;
  for (const std::string& w : split(workloads)) {
    const data::SyntheticSpec spec = workload_spec(w, (int)cfg.vocab_size);
    const std::vector<data::Tree> trees = read_workload(spec);
    std::vector<const data::Tree*> ptrs;
    int64_t n_tree = 0, n_paths = 0, longest = 0;
    for (const data::Tree& t : trees) {
      ptrs.push_back(&t);
      n_tree += t.n_tree();
      n_paths += t.n_paths();
      for (int64_t k = 0; k < t.n_paths(); ++k) longest = std::max<int64_t>(longest, (int64_t)t.path_tokens(k).size());
    }
    const std::vector<data::PackedBatch> tree = {data::pack(ptrs, data::Packing::kTree)};
    const std::vector<data::PackedBatch> paths = per_path_batches(trees, std::max(n_tree, longest));
    const double scale = 1.0 / (double)n_paths;

    std::fprintf(stderr, "%s: %lld unique tokens, %lld paths; tree packing\n", w.c_str(), (long long)n_tree,
                 (long long)n_paths);
    const Run rt = time_steps(*be, tree, scale, warmup, steps, &step_no);
    std::fprintf(stderr, "%s: per-path packing, %zu micro-batches\n", w.c_str(), paths.size());
    const Run rp = time_steps(*be, paths, scale, pp_warmup, pp_steps, &step_no);

    double f_tree = 0, t_tree = 0, f_pp = 0, t_pp = 0;
    nlohmann::json jt = report(arch, tree, rt, n_tree, &f_tree, &t_tree);
    nlohmann::json jp = report(arch, paths, rp, n_tree, &f_pp, &t_pp);
    const double speedup = t_pp / t_tree, flop_ratio = f_pp / f_tree;
    out["workloads"][w] = {{"spec", {{"kind", spec.kind}, {"prompt_len", spec.prompt_len}, {"turns", spec.turns},
                                     {"turn_len", spec.turn_len}, {"branches", spec.branches},
                                     {"branch_turns", spec.branch_turns}, {"prefix_len", spec.prefix_len},
                                     {"steps", spec.steps}, {"history_len", spec.history_len},
                                     {"leaf_len", spec.leaf_len}}},
                           {"paths", n_paths},
                           {"tree", jt},
                           {"per_path", jp},
                           {"loss_rel_diff", std::abs(rt.loss - rp.loss) / std::abs(rt.loss)},
                           {"speedup", speedup},
                           {"flop_ratio", flop_ratio},
                           {"speedup_over_flop_ratio", speedup / flop_ratio},
                           {"executed_flop_ratio", jp["executed_tflop"].get<double>() / jt["executed_tflop"].get<double>()},
                           {"speedup_over_executed_flop_ratio",
                            speedup * jt["executed_tflop"].get<double>() / jp["executed_tflop"].get<double>()}};
    batches.push_back({w, tree[0], paths[0], scale});
  }
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  out["device_memory_used_gib"] = (double)(total_b - free_b) / (1 << 30);
  out["device_mallocs"] = be->device_malloc_count();
  be.reset();
  if (profile) {
    tt::model::CudaExecOptions o = cuda_options;
    o.profile = true;
    tt::model::CudaModel m(cfg, tt::model::DecoderOptions{}, o);
    m.init(1);
    for (const Kept& k : batches) {
      std::fprintf(stderr, "%s: profiled forward_backward\n", k.name.c_str());
      out["breakdown"][k.name]["tree"] = breakdown(m, k.tree, k.scale);
      out["breakdown"][k.name]["per_path_first_micro_batch"] = breakdown(m, k.path, k.scale);
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
    std::fprintf(stderr, "train_bench: error: %s\n", e.what());
    return 1;
  }
}
