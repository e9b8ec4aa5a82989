// Small elementwise kernels of the CUDA execution backend (model/exec_cuda.cc), private to it: the
// glue between the ops of ops/cuda (residual adds from fp32 GEMM outputs, fp32 -> bf16 rounding,
// row gather/scatter for the LM head, the device side of model/init.h). All enqueue on `stream`; every
// launch is checked. Pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/bf16.h"

namespace tt::model::detail {

using cuda::bf16;

// out (n) = bf16(in (n)), round to nearest even.
void f32_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream);

// out (n) = bf16(float(x) + y): a residual add with one rounding (x bf16, y fp32 GEMM output).
void residual_add(bf16* out, const bf16* x, const float* y, int64_t n, cudaStream_t stream);

// y (bf16) += x (fp32), rounded once.
void add_inplace(bf16* y, const float* x, int64_t n, cudaStream_t stream);

// dst[rows[r]] += src (R, C) in fp32, rows distinct (a segment's tail gradients into its source rows).
void add_rows(float* dst, const int32_t* rows, const float* src, int R, int C, cudaStream_t stream);

// out[:, col0 : col0 + cols] += in (N, cols) for out rows of out_cols elements, bf16, the sum in
// fp32 rounded once (a layer's column-block gradients into the input they were split from).
void add_cols(bf16* out, const bf16* in, int N, int out_cols, int col0, int cols, cudaStream_t stream);

// dst[dst_rows[i]] += src[src_rows[i]] (i < n, rows of C, dst rows distinct) in fp32, rounded once
// where dst is bf16: gradients crossing between bf16 rows and fp32 accumulators.
void add_rows(bf16* dst, const int32_t* dst_rows, const float* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream);
void add_rows(float* dst, const int32_t* dst_rows, const bf16* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream);
void add_rows(float* dst, const int32_t* dst_rows, const float* src, const int32_t* src_rows, int n, int C,
              cudaStream_t stream);

// out (R, C) = in[rows[r]] for r < R; in (*, C).
void gather_rows(bf16* out, const bf16* in, const int32_t* rows, int R, int C, cudaStream_t stream);

// out[rows[r]] = in (R, C) for r < R; other rows of out untouched.
void scatter_rows(bf16* out, const bf16* in, const int32_t* rows, int R, int C, cudaStream_t stream);

// w (n) fp32: init_normal_host's draws for one tensor (model/init.h): splitmix64 seeded with
// `state`, Box-Muller pairs in fp64, times stddev, rounded to fp32.
void init_normal(float* w, int64_t n, uint64_t state, double stddev, cudaStream_t stream);

// w (n) = value.
void fill(float* w, int64_t n, float value, cudaStream_t stream);

}  // namespace tt::model::detail
