// cuBLASLt GEMMs of a Linear layer (see gemm.h).
// Gradient contract: matmul_forward overwrites out; matmul_backward accumulates (+=) into dx and
// dW; the _dx/_dw entry points overwrite (beta 0) or accumulate (beta 1).
//
// Row-major tensors are column-major transposes, so each product is written for cuBLAS as the
// transposed one (m, n, k of the column-major call; "ld" leading dimensions):
//   out^T (OC, N)  = W (IC, OC)^T  x^T (IC, N)        m=OC n=N  k=IC  A=W op T, B=x op N
//   dx^T  (IC, N)  = W (IC, OC)    dout^T (OC, N)     m=IC n=N  k=OC  A=W op N, B=dout op N
//   dW^T  (IC, OC) = x^T (IC, N)   dout (N, OC)       m=IC n=OC k=N   A=x op N, B=dout op T
// A plan is cached per (shape, output type, pointer alignments): cuBLASLt's heuristic assumes
// 256-byte-aligned pointers unless told otherwise, so the alignments are part of the key.
#include "ops/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

#include "ops/cuda/gemv.h"
#include "ops/cuda/check.h"
#include "ops/cuda/memory.h"

namespace tt::cuda {
namespace {

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using PlanKey = std::array<int64_t, 12>;

// Autotuning (GemmHandle::set_autotune): the heuristic's first kTuneCandidates algorithms, timed
// on the call's own operands into a scratch output when that output is at most
// kTuneMaxOutputBytes and the product at most kTuneMaxFlops (larger products, such as the LM
// head's, keep the heuristic's first).
constexpr int kTuneCandidates = 8;
constexpr int kTuneRounds = 2;
constexpr int kTuneCalls = 3;
constexpr size_t kTuneMaxOutputBytes = size_t(256) << 20;
// Products above 2^40 FLOPs (the LM head's backward over many target rows: ~9 ms each, so ~0.6 s
// of timing calls per bucket) keep the heuristic's first: at that size it runs near peak anyway.
constexpr double kTuneMaxFlops = 1099511627776.0;

using TuneKey = std::array<int64_t, 10>;
static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmTuned::algo), "cublasLtMatmulAlgo_t is 8 uint64_t");

uint32_t alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (u & (a - 1)) != 0) a /= 2;
  return a;
}

void destroy(Plan& p) {
  if (p.d) cublasLtMatrixLayoutDestroy(p.d);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

}  // namespace

struct GemmHandle::Impl {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  std::map<PlanKey, Plan> plans;
  bool autotune = false;
  DeviceBuffer<char> scratch;  // the timing calls' output (autotune), grown to the largest D timed
  GemmTuneStats stats;
  std::map<TuneKey, cublasLtMatmulAlgo_t> table;    // the tuning table (GemmTuned)
  std::map<TuneKey, cublasLtMatmulAlgo_t> pending;  // winners not adopted yet (take_pending)
  std::map<TuneKey, cublasLtMatmulAlgo_t> hints;    // winners known from an earlier run (set_hints)

  // The table's algorithm for a shape (its exact entry, else its bucket's), when cuBLASLt accepts
  // it for this shape within the workspace.
  bool from_table(const Plan& p, const TuneKey& exact, const TuneKey& bucket, cublasLtMatmulAlgo_t* algo) {
    for (const TuneKey& key : {exact, bucket}) {
      auto it = table.find(key);
      if (it == table.end()) continue;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(lt, p.desc, p.a, p.b, p.d, p.d, &it->second, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= workspace_bytes) {
        *algo = it->second;
        return true;
      }
    }
    return false;
  }

