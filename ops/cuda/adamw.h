// AdamW over all parameters in one launch, the global gradient norm, and clipping, CUDA.
//
// Parameters live in one flat fp32 master buffer (model::ParamInfo offsets); adamw_update walks a
// chunk table built once from the tensor list (adamw_chunks), one block per chunk, and updates the
// fp32 master weights, m and v in place and writes the bf16 copy of the weights in the same pass.
// The update is torch.optim.AdamW's, as ops/cpu/adamw.h (fp32 here):
//   g = grad * grad_scale; param *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//   param -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps),
// with wd = weight_decay for tensors marked decay and 0 for the others (norm weights).
// Gradient contract: grad is read only; param, param_bf16, m, v are updated in place.
//
// Clipping folds into grad_scale: sum_squares gives the squared global norm (fp64, two fixed
// stages: deterministic), clip_scale turns it into min(1, max_norm / (norm + 1e-6)) on the device,
// and adamw_update multiplies by that device scalar when given, with no host round trip.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;  // applied to tensors with decay set
  int64_t step = 1;           // 1-based, for bias correction
  double grad_scale = 1.0;    // multiplies grad first (times *grad_scale_dev when given)
};

// A tensor of the flat buffer: elements [offset, offset + numel).
struct AdamWTensor {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;
};

// A piece of one tensor that one block updates. 16 bytes, uploaded once.
struct AdamWChunk {
  int64_t offset;
  int32_t len;
  int32_t decay;
};

constexpr int64_t kAdamWChunkElems = 1 << 16;

// Splits each tensor into chunks of at most chunk_elems elements (host side).
std::vector<AdamWChunk> adamw_chunks(const std::vector<AdamWTensor>& tensors, int64_t chunk_elems = kAdamWChunkElems);

// param (P) fp32, param_bf16 (P) or null, grad (P) fp32, m, v (P) fp32; chunks (n_chunks) on the
// device; grad_scale_dev: one fp32 on the device, or null. nonfinite: one int on the device, or
// null: set to 1 when the update leaves any param, m or v value non-finite (left alone otherwise;
// the check rides on the update's own pass over the values).
void adamw_update(float* param, bf16* param_bf16, const float* grad, float* m, float* v, const AdamWChunk* chunks,
                  int n_chunks, const AdamWParams& p, const float* grad_scale_dev, cudaStream_t stream,
                  int* nonfinite = nullptr);

// Workspace bytes sum_squares needs.
size_t sum_squares_workspace_bytes(int64_t n);

// *out (one fp64 on the device) = sum of x^2 over x (n) fp32; overwritten.
void sum_squares(double* out, const float* x, int64_t n, Workspace ws, cudaStream_t stream);

// *scale (one fp32 on the device) = min(1, max_norm / (sqrt(*sumsq) + 1e-6)); 1 when max_norm <= 0.
// *norm (one fp64 on the device, may be null) = sqrt(*sumsq), for logging.
void clip_scale(float* scale, double* norm, const double* sumsq, double max_norm, cudaStream_t stream);

}  // namespace tt::cuda
