// Segment-level prefill against full-context prefill on the "cuda" backend (issue 18): an
// inference-only model (bf16 weights only, random) prefills one prompt of N tokens and computes
// the logits of its last row, either
//   full:      model::generate, the whole prompt one batch: the KV cache of every row and layer
//              plus one layer's working set at a time;
//   segmented: model::generate_segmented with segments of S tokens, a carried tail of M rows, R
//              retrieved pairs for the long-range KV heads of 4 layers: the cache holds the open
//              segment, the tail and the pool (every earlier row of the long-range layers).
// Per (shape, N, mode), on a model of its own (a model keeps its working buffers between calls,
// so a mode measured after another would count the other's): a warm-up prefill of 4096 tokens,
// then the prefill time (the faster of 2) and the allocator's peak bytes in use over both, whole
// and above the weights. Shapes: llama2_7b (the paper's: 32
// layers, 32 heads of 128, no GQA, long-range layers {6, 8, 11, 18}) and qwen3_1_7b
// (bench/qwen3_shapes.h, long-range layers {4, 8, 12, 18}) and hybrid_2b (bench/qwen3_shapes.h:
// 18 Gated DeltaNet layers, whose states cross the boundaries, and 6 attention layers, long-range
// layers {3, 11, 19}); the long-range KV heads are the last quarter, at least one (the paper does
// not say how many). Output: one JSON object (stdout).
// Flags: --shape llama2_7b|qwen3_1_7b|hybrid_2b, --tokens 32768,65536,131072, --modes full,segmented,
// --segment 4096, --tail 512, --retrieve 512.
//
// --train (issue 18's training figures): a training step (forward, backward, AdamW on the
// trainer's CUDA backend: fp32 master weights, gradients and moments, bf16 working copy) on one
// sequence of N tokens, full context (one batch) against segmented (S, M, R as above, truncated
// BPTT K = --tbptt, default 1): the step time (the faster of 2 after a warm-up step), tokens/s
// and the peak bytes in use; then the longest sequence each trains: N doubled from --ladder-from
// (default 32768) until a step fails (out of memory) or takes longer than --ladder-s seconds
// (default 60; then the figure is a lower bound, said in the output).
#include "data/partition.h"
#include "data/reader.h"
#include "trainer/backend.h"
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/check.h"
#include "bench/qwen3_shapes.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "model/segments.h"
#include "ops/cuda/check.h"

namespace {

using tt::Error;
using tt::str;
namespace model = tt::model;

model::ModelConfig llama2_7b() {
  model::ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 32000;
  c.hidden_size = 4096;
  c.intermediate_size = 11008;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 32;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.initializer_range = 0.02;
  return c;
}

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) out.push_back(std::stoll(x));
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One sequence of N random tokens as a one-node tree, every token a target.
tt::data::Tree sequence(int64_t N, int vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::string line = "{\"id\":\"s\",\"nodes\":[{\"parent\":-1,\"tokens\":[";
  for (int64_t i = 0; i < N; ++i) {
    if (i) line += ',';
    line += std::to_string(tok(rng));
  }
  line += "]}]}";
  return tt::data::parse_tree_line(line, "segments_bench", vocab);
}

// One training step of `mode` on `tree` (zero_grad, forward and backward, AdamW): seconds.
double train_step(tt::trainer::Backend& be, const std::string& mode, const tt::data::Tree& tree,
                  const model::SegmentConfig& seg, int64_t step) {
  TT_CUDA_CHECK(cudaDeviceSynchronize());
  const double t0 = now_s();
  be.zero_grad();
  const double scale = 1.0 / (double)tree.n_tree();
  if (mode == "full") {
    be.forward_backward(tt::data::pack({&tree}, tt::data::Packing::kTree), scale);
  } else {
    be.forward_backward_segmented(tt::data::plan_segments(tree, seg.length), seg, scale);
  }
  tt::trainer::OptimStep o;
  o.lr = 1e-5;
  o.step = step;
  be.adamw_step(o);
  TT_CUDA_CHECK(cudaDeviceSynchronize());
  return now_s() - t0;
}

