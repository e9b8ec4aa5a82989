// Checked entry points of the CUDA tree attention: shape and pointer validation, the params
// structs (with the kernels' TMA tensor maps) and the one runtime -> template dispatch (head dim).
// Kernels: attention_sm90.cuh.
#include "ops/cuda/attention.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "base/check.h"
#include "ops/cuda/attention_params.h"
#include "ops/cuda/check.h"
#include "ops/cuda/tma.h"

namespace tt::cuda {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The instantiated head dims: 64, 128 and 256 (attention_{fwd,bwd}_hdim*.cu).
template <class Fn>
void dispatch_head_dim(int HS, Fn&& fn) {
  switch (HS) {
    case 64:
      fn(std::integral_constant<int, 64>{});
      return;
    case 128:
      fn(std::integral_constant<int, 128>{});
      return;
    case 256:
      fn(std::integral_constant<int, 256>{});
      return;
    default:
      TT_CHECK(false, "tree attention: head dim HS=", HS, ", expected 64, 128 or 256");
  }
}

void check_tensor(const void* p, const char* op, const char* name) {
  TT_CHECK(p != nullptr, op, ": ", name, " is null");
  TT_CHECK(aligned16(p), op, ": ", name, " must be 16-byte aligned");
}

void check_common(const TreeTiles& tiles, const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS,
                  const char* op) {
  TT_CHECK(N >= 0 && NH > 0 && NKV > 0, op, ": expected N >= 0 and positive NH, NKV, got N=", N, " NH=", NH,
           " NKV=", NKV);
  TT_CHECK(HS == 64 || HS == 128 || HS == 256, op, ": head dim HS=", HS, ", expected 64, 128 or 256");
  TT_CHECK(NH % NKV == 0, op, ": query heads NH=", NH, " must be a multiple of KV heads NKV=", NKV);
  TT_CHECK((int64_t)N * NH * HS < ((int64_t)1 << 40), op, ": tensor of ", (int64_t)N * NH * HS, " elements");
  TT_CHECK(tiles.n == N, op, ": tile metadata was built for ", tiles.n, " tokens, expected N=", N,
           " (build_tree_tiles of this batch's subtree_end)");
  TT_CHECK(N == 0 || (tiles.subtree_end && tiles.hi_min && tiles.hi_max && tiles.subtree_end_pad), op,
           ": tile metadata has null pointers");
  TT_CHECK(N == 0 || (aligned16(tiles.subtree_end) && aligned16(tiles.subtree_end_pad)), op,
           ": subtree_end and its padded copy must be 16-byte aligned");
  TT_CHECK(N == 0 || !tiles.key_lo || (tiles.lo_min && tiles.lo_max && aligned16(tiles.key_lo_pad)), op,
           ": bidirectional tile metadata (key_lo) has null or unaligned pointers");
  TT_CHECK(tiles.num_granules == (N + kTileGranule - 1) / kTileGranule, op, ": tile metadata has ",
           tiles.num_granules, " granules, expected ", (N + kTileGranule - 1) / kTileGranule);
  TT_CHECK(n_ext >= 0 && n_ext <= kMaxExternalKV, op, ": n_ext=", n_ext, ", expected 0..", kMaxExternalKV);
  TT_CHECK(n_ext == 0 || ext != nullptr, op, ": n_ext=", n_ext, " with a null external prefix list");
  for (int e = 0; e < n_ext; e++) {
    const ExternalKV& x = ext[e];
    TT_CHECK(x.len >= 0, op, ": external prefix ", e, " has negative length ", x.len);
    TT_CHECK(0 <= x.q_begin && x.q_begin <= x.q_end && x.q_end <= N, op, ": external prefix ", e,
             " has query range [", x.q_begin, ", ", x.q_end, "), expected 0 <= q_begin <= q_end <= N=", N);
    if (x.len == 0) continue;
    TT_CHECK(x.k && x.v && aligned16(x.k) && aligned16(x.v), op, ": external prefix ", e, " has len ", x.len,
             " but a null or unaligned k or v (16 bytes)");
    TT_CHECK(aligned16(x.dk) && aligned16(x.dv), op, ": external prefix ", e, " dk/dv must be 16-byte aligned");
    TT_CHECK(NKV >= 64 || (x.heads >> NKV) == 0 || x.heads == ~uint64_t(0), op, ": external prefix ", e,
             " names KV heads past NKV=", NKV, " in its head set");
  }
  int64_t keys = N;
  for (int e = 0; e < n_ext; e++) keys += ext[e].len;
  TT_CHECK(keys + 128 * kMaxExternalKV <= (int64_t)65535 * 128, op, ": ", keys,
           " keys (tree and prefixes): more tiles than a grid dimension holds (65535 x 128 keys)");
}

// TMA descriptor of a dense (rows, heads, HS) bf16 tensor: boxes of 64 columns x 1 head x
// box_rows rows, 128-byte swizzle (the kernels' shared-memory tile layout), zeros past the end.
CUtensorMap tensor_map(const bf16* base, int rows, int heads, int HS, int box_rows) {
  return tma_map_3d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(bf16), base, rows, heads, HS, 64, box_rows,
                    CU_TENSOR_MAP_SWIZZLE_128B, "tree attention");
}

}  // namespace

void attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                       const TreeTiles& tiles, const ExternalKV* ext, int n_ext, int N, int NH, int NKV,
                       int HS, cudaStream_t stream) {
  const char* op = "cuda::attention_forward";
  check_common(tiles, ext, n_ext, N, NH, NKV, HS, op);
  if (N == 0) return;
  check_tensor(out, op, "out");
  check_tensor(q, op, "q");
  check_tensor(k, op, "k");
  check_tensor(v, op, "v");
  TT_CHECK(lse != nullptr, op, ": lse is null");
  AttnFwdParams p = make_fwd_params(out, lse, q, k, v, tiles, ext, n_ext, N, NH, NKV, HS);
  set_fwd_tensor_maps(p, HS, tensor_map);  // tiles arrive by TMA
  dispatch_head_dim(HS, [&](auto hs) { run_attention_fwd<decltype(hs)::value>(p, stream); });
}

size_t attention_backward_workspace_bytes(int N, int NH, int HS) { return bwd_workspace_bytes(N, NH, HS); }

void attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* out, const float* lse,
                        const bf16* q, const bf16* k, const bf16* v, const TreeTiles& tiles,
                        const ExternalKV* ext, int n_ext, int N, int NH, int NKV, int HS, Workspace workspace,
                        cudaStream_t stream) {
  const char* op = "cuda::attention_backward";
  check_common(tiles, ext, n_ext, N, NH, NKV, HS, op);
  if (N == 0) return;
  check_tensor(dq, op, "dq");
  check_tensor(dk, op, "dk");
  check_tensor(dv, op, "dv");
  check_tensor(dout, op, "dout");
  check_tensor(out, op, "out");
  check_tensor(q, op, "q");
  check_tensor(k, op, "k");
  check_tensor(v, op, "v");
  TT_CHECK(lse != nullptr, op, ": lse is null");
  const size_t need = attention_backward_workspace_bytes(N, NH, HS);
  TT_CHECK(workspace.ptr != nullptr && workspace.bytes >= need, op, ": workspace of ", workspace.bytes,
           " bytes, expected at least attention_backward_workspace_bytes = ", need);
  TT_CHECK((reinterpret_cast<uintptr_t>(workspace.ptr) & 255) == 0, op, ": workspace must be 256-byte aligned");
  AttnBwdParams p = make_bwd_params(dq, dk, dv, dout, out, lse, q, k, v, tiles, ext, n_ext, N, NH, NKV, HS,
                                    workspace.ptr);
  set_bwd_tensor_maps(p, HS, tensor_map);  // Q/dO steps arrive by TMA
  dispatch_head_dim(HS, [&](auto hs) { run_attention_bwd<decltype(hs)::value>(p, stream); });
}

}  // namespace tt::cuda