  // Times the candidates on a and b into scratch (beta 0): kTuneRounds rounds in turn, each
  // kTuneCalls calls after one warm-up call; the fastest mean of a round wins. Returns its index.
  int fastest(const GemmShape& s, const Plan& p, const cublasLtMatmulHeuristicResult_t* cand, int n, const bf16* a,
              const bf16* b, size_t d_bytes) {
    if (d_bytes > scratch.size()) {
      scratch = DeviceBuffer<char>();  // the old one goes first
      scratch = DeviceBuffer<char>(d_bytes);
    }
    void* out = scratch.data();
    cudaEvent_t ev[2];
    TT_CUDA_CHECK(cudaEventCreate(&ev[0]));
    TT_CUDA_CHECK(cudaEventCreate(&ev[1]));
    std::vector<float> best(n, 1e30f);
    const float one = 1.f, zero = 0.f;
    for (int round = 0; round < kTuneRounds; ++round)
      for (int i = 0; i < n; ++i) {
        if (cand[i].state != CUBLAS_STATUS_SUCCESS) continue;
        auto call = [&] {
          return cublasLtMatmul(lt, p.desc, &one, a, p.a, b, p.b, &zero, out, p.d, out, p.d, &cand[i].algo, workspace,
                                workspace_bytes, stream);
        };
        if (call() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate cuBLASLt cannot run here: skipped
        TT_CUDA_CHECK(cudaEventRecord(ev[0], stream));
        for (int c = 0; c < kTuneCalls; ++c) TT_CUBLAS_CHECK(call());
        TT_CUDA_CHECK(cudaEventRecord(ev[1], stream));
        TT_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        float ms = 0;
        TT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        best[i] = std::min(best[i], ms / kTuneCalls);
      }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    const int pick = (int)(std::min_element(best.begin(), best.end()) - best.begin());
    TT_CHECK(best[pick] < 1e30f, "cuda::GemmHandle: no cuBLASLt candidate ran for m=", s.m, " n=", s.n, " k=", s.k);
    ++stats.tuned_plans;
    if (pick != 0) ++stats.changed_plans;
    stats.heuristic_ms += best[0] < 1e30f ? best[0] : best[pick];
    stats.tuned_ms += best[pick];
    return pick;
  }

  const Plan& plan(const GemmShape& s, uint32_t align_a, uint32_t align_b, uint32_t align_d, const bf16* a,
                   const bf16* b) {
    const PlanKey key{s.m, s.n, s.k, (int64_t)s.op_a, (int64_t)s.op_b, s.lda, s.ldb, s.ldd, (int64_t)s.out,
                      align_a, align_b, align_d};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    try {
      TT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = s.op_a == GemmOp::kT ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t tb = s.op_b == GemmOp::kT ? CUBLAS_OP_T : CUBLAS_OP_N;
      TT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      TT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      const bool an = s.op_a == GemmOp::kN, bn = s.op_b == GemmOp::kN;
      TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, an ? s.m : s.k, an ? s.k : s.m, s.lda));
      TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, bn ? s.k : s.n, bn ? s.n : s.k, s.ldb));
      const cudaDataType_t dt = s.out == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
      TT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, s.m, s.n, s.ldd));

      cublasLtMatmulPreference_t pref = nullptr;
      TT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t ws = workspace_bytes;
      int count = 0;
      cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                               sizeof(ws));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                  sizeof(align_a));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                  sizeof(align_b));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                  sizeof(align_d));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                  sizeof(align_d));
      cublasLtMatmulHeuristicResult_t cand[kTuneCandidates];
      const size_t d_bytes = (size_t)s.ldd * s.n * (s.out == GemmOut::kBf16 ? 2 : 4);
      const bool tune =
          autotune && d_bytes <= kTuneMaxOutputBytes && 2.0 * (double)s.m * (double)s.n * (double)s.k <= kTuneMaxFlops;
      const TuneKey exact{s.m, s.n, s.k, (int64_t)s.op_a, (int64_t)s.op_b, (int64_t)s.out, align_a, align_b, align_d, 1};
      const TuneKey bucket{gemm_tune_bucket(s.m), gemm_tune_bucket(s.n), gemm_tune_bucket(s.k), (int64_t)s.op_a,
                           (int64_t)s.op_b, (int64_t)s.out, align_a, align_b, align_d, 0};
      if (st == CUBLAS_STATUS_SUCCESS && tune && from_table(p, exact, bucket, &p.algo)) {
        cublasLtMatmulPreferenceDestroy(pref);
        ++stats.reused_plans;
        return plans.emplace(key, p).first->second;
      }
      // The key a winner of this shape goes under: its bucket's, or its own where the table's
      // entry for the bucket is refused for it. Timed once: a pending or hinted winner stands.
      const TuneKey entry = table.count(bucket) ? exact : bucket;
      // Pending already, or adopted but refused for this shape (the exact key leaves out the
      // leading dimensions): the heuristic's first, without timing again.
      const bool known = pending.count(entry) > 0 || table.count(entry) > 0;
      auto hint = hints.find(entry);
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.d, p.d, pref, tune ? kTuneCandidates : 1, cand,
                                            &count);
      cublasLtMatmulPreferenceDestroy(pref);
      TT_CUBLAS_CHECK(st);
      TT_CHECK(count > 0, "cuda::GemmHandle: cuBLASLt has no algorithm for m=", s.m, " n=", s.n, " k=", s.k,
               " lda=", s.lda, " ldb=", s.ldb, " ldd=", s.ldd, " alignments ", align_a, "/", align_b, "/",
               align_d);
      p.algo = cand[0].algo;  // until the caller adopts a winner, the heuristic's first runs
      if (tune && !known) {
        if (hint != hints.end()) {
          pending.emplace(entry, hint->second);
          ++stats.hinted_plans;
        } else if (count > 1) {
          // Queued work first, so that tune_s counts the timing calls only (it waits on them anyway).
          TT_CUDA_CHECK(cudaStreamSynchronize(stream));
          const auto t0 = std::chrono::steady_clock::now();
          pending.emplace(entry, cand[fastest(s, p, cand, count, a, b, d_bytes)].algo);
          stats.tune_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        } else {
          pending.emplace(entry, cand[0].algo);
        }
      }
    } catch (...) {
      destroy(p);
      throw;
    }
    return plans.emplace(key, p).first->second;
  }
};