nlohmann::json train(const model::ModelConfig& cfg, const model::SegmentConfig& seg, const std::string& modes,
                     const std::vector<int64_t>& tokens, int64_t ladder_from, double ladder_s) {
  auto want = [&](const std::string& x) { return ("," + modes + ",").find("," + x + ",") != std::string::npos; };
  nlohmann::json out;
  std::mt19937_64 rng(5);
  for (const int64_t N : tokens) {
    const tt::data::Tree tree = sequence(N, (int)cfg.vocab_size, rng);
    nlohmann::json row = {{"tokens", N}};
    for (const std::string mode : {"full", "segmented"}) {
      if (!want(mode)) continue;
      try {
        std::unique_ptr<tt::trainer::Backend> be = tt::trainer::make_backend("cuda", cfg);
        be->init(1);
        // The model's state: master weights, working copy, gradients, AdamW moments.
        const int64_t state = be->take_device_peak_bytes();
        train_step(*be, mode, tree, seg, 1);  // warm-up: plans, workspaces, GEMM handles
        be->take_device_peak_bytes();
        std::vector<double> t;
        for (int r = 0; r < 2; ++r) t.push_back(train_step(*be, mode, tree, seg, 2 + r));
        std::sort(t.begin(), t.end());
        const int64_t peak = be->take_device_peak_bytes();
        row[mode] = {{"step_s", t[0]}, {"tokens_per_s", N / t[0]}, {"peak_gib", peak / 1073741824.0},
                     {"state_gib", state / 1073741824.0}, {"peak_above_state_gib", (peak - state) / 1073741824.0}};
        std::fprintf(stderr, "train N=%lld %s: %.3f s a step, %.0f tokens/s, peak %.2f GiB (%.2f above the %.2f GiB "
                     "of weights, gradients and moments)\n", (long long)N, mode.c_str(), t[0], N / t[0],
                     peak / 1073741824.0, (peak - state) / 1073741824.0, state / 1073741824.0);
      } catch (const std::exception& e) {
        row[mode] = {{"error", e.what()}};
        std::fprintf(stderr, "train N=%lld %s: %s\n", (long long)N, mode.c_str(), e.what());
      }
    }
    if (row.contains("full") && row.contains("segmented") && row["full"].contains("step_s") &&
        row["segmented"].contains("step_s")) {
      row["peak_ratio"] = row["full"]["peak_gib"].get<double>() / row["segmented"]["peak_gib"].get<double>();
      row["peak_above_state_ratio"] = row["full"]["peak_above_state_gib"].get<double>() /
                                      row["segmented"]["peak_above_state_gib"].get<double>();
      row["speedup"] = row["full"]["step_s"].get<double>() / row["segmented"]["step_s"].get<double>();
    }
    out["runs"].push_back(row);
  }
  // The longest sequence each trains: one step per length, doubling.
  for (const std::string mode : {"full", "segmented"}) {
    if (!want(mode) || ladder_from <= 0) continue;
    nlohmann::json lad = nlohmann::json::array();
    int64_t longest = 0;
    std::string stop = "";
    for (int64_t N = ladder_from;; N *= 2) {
      try {
        const tt::data::Tree tree = sequence(N, (int)cfg.vocab_size, rng);
        std::unique_ptr<tt::trainer::Backend> be = tt::trainer::make_backend("cuda", cfg);
        be->init(1);
        be->take_device_peak_bytes();
        const double s = train_step(*be, mode, tree, seg, 1);
        const int64_t peak = be->take_device_peak_bytes();
        lad.push_back({{"tokens", N}, {"step_s", s}, {"peak_gib", peak / 1073741824.0}});
        std::fprintf(stderr, "ladder %s N=%lld: %.2f s, peak %.2f GiB\n", mode.c_str(), (long long)N, s,
                     peak / 1073741824.0);
        longest = N;
        if (s > ladder_s) {
          stop = tt::str("time: a step of ", N, " tokens took ", s, " s (> ", ladder_s, "): a lower bound");
          break;
        }
      } catch (const std::exception& e) {
        stop = tt::str("failed at ", N, " tokens: ", e.what());
        std::fprintf(stderr, "ladder %s N=%lld: %s\n", mode.c_str(), (long long)N, e.what());
        break;
      }
    }
    out["longest"][mode] = {{"tokens", longest}, {"stopped", stop}, {"steps", lad}};
  }
  return out;
}

