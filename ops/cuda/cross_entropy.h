// Weighted cross-entropy over an explicit target list, CUDA, fused with its gradient.
// A target t says: logits row src[t] predicts token tok[t] with weight w[t]; a row may be the
// source of several targets (a branch point) or of none (as ops/cpu/cross_entropy.h).
//   loss = sum_t w[t] * (lse(row src[t]) - logits[src[t], tok[t]])
//   dlogits[r] = dloss * (c_r softmax(r) - sum_{t: src[t]=r} w[t] onehot(tok[t])), c_r = sum w.
// Gradient contract: lse is overwritten (fp32); loss (one fp64 on the device) is accumulated
// (+=), and with CeTargets::c so is *CeTargets::c_loss; dlogits (bf16) is overwritten, rows
// without targets get zeros, and dlogits may alias logits (in place).
//
// Row chunks: the calls work on rows [row_begin, row_begin + rows) of a batch, with logits, lse
// and dlogits pointing at row row_begin; targets whose source row lies outside are ignored. So an
// LM head can produce logits for a chunk of rows, take the loss and gradient in place, and go on,
// without ever holding logits for the whole batch. The target list is the whole batch's; the
// loss of a chunk is added to *loss, so chunks sum to the batch's loss.
//
// Precision: bf16 logits, fp32 softmax math, fp64 loss. Deterministic: targets are stably sorted
// by source row on the device (so a row's targets keep list order, as on the CPU), each row is
// reduced by one block in a fixed order, and row losses are summed in a fixed order.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// The targets of a batch, on the device. src, tok (n_tgt) int32; w (n_tgt) fp64.
struct CeTargets {
  const int32_t* src = nullptr;
  const int32_t* tok = nullptr;
  const double* w = nullptr;
  int n_tgt = 0;
  // (n_tgt) optional second weights: the forward also adds sum_t c[t] * ce_t to *c_loss (the
  // unweighted NLL of the trainer takes the targets' path counts). The gradient ignores them.
  const double* c = nullptr;
  double* c_loss = nullptr;  // (1) on the device, += ; with c
};

// Workspace bytes the calls below need for `rows` rows and n_tgt targets.
size_t cross_entropy_workspace_bytes(int rows, int n_tgt);

// lse (rows) overwritten; *loss += loss of the chunk's targets. logits (rows, V).
void cross_entropy_forward(double* loss, float* lse, const bf16* logits, const CeTargets& tgt, int row_begin,
                           int rows, int V, Workspace ws, cudaStream_t stream);

// dlogits (rows, V) = dloss * d(loss)/d(logits), from lse of the forward.
void cross_entropy_backward(bf16* dlogits, const bf16* logits, const float* lse, const CeTargets& tgt,
                            int row_begin, int rows, int V, float dloss, Workspace ws, cudaStream_t stream);

// Both in one pass over the logits: lse overwritten, *loss +=, dlogits overwritten.
void cross_entropy_forward_backward(double* loss, float* lse, bf16* dlogits, const bf16* logits,
                                    const CeTargets& tgt, int row_begin, int rows, int V, float dloss,
                                    Workspace ws, cudaStream_t stream);

}  // namespace tt::cuda
