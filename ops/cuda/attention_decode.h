// The attention primitive's decode mode, CUDA: a batch whose every row is its own one-token tree
// (a decode step: one new token per sequence). Row i attends to the external KV prefixes whose
// query range holds it, in list order, then to its own key; any number of prefixes (a shared
// prompt's cache rows visible to all of its samples, each sample's own generated rows visible to
// its row). The same function as ops/cuda/attention.h (and ops/cpu/attention.h) on such a batch:
// scale = 1 / sqrt(HS), grouped-query heads (query head h reads KV head h / (NH / NKV)), lse the
// natural log of the softmax denominator. Forward only: no gradients (prefix dk/dv are ignored).
//
// Work split (flash-decoding): each prefix is cut into chunks of keys and its rows into groups;
// a block computes one (chunk, row group, KV head)'s partial softmax (max, sum, weighted values
// for every query head of the group) with the keys staged once in shared memory for all the
// group's rows; a second kernel merges a row's partials with its own key. Memory-bound: every
// key row of a prefix is read once per row group.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "ops/cuda/attention.h"
#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// Device bytes attention_decode_forward needs for this call's shapes and prefixes.
size_t attention_decode_workspace_bytes(const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS);

// out (N, NH, HS), lse (N, NH) overwritten; q (N, NH, HS); k, v (N, NKV, HS) the rows' own keys;
// ext[0..n_ext) as in attention.h (len >= 0, q ranges within [0, N)). HS 64 or 128.
void attention_decode_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, const ExternalKV* ext,
                              int n_ext, int N, int NH, int NKV, int HS, Workspace ws, cudaStream_t stream);

}  // namespace tt::cuda
