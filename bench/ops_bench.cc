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
#include <stdexcept>
#include <type_traits>
#include <string>
#include <vector>

#include <cublasLt.h>

#include "ops/cuda/adamw.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/check.h"
#include "ops/cuda/cross_entropy.h"
#include "ops/cuda/embedding.h"
#include "ops/cuda/gdn.h"
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
  // As the model calls it: the hidden norms read an fp32 dout (a GEMM sum) and accumulate into dx;
  // the q/k norms overwrite dx.
  if (C == kHidden) {
    DeviceBuffer<float> dout32((size_t)rows * C);
    fill_random(dout32.data(), dout32.size(), 1.f, 10);
    report_bw(label + "_backward_f32dout", dims({rows, C}), 5 * a + rows * 4.0, [&] {
      tt::cuda::rmsnorm_backward(dx.data(), dw.data(), dout32.data(), x.data(), w.data(), rstd.data(), rows, C,
                                 {ws.data(), ws.size()}, g_stream);
    });
  } else {
    report_bw(label + "_backward_overwrite", dims({rows, C}), 3 * a + rows * 4.0, [&] {
      tt::cuda::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows, C,
                                 {ws.data(), ws.size()}, g_stream, /*accumulate_dx=*/false);
    });
  }
}

// Qwen3's q/k norm and rotation for the q heads, fused (one pass each way, the batch's rope table
// built once) and as the two ops one after the other.
void bench_qk_norm_rope() {
  const int N = kTokens, H = kHeads, HS = kHeadDim, rows = N * H;
  DeviceBuffer<bf16> x((size_t)rows * HS), out((size_t)rows * HS), dout((size_t)rows * HS), dx((size_t)rows * HS),
      w(HS);
  DeviceBuffer<float> rstd(rows), dw(HS);
  DeviceBuffer<int32_t> pos(N);
  DeviceBuffer<float2> cs((size_t)N * HS / 2);
  fill_random(x.data(), x.size(), 1.f, 11);
  fill_random(dout.data(), dout.size(), 1.f, 12);
  fill_random(w.data(), w.size(), 1.f, 13);
  TT_CUDA_CHECK(cudaMemset(dw.data(), 0, dw.bytes()));
  std::vector<int32_t> hp(N);
  for (int n = 0; n < N; n++) hp[n] = n;
  pos.copy_from_host(hp);
  tt::cuda::rope_table(cs.data(), pos.data(), N, HS, 1e6, g_stream);
  DeviceBuffer<char> ws(tt::cuda::rmsnorm_backward_workspace_bytes(rows, HS));
  const double a = (double)rows * HS * 2;
  const std::string shape = dims({N, H, HS});
  report_bw("qk_norm_rope_forward fused", shape, 2 * a + rows * 4.0, [&] {
    tt::cuda::qk_norm_rope_forward(out.data(), rstd.data(), x.data(), w.data(), cs.data(), N, H, HS, 1e-6, g_stream);
  });
  report_bw("qk_norm + rope forward", shape, 2 * a + rows * 4.0, [&] {
    tt::cuda::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, HS, 1e-6, g_stream);
    tt::cuda::rope_forward(out.data(), pos.data(), N, H, HS, 1e6, g_stream);
  });
  report_bw("qk_norm_rope_backward fused", shape, 3 * a + rows * 4.0, [&] {
    tt::cuda::qk_norm_rope_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), cs.data(), N,
                                    H, HS, {ws.data(), ws.size()}, g_stream, /*accumulate_dx=*/false);
  });
  report_bw("rope + qk_norm backward", shape, 3 * a + rows * 4.0, [&] {
    tt::cuda::rope_backward(dout.data(), pos.data(), N, H, HS, 1e6, g_stream);  // dout rotated in place: timing only
    tt::cuda::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows, HS,
                               {ws.data(), ws.size()}, g_stream, /*accumulate_dx=*/false);
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

// AdamW of step s overlapped with the forward GEMMs of step s + 1: the forward (28 layers' seven
// projections at N tokens) on a high-priority stream, AdamW per layer on a low-priority one, the
// forward of layer l waiting for that layer's update (the embedding's first). Prints the forward
// alone, AdamW alone, and both (serial sum vs overlapped), and the fraction of AdamW hidden.
void bench_overlap() {
  int lo = 0, hi = 0;
  TT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s_hi = nullptr, s_lo = nullptr;
  TT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_hi, cudaStreamNonBlocking, hi));
  TT_CUDA_CHECK(cudaStreamCreateWithPriority(&s_lo, cudaStreamNonBlocking, lo));
  int64_t P = 0;
  const auto tensors = qwen3_tensors(&P);
  // Chunk ranges per group: the embedding, then each layer's 11 tensors.
  std::vector<std::vector<tt::cuda::AdamWTensor>> groups(1 + kLayers);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t gi = i == 0 ? 0 : std::min<size_t>(kLayers, 1 + (i - 1) / 11);
    groups[gi].push_back(tensors[i]);
  }
  std::vector<tt::cuda::AdamWChunk> all;
  std::vector<std::pair<int, int>> range;
  for (auto& g : groups) {
    auto c = tt::cuda::adamw_chunks(g);
    range.push_back({(int)all.size(), (int)c.size()});
    all.insert(all.end(), c.begin(), c.end());
  }
  DeviceBuffer<float> param(P), grad(P), m(P), v(P);
  DeviceBuffer<bf16> pb(P);
  fill_random(param.data(), P, 0.02f, 16);
  fill_random(grad.data(), P, 1e-3f, 17);
  TT_CUDA_CHECK(cudaMemset(m.data(), 0, m.bytes()));
  TT_CUDA_CHECK(cudaMemset(v.data(), 0, v.bytes()));
  DeviceBuffer<tt::cuda::AdamWChunk> d_chunks(all.size());
  d_chunks.copy_from_host(all);
  tt::cuda::AdamWParams p;
  p.lr = 1e-5, p.weight_decay = 0.1, p.step = 10;

  const int N = kTokens;
  DeviceBuffer<bf16> x((size_t)N * kInter), y((size_t)N * kInter), w((size_t)kInter * kHidden);
  fill_random(x.data(), x.size(), 1.f, 20);
  fill_random(w.data(), w.size(), 0.02f, 21);
  tt::cuda::GemmHandle h(s_hi);
  std::vector<cudaEvent_t> ready(1 + kLayers);
  for (auto& e : ready) TT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaEvent_t t0, t1, start, lo_done;
  TT_CUDA_CHECK(cudaEventCreate(&t0));
  TT_CUDA_CHECK(cudaEventCreate(&t1));
  TT_CUDA_CHECK(cudaEventCreateWithFlags(&start, cudaEventDisableTiming));
  TT_CUDA_CHECK(cudaEventCreateWithFlags(&lo_done, cudaEventDisableTiming));
  auto layer_gemms = [&] {
    const int QD = kHeads * kHeadDim, KD = kKvHeads * kHeadDim;
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kHidden, QD);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kHidden, KD);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kHidden, KD);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, QD, kHidden);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kHidden, kInter);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kHidden, kInter);
    tt::cuda::matmul_forward(h, y.data(), x.data(), w.data(), N, kInter, kHidden);
  };
  auto adamw_group = [&](int gi) {
    tt::cuda::adamw_update(param.data(), pb.data(), grad.data(), m.data(), v.data(), d_chunks.data() + range[gi].first,
                           range[gi].second, p, nullptr, s_lo);
  };
  // mode 0: forward alone; 1: AdamW alone; 2: AdamW then forward on one stream; 3: overlapped.
  auto run = [&](int mode) {
    TT_CUDA_CHECK(cudaEventRecord(t0, s_hi));
    TT_CUDA_CHECK(cudaEventRecord(start, s_hi));
    TT_CUDA_CHECK(cudaStreamWaitEvent(s_lo, start, 0));
    if (mode == 1 || mode == 3)
      for (int gi = 0; gi <= kLayers; ++gi) {
        adamw_group(gi);
        TT_CUDA_CHECK(cudaEventRecord(ready[gi], s_lo));
      }
    TT_CUDA_CHECK(cudaEventRecord(lo_done, s_lo));
    if (mode == 2) {
      TT_CUDA_CHECK(cudaStreamWaitEvent(s_hi, lo_done, 0));
      for (int gi = 0; gi <= kLayers; ++gi)
        tt::cuda::adamw_update(param.data(), pb.data(), grad.data(), m.data(), v.data(),
                               d_chunks.data() + range[gi].first, range[gi].second, p, nullptr, s_hi);
    }
    if (mode != 1)
      for (int l = 0; l < kLayers; ++l) {
        if (mode == 3 && l == 0) TT_CUDA_CHECK(cudaStreamWaitEvent(s_hi, ready[0], 0));
        if (mode == 3) TT_CUDA_CHECK(cudaStreamWaitEvent(s_hi, ready[l + 1], 0));
        layer_gemms();
      }
    TT_CUDA_CHECK(cudaStreamWaitEvent(s_hi, lo_done, 0));
    TT_CUDA_CHECK(cudaEventRecord(t1, s_hi));
    TT_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return (double)ms;
  };
  const char* names[] = {"forward GEMMs alone", "AdamW alone", "AdamW then forward", "AdamW overlapped"};
  std::vector<std::vector<double>> t(4);
  for (int rep = 0; rep < 7; ++rep)
    for (int mode = 0; mode < 4; ++mode) t[mode].push_back(run(mode));
  std::vector<double> med(4);
  for (int mode = 0; mode < 4; ++mode) {
    std::sort(t[mode].begin() + 2, t[mode].end());
    med[mode] = t[mode][2 + (t[mode].size() - 2) / 2];
    std::printf("overlap: %-22s %8.3f ms\n", names[mode], med[mode]);
  }
  std::printf("overlap: AdamW hidden %.1f%% (serial - overlapped) / AdamW alone\n",
              100 * (med[2] - med[3]) / med[1]);
  for (auto& e : ready) TT_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaEvent_t e : {t0, t1, start, lo_done}) TT_CUDA_CHECK(cudaEventDestroy(e));
  TT_CUDA_CHECK(cudaStreamDestroy(s_hi));
  TT_CUDA_CHECK(cudaStreamDestroy(s_lo));
}