int run(int argc, char** argv) {
  std::string shape = "llama2_7b", modes = "full,segmented";
  std::vector<int64_t> tokens = {32768, 65536, 131072};
  int64_t S = 4096, M = 512, R = 512, K = 1, ladder_from = 32768;
  double ladder_s = 60;
  bool training = false, tokens_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(str(a, ": missing value"));
      return argv[++i];
    };
    if (a == "--shape") shape = next();
    else if (a == "--tokens") tokens = ints(next()), tokens_set = true;
    else if (a == "--train") training = true;
    else if (a == "--tbptt") K = std::stoll(next());
    else if (a == "--ladder-from") ladder_from = std::stoll(next());
    else if (a == "--ladder-s") ladder_s = std::stod(next());
    else if (a == "--modes") modes = next();
    else if (a == "--segment") S = std::stoll(next());
    else if (a == "--tail") M = std::stoll(next());
    else if (a == "--retrieve") R = std::stoll(next());
    else throw Error(str("unknown flag ", a, " (see bench/segments_bench.cc)"));
  }
  model::ModelConfig cfg;
  std::vector<int> long_layers;
  if (shape == "llama2_7b") {
    cfg = llama2_7b();
    long_layers = {6, 8, 11, 18};
  } else if (shape == "qwen3_1_7b") {
    cfg = tt::bench::qwen3_1_7b();
    long_layers = {4, 8, 12, 18};
  } else if (shape == "hybrid_2b") {  // Gated DeltaNet states cross the boundaries; retrieval in attention layers
    cfg = tt::bench::hybrid_2b();
    long_layers = {3, 11, 19};
  } else {
    throw Error(str("--shape ", shape, ": expected llama2_7b, qwen3_1_7b or hybrid_2b"));
  }
  if (training && !tokens_set) tokens = {32768};
  cfg.max_position_embeddings = std::max<int64_t>(*std::max_element(tokens.begin(), tokens.end()), 1 << 24) + 16;
  model::SegmentConfig seg;
  seg.length = S;
  seg.tail = M;
  seg.tbptt = K;
  seg.long_range.layers = long_layers;
  const int NKV = (int)cfg.num_key_value_heads;
  for (int g = NKV - std::max(NKV / 4, 1); g < NKV; ++g) seg.long_range.heads.push_back(g);  // at least one
  seg.long_range.retrieve = R;
  seg.validate(cfg);

  if (training) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    nlohmann::json out = train(cfg, seg, modes, tokens, ladder_from, ladder_s);
    out["device"] = prop.name;
    out["shape"] = shape;
    out["segments"] = {{"length", S}, {"tail", M}, {"retrieve", R}, {"tbptt", K}, {"long_layers", long_layers},
                       {"long_kv_heads", seg.long_range.heads}};
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  model::DecoderOptions o;
  o.inference = true;
  int64_t weights = 0;
  {
    model::CudaModel m(cfg, o);
    weights = m.exec().allocator().stats().bytes_in_use;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::json out = {{"device", prop.name},
                        {"shape", shape},
                        {"parameters", model::CudaModel(cfg, o).num_params()},
                        {"weights_gib", weights / 1073741824.0},
                        {"segments", {{"length", S}, {"tail", M}, {"retrieve", R}, {"long_layers", long_layers},
                                      {"long_kv_heads", seg.long_range.heads}}}};
  auto want = [&](const std::string& x) { return ("," + modes + ",").find("," + x + ",") != std::string::npos; };
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int> tok(0, (int)cfg.vocab_size - 1);
  for (const int64_t N : tokens) {
    model::Prompt p;
    p.id = "p";
    p.tokens.resize(N);
    for (int32_t& t : p.tokens) t = tok(rng);
    model::SamplingOptions so;
    so.temperature = 0;
    so.max_new_tokens = 1;
    so.max_batch_tokens = N + 1;
    nlohmann::json row = {{"tokens", N}};
    for (const std::string mode : {"full", "segmented"}) {
      if (!want(mode)) continue;
      model::CudaModel m(cfg, o);
      m.init(1);
      auto& alloc = m.exec().allocator();
      auto once = [&](const model::Prompt& x) {
        model::GenerateStats st;
        if (mode == "full") model::generate(m, {x}, so, &st);
        else model::generate_segmented(m, seg, {x}, so, &st);
        return st.prefill_s;
      };
      model::Prompt small = p;
      small.tokens.resize(std::min<int64_t>(N, 4096));
      once(small);  // plans, workspaces, GEMM handles
      std::vector<double> t;
      int64_t peak = 0;
      for (int r = 0; r < 2; ++r) {
        TT_CUDA_CHECK(cudaDeviceSynchronize());
        alloc.reset_peak();
        t.push_back(once(p));
        peak = std::max(peak, alloc.stats().peak_bytes_in_use);
      }
      std::sort(t.begin(), t.end());
      row[mode] = {{"prefill_s", t[0]}, {"peak_gib", peak / 1073741824.0},
                   {"peak_above_weights_gib", (peak - weights) / 1073741824.0}, {"tokens_per_s", N / t[0]}};
      std::fprintf(stderr, "%s N=%lld %s: %.3f s, peak %.2f GiB (%.2f above the weights)\n", shape.c_str(),
                   (long long)N, mode.c_str(), t[0], peak / 1073741824.0, (peak - weights) / 1073741824.0);
    }
    if (row.contains("full") && row.contains("segmented")) {
      row["peak_ratio"] = row["full"]["peak_gib"].get<double>() / row["segmented"]["peak_gib"].get<double>();
      row["peak_above_weights_ratio"] = row["full"]["peak_above_weights_gib"].get<double>() /
                                        row["segmented"]["peak_above_weights_gib"].get<double>();
      row["speedup"] = row["full"]["prefill_s"].get<double>() / row["segmented"]["prefill_s"].get<double>();
    }
    out["runs"].push_back(row);
  }
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segments_bench: error: %s\n", e.what());
    return 1;
  }
}
