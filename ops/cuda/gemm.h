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

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ops/cuda/bf16.h"

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
struct GemmTuneStats {
  int tuned_plans = 0, changed_plans = 0;
  double heuristic_ms = 0, tuned_ms = 0;
};

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
  // longer, and the scratch output (up to 256 MiB) stays allocated with the handle.
  void set_autotune(bool on);
  bool autotune() const;
  GemmTuneStats tune_stats() const;

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