GemmHandle::GemmHandle(cudaStream_t stream, size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->workspace_bytes = workspace_bytes;
  TT_CUBLAS_CHECK(cublasLtCreate(&impl_->lt));
  if (workspace_bytes) {
    cudaError_t err = cudaMalloc(&impl_->workspace, workspace_bytes);
    if (err != cudaSuccess) {
      cublasLtDestroy(impl_->lt);
      TT_CUDA_CHECK(err);
    }
  }
}

GemmHandle::~GemmHandle() {
  for (auto& [key, plan] : impl_->plans) destroy(plan);
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->lt) cublasLtDestroy(impl_->lt);
}

cudaStream_t GemmHandle::stream() const { return impl_->stream; }
void GemmHandle::set_stream(cudaStream_t stream) { impl_->stream = stream; }
int GemmHandle::num_plans() const { return (int)impl_->plans.size(); }
void GemmHandle::set_autotune(bool on) { impl_->autotune = on; }
bool GemmHandle::autotune() const { return impl_->autotune; }
GemmTuneStats GemmHandle::tune_stats() const { return impl_->stats; }

namespace {

using AlgoMap = std::map<TuneKey, cublasLtMatmulAlgo_t>;

std::vector<GemmTuned> entries_of(const AlgoMap& m) {
  std::vector<GemmTuned> out;
  for (const auto& [key, algo] : m) {
    GemmTuned t;
    t.key = key;
    std::memcpy(t.algo.data(), &algo, sizeof(algo));
    out.push_back(t);
  }
  return out;
}

AlgoMap map_of(const std::vector<GemmTuned>& entries) {
  AlgoMap m;
  for (const GemmTuned& t : entries) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, t.algo.data(), sizeof(algo));
    m[t.key] = algo;
  }
  return m;
}

}  // namespace

std::vector<GemmTuned> GemmHandle::tuned() const { return entries_of(impl_->table); }

void GemmHandle::set_hints(const std::vector<GemmTuned>& hints) { impl_->hints = map_of(hints); }

std::vector<GemmTuned> GemmHandle::take_pending() {
  std::vector<GemmTuned> out = entries_of(impl_->pending);
  impl_->pending.clear();
  return out;
}

void GemmHandle::set_tuned(const std::vector<GemmTuned>& table) {
  impl_->table = map_of(table);
  // Plans cached so far may hold other algorithms: rebuilt on their next call. (cuBLASLt reads a
  // descriptor when a call is enqueued, so calls in flight do not need them.)
  for (auto& [key, plan] : impl_->plans) destroy(plan);
  impl_->plans.clear();
}

std::string gemm_tuning_signature() {
  int dev = 0;
  TT_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  TT_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  return str("cublasLt ", cublasLtGetVersion(), ", ", prop.name, ", sm_", prop.major, prop.minor, ", ",
             prop.multiProcessorCount, " SMs");
}

