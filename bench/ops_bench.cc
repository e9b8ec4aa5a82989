// Micro-benchmarks of the CUDA ops (ops/cuda) at Qwen3-1.7B training shapes: 16384 tokens,
// hidden 2048, 16 query / 8 key-value heads of 128, intermediate 6144, vocabulary 151936, 28
// layers (1.72e9 parameters with tied embeddings).
//
// Each op is timed with CUDA events around single calls after warm-up; the median of the
// repetitions is reported. Memory-bound ops report the bytes they must move at least (every input
// read once, every output written once) over the time, and that as a fraction of the device-to-
// device copy bandwidth measured in the same run (bytes read + written). GEMMs report TFLOP/s of
// 2 N IC OC per product. Inputs are random (never zeros), replicated from a host-generated block.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <type_traits>
#include <string>
#include <vector>

#include "ops/cuda/adamw.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/check.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/memory.h"
#include "ops/cuda/rmsnorm.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/swiglu.h"

namespace {

using tt::cuda::bf16;
using tt::cuda::DeviceBuffer;

constexpr int kTokens = 16384, kHidden = 2048, kHeads = 16, kKvHeads = 8, kHeadDim = 128;
constexpr int kInter = 6144, kVocab = 151936, kLayers = 28;
constexpr size_t kFillBlock = size_t(1) << 22;  // random elements generated on the host per fill

cudaStream_t g_stream = nullptr;
double g_copy_gbs = 0;  // measured device-to-device copy bandwidth, GB/s

// Fills dst (n) with normal(0, scale) values: one random block uploaded, then doubled in place.
template <class T>
void fill_random(T* dst, size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  const size_t b = std::min(n, kFillBlock);
  std::vector<T> h(b);
  for (auto& v : h) {
    if constexpr (std::is_same_v<T, bf16>) v = tt::cuda::host_float_to_bf16(dist(rng));
    else v = (T)dist(rng);
  }
  TT_CUDA_CHECK(cudaMemcpy(dst, h.data(), b * sizeof(T), cudaMemcpyHostToDevice));
  for (size_t done = b; done < n;) {
    const size_t c = std::min(done, n - done);
    TT_CUDA_CHECK(cudaMemcpy(dst + done, dst, c * sizeof(T), cudaMemcpyDeviceToDevice));
    done += c;
  }
}

double median_ms(const std::function<void()>& f, int warmup, int reps) {
  for (int i = 0; i < warmup; i++) f();
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) TT_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; i++) {
    TT_CUDA_CHECK(cudaEventRecord(ev[2 * i], g_stream));
    f();
    TT_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], g_stream));
  }
  TT_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; i++) {
    float t = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t;
  }
  for (auto& e : ev) TT_CUDA_CHECK(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

struct Row {
  std::string name, shape;
  double ms, gbs, tflops;
};
std::vector<Row> g_rows;

void report_bw(const std::string& name, const std::string& shape, double bytes, const std::function<void()>& f,
               int reps = 20) {
  const double ms = median_ms(f, 3, reps);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  g_rows.push_back({name, shape, ms, gbs, 0});
  std::printf("%-28s %-30s %9.3f ms %8.0f GB/s %5.1f%% of copy\n", name.c_str(), shape.c_str(), ms, gbs,
              g_copy_gbs > 0 ? 100 * gbs / g_copy_gbs : 0.0);
  std::fflush(stdout);
}

void report_flops(const std::string& name, const std::string& shape, double flops, const std::function<void()>& f,
                  int reps) {
  const double ms = median_ms(f, 2, reps);
  const double tf = flops / (ms * 1e-3) / 1e12;
  g_rows.push_back({name, shape, ms, 0, tf});
  std::printf("%-28s %-30s %9.3f ms %8.1f TFLOP/s\n", name.c_str(), shape.c_str(), ms, tf);
  std::fflush(stdout);
}

std::string dims(std::initializer_list<long> d) {
  std::string s = "(";
  for (long v : d) s += (s.size() > 1 ? "," : "") + std::to_string(v);
  return s + ")";
}

void bench_copy() {
  const size_t n = size_t(2) << 30;  // bytes per buffer
  DeviceBuffer<char> a(n), b(n);
  TT_CUDA_CHECK(cudaMemset(a.data(), 1, n));
  const double ms = median_ms([&] { TT_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice, g_stream)); }, 3, 20);
  g_copy_gbs = 2.0 * n / (ms * 1e-3) / 1e9;
  g_rows.push_back({"copy d2d (reference)", "2 GiB", ms, g_copy_gbs, 0});
  std::printf("%-28s %-30s %9.3f ms %8.0f GB/s (read + write)\n", "copy d2d (reference)", "2 GiB", ms, g_copy_gbs);
}

