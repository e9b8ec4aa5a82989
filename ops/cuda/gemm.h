// GEMMs of a Linear layer through cuBLASLt, with W in Hugging Face layout (OC, IC):
//   forward       out (N, OC) = x (N, IC) @ W^T                 bf16 or fp32 out, overwritten
//   input grad    dx  (N, IC) = beta * dx + dout (N, OC) @ W     bf16
//   weight grad   dW  (OC, IC) = beta * dW + dout^T @ x          fp32 (the master-gradient buffer)
// bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F). Gradient contract of matmul_backward
// (as ops/cpu/matmul.h): dx and dW are accumulated (+=), either may be null to skip it; the
// _dx/_dw entry points take beta (0 overwrites, 1 accumulates).
//
// Accumulating into a bf16 output (beta != 0) rounds twice on Hopper: cuBLASLt's kernels round
// the product to bf16 before adding beta * C (measured on an H200: up to two bf16 half-ulps, where
// beta = 0 with the same algorithm stays within one). Where that matters, accumulate into an
// fp32 dx (the float overload) or compute the sum in one GEMM (concatenated weights).
//
// GemmHandle owns the cuBLASLt handle, one workspace and the stream the GEMMs run on, and caches
// a plan (matmul descriptor, layouts, heuristic algorithm) per shape and pointer alignment, so the
// steady state does no descriptor or heuristic work. Not thread-safe: one handle per stream.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda/bf16.h"
#include "ops/cuda/gemm_tuned.h"

namespace tt::cuda {

enum class GemmOp { kN, kT };
enum class GemmOut { kBf16, kF32 };

// One cuBLASLt call in column-major terms: D (m, n) = alpha op(A) op(B) + beta D, with A stored
// (m, k) or (k, m) column-major with leading dimension lda (op N or T), likewise B, D (m, n) ldd.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  GemmOp op_a = GemmOp::kN, op_b = GemmOp::kN;
  int64_t lda = 0, ldb = 0, ldd = 0;
  GemmOut out = GemmOut::kBf16;
};

// What autotuning did so far (GemmHandle::tune_stats): plans timed, plans where a candidate other
// than the heuristic's first won, and the summed per-call times of the heuristic's choice and of
// the winner over the timed plans.
// reused_plans: plans whose algorithm came from the tuning table without timing; hinted_plans:
// pending winners taken from a hint instead of timing; tune_s: wall time spent timing candidates.
struct GemmTuneStats {
  int tuned_plans = 0, changed_plans = 0, reused_plans = 0, hinted_plans = 0;
  double heuristic_ms = 0, tuned_ms = 0;
  double tune_s = 0;
};

// "cublasLt <version>, <GPU name>, sm_<major><minor>, <SMs> SMs" of the current device: a table
// tuned under another signature is not to be restored.
std::string gemm_tuning_signature();

class GemmHandle {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = size_t(32) << 20;  // cuBLAS's advice for Hopper

  // The stream is not owned: it stays the caller's; the handle creates its workspace here.
  explicit GemmHandle(cudaStream_t stream = nullptr, size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  cudaStream_t stream() const;
  void set_stream(cudaStream_t stream);
  int num_plans() const;  // cached plans so far

  // Autotuning, off by default: a new plan times the heuristic's first 8 algorithms on the call's
  // own operands (into a scratch output of the handle, so the call's output is written once, as
  // without tuning) and keeps the fastest. The choice depends on timings, so two runs may pick
  // different algorithms and differ in rounding; the first call of each shape takes ~50 products
  // longer, and the scratch output (up to 256 MiB) stays allocated with the handle. Products of
  // more than 2^40 FLOPs or outputs over 256 MiB (the LM head's) are not timed.
  //
  // With autotuning on, winners are kept in a tuning table by bucket (GemmTuned), and a new shape
  // of a bucket in the table takes its algorithm without timing, so a run tunes once per
  // token-count bucket. A winner is pending until the caller adopts it: the call that timed it,
  // and every call of its bucket until then, run the heuristic's first algorithm (so what a
  // computation rounds like never depends on timing noise: data-parallel ranks agree on the
  // winners between steps, and a resumed run repeats the interrupted one). take_pending() hands
  // the winners over (and forgets them); set_tuned replaces the table (cached plans are rebuilt
  // on their next call); a hint (set_hints: a winner known from an earlier run of the same
  // steps) is taken as the pending winner of its bucket instead of timing. tuned() is the table,
  // sorted by key. With autotuning off neither table nor hints are used.
  void set_autotune(bool on);
  bool autotune() const;
  GemmTuneStats tune_stats() const;
  std::vector<GemmTuned> tuned() const;
  void set_tuned(const std::vector<GemmTuned>& table);
  void set_hints(const std::vector<GemmTuned>& hints);
  std::vector<GemmTuned> take_pending();

  // D = alpha op(A) op(B) + beta D (see GemmShape). A, B bf16; D bf16 or fp32 per shape.out.
  void run(const GemmShape& shape, const bf16* a, const bf16* b, void* d, float alpha, float beta);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// out (N, OC) = x (N, IC) @ w (OC, IC)^T; overwritten. Up to kGemvMaxRows rows (a decode step)
// with IC % 8 == 0 and 16-byte aligned x, w go to gemv_forward (gemv.h) instead of cuBLASLt.
void matmul_forward(GemmHandle& h, bf16* out, const bf16* x, const bf16* w, int N, int IC, int OC);
void matmul_forward(GemmHandle& h, float* out, const bf16* x, const bf16* w, int N, int IC, int OC);

// dx (N, IC) = beta * dx + dout (N, OC) @ w (OC, IC); bf16 or fp32 dx.
void matmul_backward_dx(GemmHandle& h, bf16* dx, const bf16* dout, const bf16* w, int N, int IC, int OC,
                        float beta);
void matmul_backward_dx(GemmHandle& h, float* dx, const bf16* dout, const bf16* w, int N, int IC, int OC,
                        float beta);

// dw (OC, IC) fp32 = beta * dw + dout (N, OC)^T @ x (N, IC).
void matmul_backward_dw(GemmHandle& h, float* dw, const bf16* dout, const bf16* x, int N, int IC, int OC,
                        float beta);

// dx += dout @ w; dw += dout^T @ x; either may be null to skip it.
void matmul_backward(GemmHandle& h, bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, int N,
                     int IC, int OC);

}  // namespace tt::cuda
