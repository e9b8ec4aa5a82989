// Tree attention, CUDA: the GPU twin of ops/cpu/attention.h, same visibility rules and argument
// meaning, bf16 tensors with fp32 softmax statistics and fp32 accumulation.
//
// Queries of a DFS-packed batch see key j when j <= i < subtree_end[j] (their ancestors and the
// tokens of their own node up to themselves; in the bidirectional mode, TreeTiles::key_lo, every
// token of their own node: an image's tokens in a vision tower), plus optional external KV
// prefixes: prefix e is visible to queries [q_begin, q_end) of the KV heads in its head set and is
// read before the tree's keys. Grouped-query
// attention: query head h reads KV head h / (NH / NKV). scale = 1 / sqrt(HS); HS is 64, 128 or 256.
// The layout is a TreeTiles (ops/cuda/tree_tiles.h) built on the GPU from subtree_end, once per
// batch. All pointers are device pointers, 16-byte aligned, tensors dense and row-major.
//
// Forward saves lse (N, NH) fp32 (natural log of the softmax denominator, scale included).
// Gradient contract: dq, dk, dv are overwritten; an external prefix's dk/dv (fp32) are accumulated
// (+=) when non-null (gradients on) and left alone when null (gradients off). dq sums its key tiles
// through fp32 vector reductions in arrival order, so it is not bitwise reproducible from run to
// run (dk, dv are). The kernels are Hopper's (sm_90a, warpgroup MMA and TMA: attention_sm90.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cuda/bf16.h"
#include "ops/cuda/tree_tiles.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// The most external prefixes one call takes (a gateway, a carried tail, a retrieval prefix...).
// They travel in the kernels' parameters (two TMA descriptors and 56 bytes each), which CUDA 12.1+
// takes up to 32 KB on sm_70+; a partition gateway is one prefix per ancestor range, so this bounds
// how deep a chain of pieces can run on the GPU.
constexpr int kMaxExternalKV = 32;

struct ExternalKV {
  const bf16* k = nullptr;  // (len, NKV, HS), after norms and RoPE
  const bf16* v = nullptr;  // (len, NKV, HS)
  float* dk = nullptr;      // (len, NKV, HS) += in fp32 (gradients of a prefix read by several
  float* dv = nullptr;      // batches, e.g. a gateway shared by child pieces); null: no gradient
  int len = 0;
  int q_begin = 0;  // queries [q_begin, q_end) of the packed batch see this prefix
  int q_end = 0;
  // The KV heads that read this prefix (bit g: KV head g and its query heads; as
  // cpu::ExternalKV::heads): the others skip its tiles and give it no gradient. All by default.
  uint64_t heads = ~uint64_t(0);
  bool read_by(int g) const { return (heads >> g) & 1; }
};

// The head set of every one of NKV KV heads.
inline uint64_t all_kv_heads(int NKV) { return NKV >= 64 ? ~uint64_t(0) : (uint64_t(1) << NKV) - 1; }

// out (N, NH, HS), lse (N, NH); q (N, NH, HS); k, v (N, NKV, HS).
void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const TreeTiles& tiles, const ExternalKV* ext, int n_ext, int N, int NH, int NKV,
                       int HS, cudaStream_t stream);

// Device bytes of scratch attention_backward needs: the fp32 dq accumulator (N, NH, HS) and the
// per-row softmax terms (NH, N rounded up to 128) twice.
size_t attention_backward_workspace_bytes(int N, int NH, int HS);

// dq (N, NH, HS), dk, dv (N, NKV, HS) overwritten; ext[e].dk/dv accumulated when non-null.
// workspace: at least attention_backward_workspace_bytes(N, NH, HS) device bytes.
void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                        const bf16* q, const bf16* k, const bf16* v, const TreeTiles& tiles,
                        const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS, Workspace workspace,
                        cudaStream_t stream);

}  // namespace tt::cuda