void bench_embedding() {
  const int N = kTokens, C = kHidden, V = kVocab;
  DeviceBuffer<bf16> wte((size_t)V * C), out((size_t)N * C), dout((size_t)N * C);
  DeviceBuffer<float> dwte((size_t)V * C);
  fill_random(wte.data(), wte.size(), 0.02f, 1);
  fill_random(dout.data(), dout.size(), 1.f, 2);
  fill_random(dwte.data(), dwte.size(), 0.01f, 3);
  std::vector<int32_t> tok(N);
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int> td(0, V - 1);
  for (auto& t : tok) t = td(rng);
  const double unique = (double)std::set<int32_t>(tok.begin(), tok.end()).size();
  DeviceBuffer<int32_t> d_tok(N);
  d_tok.copy_from_host(tok);
  DeviceBuffer<char> ws(tt::cuda::embedding_backward_workspace_bytes(N));
  const std::string shape = dims({N, C}) + " V=" + std::to_string(V);
  report_bw("embedding_forward", shape, 2.0 * N * C * 2 + N * 4.0,
            [&] { tt::cuda::embedding_forward(out.data(), d_tok.data(), wte.data(), N, C, V, g_stream); });
  report_bw("embedding_backward", shape, (double)N * C * 2 + unique * C * 8 + N * 4.0, [&] {
    tt::cuda::embedding_backward(dwte.data(), dout.data(), d_tok.data(), N, C, V, {ws.data(), ws.size()}, g_stream);
  });
}

void bench_rmsnorm(const std::string& label, int rows, int C) {
  DeviceBuffer<bf16> x((size_t)rows * C), out((size_t)rows * C), dout((size_t)rows * C), dx((size_t)rows * C), w(C);
  DeviceBuffer<float> rstd(rows), dw(C);
  fill_random(x.data(), x.size(), 1.f, 5);
  fill_random(dout.data(), dout.size(), 1.f, 6);
  fill_random(dx.data(), dx.size(), 0.1f, 7);
  fill_random(w.data(), w.size(), 1.f, 8);
  fill_random(dw.data(), dw.size(), 0.1f, 9);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, C));
  const double a = (double)rows * C * 2;
  report_bw(label + "_forward", dims({rows, C}), 2 * a + rows * 4.0,
            [&] { tt::cuda::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, C, 1e-6, g_stream); });
  report_bw(label + "_backward", dims({rows, C}), 4 * a + rows * 4.0, [&] {
    tt::cuda::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows, C,
                               {ws.data(), ws.size()}, g_stream);
  });
}

void bench_rope() {
  const int N = kTokens, H = kHeads, HS = kHeadDim;
  DeviceBuffer<bf16> q((size_t)N * H * HS);
  fill_random(q.data(), q.size(), 1.f, 10);
  std::vector<int32_t> pos(N);
  for (int n = 0; n < N; n++) pos[n] = n % 4096;
  DeviceBuffer<int32_t> d_pos(N);
  d_pos.copy_from_host(pos);
  const double bytes = 2.0 * N * H * HS * 2 + N * 4.0;
  report_bw("rope_forward (q)", dims({N, H, HS}), bytes,
            [&] { tt::cuda::rope_forward(q.data(), d_pos.data(), N, H, HS, 1e6, g_stream); });
  report_bw("rope_backward (q)", dims({N, H, HS}), bytes,
            [&] { tt::cuda::rope_backward(q.data(), d_pos.data(), N, H, HS, 1e6, g_stream); });
}

void bench_swiglu() {
  const int64_t n = (int64_t)kTokens * kInter;
  DeviceBuffer<bf16> g(n), u(n), o(n), d(n), dg(n), du(n);
  fill_random(g.data(), n, 2.f, 11);
  fill_random(u.data(), n, 1.f, 12);
  fill_random(d.data(), n, 1.f, 13);
  const std::string shape = dims({kTokens, kInter});
  report_bw("swiglu_forward", shape, 3.0 * n * 2, [&] { tt::cuda::swiglu_forward(o.data(), g.data(), u.data(), n, g_stream); });
  report_bw("swiglu_backward", shape, 5.0 * n * 2,
            [&] { tt::cuda::swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), n, g_stream); });
}