// The layer GEMMs (seven projections: forward, dx and dW+=) at several token counts: does the
// rate depend on N (wave quantization)? Four weight sets in turn, so weights do not stay in L2.
void bench_gemm_tokens() {
  tt::cuda::GemmHandle h(g_stream);
  const int QD = kHeads * kHeadDim, KD = kKvHeads * kHeadDim;
  struct Lin {
    int IC, OC;
  };
  const Lin lins[] = {{kHidden, QD}, {kHidden, KD}, {kHidden, KD}, {QD, kHidden},
                      {kHidden, kInter}, {kHidden, kInter}, {kInter, kHidden}};
  const int maxN = 17536, sets = 4;
  DeviceBuffer<bf16> x((size_t)maxN * kInter), dout((size_t)maxN * kInter), y((size_t)maxN * kInter);
  std::vector<DeviceBuffer<bf16>> w;
  std::vector<DeviceBuffer<float>> dw;
  for (int i = 0; i < sets * 7; ++i) {
    w.emplace_back((size_t)kInter * kHidden);
    dw.emplace_back((size_t)kInter * kHidden);
    fill_random(w.back().data(), w.back().size(), 0.02f, 30 + i);
    TT_CUDA_CHECK(cudaMemset(dw.back().data(), 0, dw.back().bytes()));
  }
  fill_random(x.data(), x.size(), 1.f, 20);
  fill_random(dout.data(), dout.size(), 1.f, 21);
  for (int N : {14720, 15168, 15872, 16384, 17536, 13568, 8192}) {
    double flops = 0;
    for (const Lin& l : lins) flops += 3 * 2.0 * N * l.IC * l.OC;
    int set = 0;
    for (int part = 0; part < 3; ++part) {
      const char* nm[] = {"layer GEMMs fwd", "layer GEMMs dx", "layer GEMMs dW+="};
      report_flops(nm[part], "N=" + std::to_string(N), flops / 3, [&] {
        for (int i = 0; i < 7; ++i) {
          const Lin& l = lins[i];
          const int k = set * 7 + i;
          if (part == 0) tt::cuda::matmul_forward(h, y.data(), x.data(), w[k].data(), N, l.IC, l.OC);
          if (part == 1) tt::cuda::matmul_backward_dx(h, y.data(), dout.data(), w[k].data(), N, l.IC, l.OC, 0.f);
          if (part == 2) tt::cuda::matmul_backward_dw(h, dw[k].data(), dout.data(), x.data(), N, l.IC, l.OC, 1.f);
        }
        set = (set + 1) % sets;
      }, 24);
    }
  }
}

