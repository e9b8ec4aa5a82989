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
//             Each decode step is enqueued before the draws of the one before come back
//             (SamplingOptions::overlap); with --serial, each case also runs one step at a time,
//             alternating with the overlapped run, --repeats times (step_ms_serial, overlap_speedup:
//             medians).
//   profile:  with --profile, after the timed runs, a second model with CudaExecOptions::profile
//             runs each decode case once more: host and GPU time per op class per decode step
//             (a run of max_new_tokens 1, the prefill alone, subtracted; the profile's events
//             perturb the GPU times a little).
// Output: one JSON object (stdout). Flags: --prefill-tokens N, --new-tokens N, --layers L (28),
// --cases prefill,b1_1k,b1_16k,b32,k16 (all), --serial, --repeats R (1), --profile.
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
  int prefill_tokens = 16384, new_tokens = 64, layers = 28, repeats = 1;
  bool serial = false, profile = false;
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
    else if (a == "--serial") serial = true;
    else if (a == "--profile") profile = true;
    else if (a == "--repeats") repeats = std::stoi(next());
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
  const Case all_cases[] = {Case{"b1_1k", 1, 1024, 1}, Case{"b1_16k", 1, 16384, 1}, Case{"b32", 32, 512, 1},
                            Case{"k16", 1, 2048, 16}};
  auto options_of = [&](const Case& c) {
    model::SamplingOptions s;
    s.temperature = 0;
    s.max_new_tokens = new_tokens;
    s.num_samples = c.samples;
    s.max_batch_tokens = (int64_t)c.prompts * (c.len + (int64_t)c.samples * new_tokens);
    return s;
  };
  for (const Case& c : all_cases) {
    if (!want(c.name)) continue;
    model::SamplingOptions s = options_of(c);
    const std::vector<model::Prompt> p = prompts(c.prompts, c.len, 5, V);
    s.max_new_tokens = 4;
    model::generate(m, p, s);  // warm-up
    s.max_new_tokens = new_tokens;
    const int rows = c.prompts * c.samples;
    std::vector<double> on_ms, off_ms, enqueue_ms;
    model::GenerateStats st;
    for (int r = 0; r < std::max(repeats, 1); ++r)
      for (const bool overlap : {true, false}) {
        if (!overlap && !serial) continue;
        s.overlap = overlap;
        model::GenerateStats x;
        model::generate(m, p, s, &x);
        (overlap ? on_ms : off_ms).push_back(x.decode_s / (double)x.decode_steps * 1e3);
        if (overlap) {
          enqueue_ms.push_back(x.decode_enqueue_s / (double)x.decode_steps * 1e3);
          st = x;
        }
      }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double step = median(on_ms) * 1e-3;
    nlohmann::json j = {{"prompts", c.prompts},      {"prompt_len", c.len},
                        {"samples", c.samples},      {"rows_per_step", rows},
                        {"decode_steps", st.decode_steps}, {"overlapped_steps", st.overlapped_steps},
                        {"step_ms", step * 1e3},     {"step_ms_runs", on_ms},
                        {"tokens_per_s", rows / step}, {"prefill_s", st.prefill_s},
                        {"host_enqueue_ms", median(enqueue_ms)}};
    if (serial) {
      j["step_ms_serial"] = median(off_ms);
      j["step_ms_serial_runs"] = off_ms;
      j["overlap_speedup"] = median(off_ms) / (step * 1e3);
    }
    if (rows == 1) j["over_weight_bound"] = bound_s / step;
    for (size_t r = 0; r < on_ms.size(); ++r)
      std::fprintf(stderr, "%s run %zu: %.3f ms per step overlapped (%.1f%% of the weight-read bound)%s\n",
                   c.name.c_str(), r, on_ms[r], 100 * bound_s / (on_ms[r] * 1e-3),
                   serial ? str(", ", off_ms[r], " ms one step at a time").c_str() : "");
    out["decode"][c.name] = j;
    std::fprintf(stderr, "%s: %.3f ms per step (host enqueue %.3f), %.0f tokens/s%s\n", c.name.c_str(), step * 1e3,
                 median(enqueue_ms), rows / step,
                 rows == 1 ? str(", ", 100 * bound_s / step, "% of the weight-read bound").c_str() : "");
  }
  if (profile) {
    model::CudaExecOptions po;
    po.profile = true;
    model::CudaModel mp(cfg, o, po);
    mp.init(1);
    for (const Case& c : all_cases) {
      if (!want(c.name)) continue;
      model::SamplingOptions s = options_of(c);
      const std::vector<model::Prompt> p = prompts(c.prompts, c.len, 5, V);
      model::generate(mp, p, s);  // warm-up
      mp.exec().take_profile();
      model::GenerateStats st;
      model::generate(mp, p, s, &st);
      const model::CudaProfile full = mp.exec().take_profile();
      s.max_new_tokens = 1;
      model::generate(mp, p, s);
      const model::CudaProfile pre = mp.exec().take_profile();
      const double n = (double)st.decode_steps;
      // Per decode step, class by class: the whole run's time less the prefill-only run's.
      auto per_step = [&](const model::CudaOpTimes& f, const model::CudaOpTimes& q) {
        return nlohmann::json{{"gemm", (f.gemm_ms - q.gemm_ms) / n},
                              {"attention", (f.attention_ms - q.attention_ms) / n},
                              {"head", (f.head_ms - q.head_ms) / n},
                              {"norm", (f.norm_ms - q.norm_ms) / n},
                              {"other", (f.other_ms - q.other_ms) / n},
                              {"total", (f.total_ms() - q.total_ms()) / n}};
      };
      nlohmann::json j = {{"host_ms", per_step(full.host, pre.host)},
                          {"gpu_ms", per_step(full, pre)},
                          {"step_ms", st.decode_s / n * 1e3}};
      out["profile"][c.name] = j;
      std::fprintf(stderr, "profile %s: %s\n", c.name.c_str(), j.dump().c_str());
    }
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