void bench_cross_entropy() {
  const int N = kTokens, V = kVocab;
  DeviceBuffer<bf16> logits((size_t)N * V);
  fill_random(logits.data(), logits.size(), 2.f, 14);
  std::vector<int32_t> src(N), tok(N);
  std::vector<double> w(N, 1.0 / N);
  std::mt19937_64 rng(15);
  std::uniform_int_distribution<int> td(0, V - 1);
  for (int i = 0; i < N; i++) src[i] = i, tok[i] = td(rng);
  DeviceBuffer<int32_t> d_src(N), d_tok(N);
  DeviceBuffer<double> d_w(N), loss(1);
  DeviceBuffer<float> lse(N);
  d_src.copy_from_host(src);
  d_tok.copy_from_host(tok);
  d_w.copy_from_host(w);
  TT_CUDA_CHECK(cudaMemset(loss.data(), 0, sizeof(double)));
  DeviceBuffer<char> ws(tt::cuda::cross_entropy_workspace_bytes(N, N));
  const tt::cuda::CeTargets t{d_src.data(), d_tok.data(), d_w.data(), N};
  const std::string shape = dims({N, V});
  // Forward alone first (it leaves the logits intact), then the fused in-place pass.
  report_bw("cross_entropy_forward", shape, (double)N * V * 2, [&] {
    tt::cuda::cross_entropy_forward(loss.data(), lse.data(), logits.data(), t, 0, N, V, {ws.data(), ws.size()},
                                    g_stream);
  }, 10);
  report_bw("cross_entropy_fwd_bwd inplace", shape, 2.0 * N * V * 2, [&] {
    tt::cuda::cross_entropy_forward_backward(loss.data(), lse.data(), logits.data(), logits.data(), t, 0, N, V, 1.f,
                                             {ws.data(), ws.size()}, g_stream);
  }, 10);
}

std::vector<tt::cuda::AdamWTensor> qwen3_tensors(int64_t* total) {
  std::vector<tt::cuda::AdamWTensor> t;
  int64_t off = 0;
  auto add = [&](int64_t n, bool decay) {
    t.push_back({off, n, decay});
    off += n;
  };
  add((int64_t)kVocab * kHidden, true);
  for (int l = 0; l < kLayers; l++) {
    add(kHidden, false);                                      // input_layernorm
    add((int64_t)kHeads * kHeadDim * kHidden, true);          // q_proj
    add((int64_t)kKvHeads * kHeadDim * kHidden, true);        // k_proj
    add((int64_t)kKvHeads * kHeadDim * kHidden, true);        // v_proj
    add((int64_t)kHidden * kHeads * kHeadDim, true);          // o_proj
    add(kHeadDim, false);                                     // q_norm
    add(kHeadDim, false);                                     // k_norm
    add(kHidden, false);                                      // post_attention_layernorm
    add((int64_t)kInter * kHidden, true);                     // gate_proj
    add((int64_t)kInter * kHidden, true);                     // up_proj
    add((int64_t)kHidden * kInter, true);                     // down_proj
  }
  add(kHidden, false);  // final norm
  *total = off;
  return t;
}

void bench_adamw() {
  int64_t P = 0;
  const auto tensors = qwen3_tensors(&P);
  const auto chunks = tt::cuda::adamw_chunks(tensors);
  DeviceBuffer<float> param(P), grad(P), m(P), v(P);
  DeviceBuffer<bf16> pb(P);
  fill_random(param.data(), P, 0.02f, 16);
  fill_random(grad.data(), P, 1e-3f, 17);
  fill_random(m.data(), P, 1e-4f, 18);
  fill_random(v.data(), P, 1e-4f, 19);
  DeviceBuffer<tt::cuda::AdamWChunk> d_chunks(chunks.size());
  d_chunks.copy_from_host(chunks);
  DeviceBuffer<double> sumsq(1);
  DeviceBuffer<float> scale(1);
  DeviceBuffer<char> ws(tt::cuda::sum_squares_workspace_bytes(P));
  // v must be non-negative: one step with lr 0 and betas 0 sets m = g and v = g^2.
  tt::cuda::AdamWParams warm;
  warm.lr = 0, warm.beta1 = 0, warm.beta2 = 0;
  tt::cuda::adamw_update(param.data(), pb.data(), grad.data(), m.data(), v.data(), d_chunks.data(), (int)chunks.size(),
                         warm, nullptr, g_stream);
  tt::cuda::AdamWParams p;
  p.lr = 1e-5, p.weight_decay = 0.1, p.step = 10;
  const std::string shape = "P=" + std::to_string(P);
  report_bw("sum_squares (grad norm)", shape, 4.0 * P,
            [&] { tt::cuda::sum_squares(sumsq.data(), grad.data(), P, {ws.data(), ws.size()}, g_stream); });
  tt::cuda::clip_scale(scale.data(), nullptr, sumsq.data(), 1.0, g_stream);
  report_bw("adamw_update (+bf16 copy)", shape + " chunks=" + std::to_string(chunks.size()), 30.0 * P, [&] {
    tt::cuda::adamw_update(param.data(), pb.data(), grad.data(), m.data(), v.data(), d_chunks.data(),
                           (int)chunks.size(), p, scale.data(), g_stream);
  }, 10);
}