// cuBLASLt's candidate algorithms for the layer GEMMs at a few token counts: each of the
// heuristic's first 16 timed (median of 15 calls over four operand sets), printed with its
// configuration (algo id, tile, stages, split-k, swizzle, cluster): which choice the heuristic
// makes, and how far from the fastest candidate it is.
void bench_gemm_algos(const std::vector<int>& tokens) {
  cublasLtHandle_t lt = nullptr;
  TT_CUBLAS_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(32) << 20;
  DeviceBuffer<char> ws(ws_bytes);
  const int QD = kHeads * kHeadDim, KD = kKvHeads * kHeadDim;
  struct Lin {
    const char* name;
    int IC, OC;
  };
  const Lin lins[] = {
      {"q/o", kHidden, QD}, {"k/v", kHidden, KD}, {"gate/up", kHidden, kInter}, {"down", kInter, kHidden}};
  const int maxN = 17536, sets = 4;
  DeviceBuffer<bf16> x((size_t)maxN * kInter), dout((size_t)maxN * kInter), y((size_t)maxN * kInter);
  std::vector<DeviceBuffer<bf16>> w;
  DeviceBuffer<float> dw((size_t)kInter * kHidden * sets);
  for (int i = 0; i < sets; ++i) {
    w.emplace_back((size_t)kInter * kHidden);
    fill_random(w.back().data(), w.back().size(), 0.02f, 40 + i);
  }
  fill_random(x.data(), x.size(), 1.f, 20);
  fill_random(dout.data(), dout.size(), 1.f, 21);
  TT_CUDA_CHECK(cudaMemset(dw.data(), 0, dw.bytes()));
  double sum_first = 0, sum_best = 0;
  for (int N : tokens) {
    for (const Lin& l : lins) {
      for (int kind = 0; kind < 3; ++kind) {  // 0 forward, 1 dx, 2 dW+=
        // Column-major forms as in ops/cuda/gemm.cc.
        int m, n, k;
        cublasOperation_t ta, tb;
        if (kind == 0) m = l.OC, n = N, k = l.IC, ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        else if (kind == 1) m = l.IC, n = N, k = l.OC, ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
        else m = l.IC, n = l.OC, k = N, ta = CUBLAS_OP_N, tb = CUBLAS_OP_T;
        const int lda = kind == 0 ? l.IC : l.IC, ldb = kind == 0 ? l.IC : (kind == 1 ? l.OC : l.OC), ldd = m;
        const cudaDataType_t dt = kind == 2 ? CUDA_R_32F : CUDA_R_16BF;
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t la, lb, ld;
        TT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        TT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        TT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        const bool an = ta == CUBLAS_OP_N, bn = tb == CUBLAS_OP_N;
        TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, an ? m : k, an ? k : m, lda));
        TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, bn ? k : n, bn ? n : k, ldb));
        TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd));
        cublasLtMatmulPreference_t pref;
        TT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t wsb = ws_bytes;
        TT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                             sizeof(wsb)));
        cublasLtMatmulHeuristicResult_t res[16];
        int count = 0;
        TT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, res, &count));
        const float alpha = 1.f, beta = kind == 2 ? 1.f : 0.f;
        std::vector<double> ms(count, 1e30);
        for (int round = 0; round < 2; ++round)
          for (int a = 0; a < count; ++a) {
            if (res[a].state != CUBLAS_STATUS_SUCCESS) continue;
            int set = 0;
            const double t = median_ms([&] {
              const bf16* A = kind == 2 ? x.data() : w[set].data();
              const bf16* B = kind == 2 ? dout.data() : (kind == 0 ? x.data() : dout.data());
              void* D = kind == 2 ? (void*)(dw.data() + (size_t)set * kInter * kHidden) : (void*)y.data();
              TT_CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[a].algo,
                                             ws.data(), ws_bytes, g_stream));
              set = (set + 1) % sets;
            }, 2, 15);
            ms[a] = std::min(ms[a], t);
          }
        int best = 0;
        for (int a = 1; a < count; ++a)
          if (ms[a] < ms[best]) best = a;
        auto cfg = [&](int a) {
          int id = 0, tile = 0, stages = 0, splitk = 0, swz = 0, cluster = 0;
          size_t sz;
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages),
                                               &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk),
                                               &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz),
                                               &sz);
          cublasLtMatmulAlgoConfigGetAttribute(&res[a].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                               sizeof(cluster), &sz);
          char b[96];
          std::snprintf(b, sizeof(b), "algo %d tile %d stages %d splitk %d swz %d cluster %d", id, tile, stages,
                        splitk, swz, cluster);
          return std::string(b);
        };
        const double flops = 2.0 * N * l.IC * l.OC;
        const char* kn[] = {"fwd", "dx", "dW"};
        std::printf("algos N=%d %-8s %-3s n=%2d first %.3f ms %.0f TF/s [%s]  best #%d %.3f ms %.0f TF/s [%s]\n", N,
                    l.name, kn[kind], count, ms[0], flops / ms[0] / 1e9, cfg(0).c_str(), best, ms[best],
                    flops / ms[best] / 1e9, cfg(best).c_str());
        std::fflush(stdout);
        const int mult = l.IC == kInter ? 1 : 2;  // q and o (both 2048 x 2048), k and v, gate and up
        sum_first += mult * ms[0];
        sum_best += mult * ms[best];
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatmulDescDestroy(desc);
      }
    }
    std::printf("algos N=%d: one layer's GEMMs: heuristic %.3f ms, best candidates %.3f ms (%.3fx)\n", N, sum_first,
                sum_best, sum_first / sum_best);
    sum_first = sum_best = 0;
  }
  cublasLtDestroy(lt);
}

