// Inference benchmark of the "cuda" backend on the Qwen3-1.7B shape (bench/qwen3_shapes.h), an
// inference-only model (bf16 weights only) with random weights, through model::generate:
//   prefill:  one prompt of --prefill-tokens (16384) tokens into the KV cache, logits of its last
//             row; time and MFU (forward FLOPs of the FLOP API: model FLOPs charge the LM head on
//             every row, executed FLOPs on the one row it runs on; against 989 TFLOP/s);
//   decode:   greedy generation of --new-tokens (64) tokens per sample after prompts of given
//             lengths: batch 1 at 1k and 16k context, batch 32 of 512-token prompts, and K = 16
//             samples of one 2k prompt; per decode step the wall time (the forward, the logits'
//             copy to the host and sampling), tokens/s, and for batch 1 the ratio to the bound of
//             reading the bf16 weights once per token at the measured device copy bandwidth
//             (cudaMemcpy device to device of 1 GiB, counting the bytes read and written: a read of
//             the weights moves each byte once).
// Output: one JSON object (stdout). Flags: --prefill-tokens N, --new-tokens N, --layers L (28),
// --cases prefill,b1_1k,b1_16k,b32,k16 (all).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
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
#include "ops/cuda/check.h"

namespace {

using tt::Error;
using tt::str;
namespace model = tt::model;

constexpr double kPeakFlops = 989e12;

// Device-to-device copy bandwidth in bytes moved (read + write) per second: median of 5 copies.
double copy_bandwidth() {
  const size_t n = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  TT_CUDA_CHECK(cudaMalloc(&a, n));
  TT_CUDA_CHECK(cudaMalloc(&b, n));
  cudaEvent_t e0, e1;
  TT_CUDA_CHECK(cudaEventCreate(&e0));
  TT_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    TT_CUDA_CHECK(cudaEventRecord(e0));
    TT_CUDA_CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
    TT_CUDA_CHECK(cudaEventRecord(e1));
    TT_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * (double)n / (ms[ms.size() / 2] * 1e-3);
}

std::vector<model::Prompt> prompts(int count, int len, uint64_t seed, int vocab) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<model::Prompt> out(count);
  for (int i = 0; i < count; ++i) {
    out[i].id = str("p", i);
    out[i].tokens.resize(len);
    for (int32_t& t : out[i].tokens) t = tok(rng);
  }
  return out;
}

int run(int argc, char** argv) {
  int prefill_tokens = 16384, new_tokens = 64, layers = 28;
  std::string cases = "prefill,b1_1k,b1_16k,b32,k16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(str(a, ": missing value"));
      return argv[++i];
    };
    if (a == "--prefill-tokens") prefill_tokens = std::stoi(next());
    else if (a == "--new-tokens") new_tokens = std::stoi(next());
    else if (a == "--layers") layers = std::stoi(next());
    else if (a == "--cases") cases = next();
    else throw Error(str("unknown flag ", a, " (see bench/infer_bench.cc)"));
  }
  auto want = [&](const std::string& c) { return ("," + cases + ",").find("," + c + ",") != std::string::npos; };
  const model::ModelConfig cfg = tt::bench::qwen3_1_7b(layers);
  model::DecoderOptions o;
  o.inference = true;
  model::CudaModel m(cfg, o);
  m.init(1);
  const double bw = copy_bandwidth();
  const double weight_bytes = 2.0 * (double)m.num_params();
  const double bound_s = weight_bytes / bw;  // reading the weights once at the copy's rate of bytes moved
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::json out = {{"device", prop.name},
                        {"parameters", m.num_params()},
                        {"weight_bytes", weight_bytes},
                        {"copy_bandwidth_gbs", bw / 1e9},
                        {"weight_read_bound_ms", bound_s * 1e3}};
  const int V = (int)cfg.vocab_size;

  if (want("prefill")) {
    model::SamplingOptions s;
    s.temperature = 0;
    s.max_new_tokens = 1;
    s.max_batch_tokens = prefill_tokens + 1;
    const std::vector<model::Prompt> p = prompts(1, prefill_tokens, 3, V);
    model::generate(m, p, s);  // warm-up: plans, workspaces, cache buffers
    std::vector<double> t;
    for (int r = 0; r < 3; ++r) {
      model::GenerateStats st;
      model::generate(m, p, s, &st);
      t.push_back(st.prefill_s);
    }
    std::sort(t.begin(), t.end());
    model::Work w;
    w.tokens = prefill_tokens;
    w.visible_pairs = (int64_t)prefill_tokens * (prefill_tokens + 1) / 2;
    w.head_rows = 1;
    const model::Flops f = m.architecture().flops(w, model::Pass::kForward);
    const double sec = t[1];
    out["prefill"] = {{"tokens", prefill_tokens},
                      {"s", sec},
                      {"tokens_per_s", prefill_tokens / sec},
                      {"model_tflops", f.model / sec / 1e12},
                      {"mfu_model", f.model / sec / kPeakFlops},
                      {"mfu_executed", f.executed / sec / kPeakFlops}};
    std::fprintf(stderr, "prefill %d tokens: %.3f s, MFU %.1f%% (executed FLOPs)\n", prefill_tokens, sec,
                 100 * f.executed / sec / kPeakFlops);
  }
  struct Case {
    std::string name;
    int prompts, len, samples;
  };
  for (const Case& c : {Case{"b1_1k", 1, 1024, 1}, Case{"b1_16k", 1, 16384, 1}, Case{"b32", 32, 512, 1},
                        Case{"k16", 1, 2048, 16}}) {
    if (!want(c.name)) continue;
    model::SamplingOptions s;
    s.temperature = 0;
    s.max_new_tokens = new_tokens;
    s.num_samples = c.samples;
    s.max_batch_tokens = (int64_t)c.prompts * (c.len + (int64_t)c.samples * new_tokens);
    const std::vector<model::Prompt> p = prompts(c.prompts, c.len, 5, V);
    s.max_new_tokens = 4;
    model::generate(m, p, s);  // warm-up
    s.max_new_tokens = new_tokens;
    model::GenerateStats st;
    model::generate(m, p, s, &st);
    const double step = st.decode_s / (double)st.decode_steps;
    const int rows = c.prompts * c.samples;
    nlohmann::json j = {{"prompts", c.prompts},      {"prompt_len", c.len},
                        {"samples", c.samples},      {"rows_per_step", rows},
                        {"decode_steps", st.decode_steps}, {"step_ms", step * 1e3},
                        {"tokens_per_s", rows / step}, {"prefill_s", st.prefill_s},
                        {"host_enqueue_ms", st.decode_enqueue_s / (double)st.decode_steps * 1e3}};
    if (rows == 1) j["over_weight_bound"] = bound_s / step;
    out["decode"][c.name] = j;
    std::fprintf(stderr, "%s: %.3f ms per step (host enqueue %.3f), %.0f tokens/s%s\n", c.name.c_str(), step * 1e3,
                 st.decode_enqueue_s / (double)st.decode_steps * 1e3, rows / step,
                 rows == 1 ? str(", ", 100 * bound_s / step, "% of the weight-read bound").c_str() : "");
  }
  if (out.contains("decode") && out["decode"].contains("b1_1k") && out["decode"].contains("b1_16k"))
    out["decode_16k_over_1k"] = out["decode"]["b1_16k"]["step_ms"].get<double>() /
                                out["decode"]["b1_1k"]["step_ms"].get<double>();
  std::cout << out.dump(2) << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "infer_bench: error: %s\n", e.what());
    return 1;
  }
}