void bench_gemm() {
  tt::cuda::GemmHandle h(g_stream);
  struct Lin {
    const char* name;
    int IC, OC, reps;
  };
  const Lin lins[] = {{"q_proj/o_proj", kHidden, kHeads * kHeadDim, 20},
                      {"k_proj/v_proj", kHidden, kKvHeads * kHeadDim, 20},
                      {"gate_proj/up_proj", kHidden, kInter, 10},
                      {"down_proj", kInter, kHidden, 10},
                      {"lm_head", kHidden, kVocab, 5}};
  const int N = kTokens;
  for (const Lin& l : lins) {
    DeviceBuffer<bf16> x((size_t)N * l.IC), w((size_t)l.OC * l.IC), out((size_t)N * l.OC), dx((size_t)N * l.IC);
    DeviceBuffer<float> dw((size_t)l.OC * l.IC);
    fill_random(x.data(), x.size(), 1.f, 20);
    fill_random(w.data(), w.size(), 0.02f, 21);
    fill_random(out.data(), out.size(), 1.f, 22);  // doubles as dout
    TT_CUDA_CHECK(cudaMemset(dw.data(), 0, dw.bytes()));
    const double flops = 2.0 * N * l.IC * l.OC;
    const std::string shape = "N=" + std::to_string(N) + " " + std::to_string(l.IC) + "->" + std::to_string(l.OC);
    const std::string nm = l.name;
    report_flops(nm + " fwd", shape, flops,
                 [&] { tt::cuda::matmul_forward(h, out.data(), x.data(), w.data(), N, l.IC, l.OC); }, l.reps);
    report_flops(nm + " dx", shape, flops,
                 [&] { tt::cuda::matmul_backward_dx(h, dx.data(), out.data(), w.data(), N, l.IC, l.OC, 0.f); }, l.reps);
    report_flops(nm + " dW+=", shape, flops,
                 [&] { tt::cuda::matmul_backward_dw(h, dw.data(), out.data(), x.data(), N, l.IC, l.OC, 1.f); }, l.reps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cudaDeviceProp prop{};
    TT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
    TT_CUDA_CHECK(cudaStreamCreate(&g_stream));
    const std::string only = argc > 1 ? argv[1] : "";
    auto want = [&](const char* s) { return only.empty() || only == s; };
    bench_copy();
    if (want("embedding")) bench_embedding();
    if (want("rmsnorm")) {
      bench_rmsnorm("rmsnorm", kTokens, kHidden);
      bench_rmsnorm("qk_norm", kTokens * kHeads, kHeadDim);
    }
    if (want("rope")) bench_rope();
    if (want("swiglu")) bench_swiglu();
    if (want("cross_entropy")) bench_cross_entropy();
    if (want("adamw")) bench_adamw();
    if (want("gemm")) bench_gemm();
    TT_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    std::printf("\n%-30s %-36s %10s %10s %8s %9s\n", "op", "shape", "median ms", "GB/s", "% copy", "TFLOP/s");
    for (const Row& r : g_rows) {
      if (r.tflops > 0) {
        std::printf("%-30s %-36s %10.3f %10s %8s %9.1f\n", r.name.c_str(), r.shape.c_str(), r.ms, "", "", r.tflops);
      } else {
        std::printf("%-30s %-36s %10.3f %10.0f %7.1f%% %9s\n", r.name.c_str(), r.shape.c_str(), r.ms, r.gbs,
                    100 * r.gbs / g_copy_gbs, "");
      }
    }
    TT_CUDA_CHECK(cudaStreamDestroy(g_stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ops_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