void GemmHandle::run(const GemmShape& s, const bf16* a, const bf16* b, void* d, float alpha, float beta) {
  TT_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "cuda::GemmHandle::run: expected positive m, n, k, got m=", s.m, " n=", s.n,
           " k=", s.k);
  const bool an = s.op_a == GemmOp::kN, bn = s.op_b == GemmOp::kN;
  TT_CHECK(s.lda >= (an ? s.m : s.k) && s.ldb >= (bn ? s.k : s.n) && s.ldd >= s.m,
           "cuda::GemmHandle::run: leading dimensions too small: lda=", s.lda, " ldb=", s.ldb, " ldd=", s.ldd,
           " for m=", s.m, " n=", s.n, " k=", s.k);
  TT_CHECK(a && b && d, "cuda::GemmHandle::run: null pointer (A, B or D)");
  const Plan& p = impl_->plan(s, alignment(a), alignment(b), alignment(d), a, b);
  TT_CUBLAS_CHECK(cublasLtMatmul(impl_->lt, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &p.algo,
                                 impl_->workspace, impl_->workspace_bytes, impl_->stream));
}

namespace {

void check_linear(int N, int IC, int OC, const char* op) {
  TT_CHECK(N >= 0 && IC > 0 && OC > 0, op, ": expected N >= 0, IC > 0, OC > 0, got N=", N, " IC=", IC, " OC=", OC);
}

GemmShape forward_shape(int N, int IC, int OC, GemmOut out) {
  GemmShape s;
  s.m = OC, s.n = N, s.k = IC;
  s.op_a = GemmOp::kT, s.op_b = GemmOp::kN;
  s.lda = IC, s.ldb = IC, s.ldd = OC;
  s.out = out;
  return s;
}

GemmShape dx_shape(int N, int IC, int OC, GemmOut out) {
  GemmShape s;
  s.m = IC, s.n = N, s.k = OC;
  s.op_a = GemmOp::kN, s.op_b = GemmOp::kN;
  s.lda = IC, s.ldb = OC, s.ldd = IC;
  s.out = out;
  return s;
}

}  // namespace

void matmul_forward(GemmHandle& h, bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC) {
  check_linear(N, IC, OC, "cuda::matmul_forward");
  if (N == 0) return;
  if (gemv_supported(x, w, N, IC)) return gemv_forward(out, x, w, N, IC, OC, h.stream());
  h.run(forward_shape(N, IC, OC, GemmOut::kBf16), w, x, out, 1.f, 0.f);
}

void matmul_forward(GemmHandle& h, float* out, const bf16* x, const bf16* w, int N, int IC, int OC) {
  check_linear(N, IC, OC, "cuda::matmul_forward");
  if (N == 0) return;
  if (gemv_supported(x, w, N, IC)) return gemv_forward(out, x, w, N, IC, OC, h.stream());
  h.run(forward_shape(N, IC, OC, GemmOut::kF32), w, x, out, 1.f, 0.f);
}

void matmul_backward_dx(GemmHandle& h, bf16* dx, const bf16* dout, const bf16* w, int N, int IC, int OC,
                        float beta) {
  check_linear(N, IC, OC, "cuda::matmul_backward_dx");
  if (N == 0) return;
  h.run(dx_shape(N, IC, OC, GemmOut::kBf16), w, dout, dx, 1.f, beta);
}

void matmul_backward_dx(GemmHandle& h, float* dx, const bf16* dout, const bf16* w, int N, int IC, int OC,
                        float beta) {
  check_linear(N, IC, OC, "cuda::matmul_backward_dx");
  if (N == 0) return;
  h.run(dx_shape(N, IC, OC, GemmOut::kF32), w, dout, dx, 1.f, beta);
}

void matmul_backward_dw(GemmHandle& h, float* dw, const bf16* dout, const bf16* x, int N, int IC, int OC,
                        float beta) {
  check_linear(N, IC, OC, "cuda::matmul_backward_dw");
  if (N == 0) {  // an empty sum: dw = beta * dw
    TT_CHECK(beta == 0.f || beta == 1.f, "cuda::matmul_backward_dw: N=0 supports beta 0 or 1, got ", beta);
    if (beta == 0.f) TT_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * (size_t)IC * OC, h.stream()));
    return;
  }
  GemmShape s;
  s.m = IC, s.n = OC, s.k = N;
  s.op_a = GemmOp::kN, s.op_b = GemmOp::kT;
  s.lda = IC, s.ldb = OC, s.ldd = IC;
  s.out = GemmOut::kF32;
  h.run(s, x, dout, dw, 1.f, beta);
}

void matmul_backward(GemmHandle& h, bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int N,
                     int IC, int OC) {
  if (dx) matmul_backward_dx(h, dx, dout, w, N, IC, OC, 1.f);
  if (dw) matmul_backward_dw(h, dw, dout, x, N, IC, OC, 1.f);
}

}  // namespace tt::cuda