// The gated delta rule's chunked forward (ops/cuda/gdn.h) at issue 15's benchmark shape: 32k
// tokens, 32 value heads of 128 (16 key heads), as one sequence, a GRPO group (a 2,048-token
// prompt and 16 responses of 1,920), a comb (a 1,024-token prefix, 64 steps of a 128-token
// history node with a 256-token leaf) and two packs of separate sequences, 4 x 8,192 and 8 x 4,096
// (FlashQLA's varlen figures, which it computes exactly; for one sequence it walks 16 segments side
// by side, each entering state from the segment before's last chunks only, back to where the
// gates' decay passes e^-10: docs/BENCHMARKS.md), forward and backward. FLOPs: the layer kind's
// model count, 4 dk dv multiply-adds per token and value head (twice that for the backward).
// `mode` ("exact", "bf16" or empty for both) picks the product modes timed, so ncu can profile one
// mode's launches.
void bench_gdn(const std::string& mode_only) {
  const int nk = 16, nv = 32, dk = 128, dv = 128;
  struct Tree {
    std::string name;
    std::vector<int32_t> start, len, parent;
    int N = 0;
    void add(int p, int l) {
      start.push_back(N);
      len.push_back(l);
      parent.push_back(p);
      N += l;
    }
  };
  std::vector<Tree> trees(5);
  trees[0].name = "one sequence";
  trees[0].add(-1, 32768);
  trees[1].name = "GRPO 2048 + 16 x 1920";
  trees[1].add(-1, 2048);
  for (int i = 0; i < 16; ++i) trees[1].add(0, 1920);
  trees[2].name = "comb 1024 + 64 x (128 + 256)";
  trees[2].add(-1, 1024);
  for (int i = 0, h = 0; i < 64; ++i) {
    trees[2].add(h, 128);
    h = (int)trees[2].start.size() - 1;
    trees[2].add(h, 256);
  }
  trees[3].name = "4 x 8192";
  trees[4].name = "8 x 4096";
  for (int i = 0; i < 4; ++i) trees[3].add(-1, 8192);
  for (int i = 0; i < 8; ++i) trees[4].add(-1, 4096);
  for (const Tree& t : trees) {
    const int N = t.N;
    tt::cuda::GdnPlan plan;
    plan.make(t.start.data(), t.len.data(), t.parent.data(), (int)t.start.size());
    DeviceBuffer<char> tables(plan.table_bytes());
    plan.upload(tables.data(), g_stream);
    // The bf16 walks' launches: one a level of paths (GdnPlan::levels), the paths of a level side by side.
    std::string paths;
    for (const tt::cuda::GdnPlan::Level& l : plan.levels())
      paths += (paths.empty() ? "" : ", ") + std::to_string(l.paths) + " of " + std::to_string(l.max_path_chunks) +
               " chunks at most";
    std::printf("gdn %s: %d chunks, %zu levels of paths (%s)\n", t.name.c_str(), plan.num_chunks(),
                plan.levels().size(), paths.c_str());
    DeviceBuffer<bf16> q((size_t)N * nk * dk), k((size_t)N * nk * dk), v((size_t)N * nv * dv), beta((size_t)N * nv),
        o((size_t)N * nv * dv);
    DeviceBuffer<float> g((size_t)N * nv);  // fp32 log decays
    fill_random(q.data(), q.size(), 0.09f, 31);  // about unit rows of 128
    fill_random(k.data(), k.size(), 0.09f, 32);
    fill_random(v.data(), v.size(), 1.f, 33);
    fill_random(g.data(), g.size(), 0.05f, 34);   // small log decays of either sign: timing only
    fill_random(beta.data(), beta.size(), 0.5f, 35);
    DeviceBuffer<char> ws(tt::cuda::gdn_forward_workspace_bytes(plan, nv, dk, dv, false));
    DeviceBuffer<bf16> d_o((size_t)N * nv * dv), gq(q.size()), gk(k.size()), gv(v.size());
    DeviceBuffer<float> gg(g.size()), gb(beta.size());
    fill_random(d_o.data(), d_o.size(), 1.f, 36);
    DeviceBuffer<char> wsb(tt::cuda::gdn_backward_workspace_bytes(plan, nv, dk, dv));
    // Both product modes of the walks (ops/cuda/gdn.h GdnProducts), side by side.
    for (const tt::cuda::GdnProducts products : {tt::cuda::GdnProducts::kExact, tt::cuda::GdnProducts::kBf16}) {
      const bool bf16_products = products == tt::cuda::GdnProducts::kBf16;
      if (!mode_only.empty() && mode_only != (bf16_products ? "bf16" : "exact")) continue;
      const std::string mode = bf16_products ? ", bf16 products" : "";
      report_flops("gdn_forward (" + t.name + mode + ")", dims({N, nv, dk}), 2.0 * 4 * N * nv * (double)dk * dv, [&] {
        tt::cuda::gdn_forward(o.data(), nullptr, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, plan,
                              nk, nv, dk, dv, 1.0 / std::sqrt((double)dk), tt::cuda::Workspace{ws.data(), ws.size()},
                              g_stream, products);
      }, 5);
      report_flops("gdn_backward (" + t.name + mode + ")", dims({N, nv, dk}), 2.0 * 2 * 4 * N * nv * (double)dk * dv,
                   [&] {
                     tt::cuda::gdn_backward(gq.data(), gk.data(), gv.data(), gg.data(), gb.data(), nullptr, d_o.data(),
                                            nullptr, q.data(), k.data(), v.data(), g.data(), beta.data(), nullptr, plan,
                                            nk, nv, dk, dv, 1.0 / std::sqrt((double)dk),
                                            tt::cuda::Workspace{wsb.data(), wsb.size()}, g_stream,
                                            /*accumulate=*/false, products);
                   }, 3);
    }
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
    if (want("rope") || want("qk_norm_rope")) bench_qk_norm_rope();
    if (want("swiglu")) bench_swiglu();
    if (want("cross_entropy")) bench_cross_entropy();
    if (want("adamw")) bench_adamw();
    if (want("gemm")) bench_gemm();
    if (only == "overlap") bench_overlap();
    if (only == "gemm_tokens") bench_gemm_tokens();
    if (only == "gemm_algos") bench_gemm_algos({14720, 15872, 17536, 13568});
    if (only == "gdn") {
      const std::string mode = argc > 2 ? argv[2] : "";
      if (mode != "" && mode != "exact" && mode != "bf16")
        throw std::runtime_error("gdn: expected the product mode 'exact' or 'bf16' (or none: both), got '" + mode + "'");
      bench_gdn(mode);
    }
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
