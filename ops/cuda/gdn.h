// Gated DeltaNet's ops on DFS-packed trees, CUDA (issue 15): the same meaning as ops/cpu/gdn.h on
// bf16 tensors with fp32 math, statistics and state: the row ops, and the gated delta rule's
// forward and backward. Every op follows root-to-token paths, never the packed order: a conv window reads the
// token's own ancestors (prev), and the conv's input gradient is gathered from the token's own
// descendants (pos, subtree_end), so no finished sibling leaks in either direction.
//
// Gradient contract as elsewhere in ops/cuda: dx-style outputs (bf16) are accumulated (+=, one
// rounding of the fp32 sum) unless accumulate is false, weight gradients (fp32, the master
// gradient buffer) are accumulated; sums over rows (dw, dA_log, ddt_bias) run in two fixed stages
// (row chunks, then the chunks in order) and are deterministic, as is every op here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/cuda/bf16.h"
#include "ops/cuda/workspace.h"

namespace tt::cuda {

// prev (N): the row before row i on its root-to-row path (ops/cpu/gdn.h path_prev) from the
// node arrays (num_nodes) on the device; the layout is the caller's (data::pack's) to be valid.
void gdn_path_prev(int32_t* prev, const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent,
                   int num_nodes, cudaStream_t stream);

// Depthwise causal conv1d + SiLU along paths: out (N, C) = silu(sum_j w[c, j] x[tap_j(i), c]),
// tap_{K-1}(i) = i, tap_{j-1} = prev[tap_j] (zero past a root). x (N, C), w (C, K), K <= 64.
void conv1d_silu_forward(bf16* out, const bf16* x, const bf16* w, const int32_t* prev, int N, int C, int K,
                         cudaStream_t stream);

// Workspace of conv1d_silu_backward.
size_t conv1d_silu_backward_workspace_bytes(int N, int C, int K);

// dx (N, C) bf16 (+= unless !accumulate), dw (C, K) fp32 += (either may be null). The gradient of
// row r's input gathers, for each descendant d of r at path distance m < K (rows after r in its
// subtree with pos[d] - pos[r] = m; deeper subtrees are skipped whole through subtree_end), the
// term w[c, K - 1 - m] da[d, c], da = dout silu'(pre). pos (N) depths, subtree_end (N) as in
// data/packing.h.
void conv1d_silu_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev,
                          const int32_t* pos, const int32_t* subtree_end, int N, int C, int K, Workspace ws,
                          cudaStream_t stream, bool accumulate = true);
// The same with dx in fp32 (a carried conv's input gradients, relayed across a cut unrounded).
void conv1d_silu_backward(float* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev,
                          const int32_t* pos, const int32_t* subtree_end, int N, int C, int K, Workspace ws,
                          cudaStream_t stream, bool accumulate = true);

// L2 norm per row (HF l2norm): y = x rsqrt(sum x^2 + eps); rstd (rows) fp32.
void l2norm_forward(bf16* y, float* rstd, const bf16* x, int rows, int D, double eps, cudaStream_t stream);
// dx (rows, D) += rstd (dy - y (y . dy)), y = x rstd.
void l2norm_backward(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int rows, int D, cudaStream_t stream,
                     bool accumulate = true);

// Gated RMSNorm per row (HF Qwen3NextRMSNormGated): y = w x rsqrt(mean x^2 + eps) silu(z);
// rstd (rows) fp32. x, z, y (rows, D), w (D).
void gated_rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w, int rows, int D,
                           double eps, cudaStream_t stream);
size_t gated_rmsnorm_backward_workspace_bytes(int rows, int D);
// dx, dz (rows, D) bf16 (+= unless !accumulate), dw (D) fp32 += (any may be null).
void gated_rmsnorm_backward(bf16* dx, bf16* dz, float* dw, const bf16* dy, const bf16* x, const bf16* z,
                            const bf16* w, const float* rstd, int rows, int D, Workspace ws, cudaStream_t stream,
                            bool accumulate = true);

// The gates per row and value head: beta = sigmoid(b), g = -exp(A_log[h]) softplus(a + dt_bias[h]).
// a, b, beta (N, H) bf16; g (N, H) fp32 (the log decay: transformers computes it in fp32, and the
// delta rule sums it over a chunk); A_log, dt_bias (H) bf16 (the working copy of the weights).
void gdn_gates_forward(float* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N,
                       int H, cudaStream_t stream);
size_t gdn_gates_backward_workspace_bytes(int N, int H);
// da, db (N, H) overwritten; dA_log, ddt_bias (H) fp32 += (either may be null); dg, dbeta (N, H) fp32.
void gdn_gates_backward(bf16* da, bf16* db, float* dA_log, float* ddt_bias, const float* dg, const float* dbeta,
                        const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N, int H,
                        Workspace ws, cudaStream_t stream);

// ---- The gated delta rule, chunked (ops/cpu/gdn.h gdn_tree_forward_chunked) ----
//
// A batch's chunk plan: every node cut into chunks of at most kGdnChunk rows from its first row
// (no chunk straddles a node), numbered path by path (levels()): each path's nodes root-side first,
// so a node's chunks come after its parent's (the chain kernels walk them in that order) and each
// path's are one run; built on the host from the node arrays once per batch (the layers share it)
// and uploaded.
constexpr int kGdnChunk = 64;
class GdnPlan {
 public:
  // Host node arrays of a DFS-packed batch (parents before children).
  void make(const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent, int num_nodes);
  size_t table_bytes() const { return sizeof(int32_t) * host_.size(); }
  // Copies the tables to `tables` (device, table_bytes()), enqueued on stream; the plan then
  // refers to them.
  void upload(void* tables, cudaStream_t stream);
  // The tables as upload copies them, and refer_to: the plan refers to `tables` holding them
  // (what upload does after its copy; host memory for the CPU emulation of the kernels).
  const std::vector<int32_t>& host_tables() const { return host_; }
  void refer_to(const void* tables);
  int num_chunks() const { return chunks_; }
  int num_nodes() const { return nodes_; }
  int num_roots() const { return roots_; }
  int rows() const { return N_; }
  // The walks' paths (the bf16 walks on warpgroup MMA: ops/cuda/gdn_rule.cuh bf16_walk_grid). Each
  // tree is cut into paths that follow each node's heaviest child (the most chunks in its subtree;
  // the first in packed order of equals); a path's level is the number of paths above it on its
  // root's way (at most log2 of the chunks: a light child holds at most half its parent's
  // subtree). A level's paths walk side by side, a lane each, in one launch, longest first; the
  // levels in order forward (a path starts from its parent's end state, on a lower level) and in
  // reverse backward (a node's state gradient sums its children's, on higher levels).
  struct Level {
    int path0 = 0, paths = 0, chunks = 0, max_path_chunks = 0;
  };
  const std::vector<Level>& levels() const { return levels_; }
  // table_bytes() of any plan of N rows and num_nodes nodes.
  static size_t max_table_bytes(int N, int num_nodes) {
    return sizeof(int32_t) * (4 * (size_t)N + 5 * (size_t)num_nodes + 2);
  }
  struct Device {
    const int32_t* chunk_row0 = nullptr;  // (chunks) first row
    const int32_t* chunk_len = nullptr;   // (chunks) rows, <= kGdnChunk
    const int32_t* chunk_node = nullptr;  // (chunks) node
    const int32_t* chunk_flags = nullptr; // (chunks) bit 0: the node's first chunk, bit 1: its last
    const int32_t* node_parent = nullptr; // (nodes)
    const int32_t* node_root = nullptr;   // (nodes) index among the roots, -1 for other nodes
    const int32_t* path_chunk0 = nullptr; // (paths + 1) path i: chunks path_chunk0[i] .. path_chunk0[i + 1]
    const int32_t* node_child0 = nullptr; // (nodes + 1) node n's children: node_child[node_child0[n] ..
    const int32_t* node_child = nullptr;  // (nodes - roots)                   node_child0[n + 1]], packed order
  };
  const Device& device() const { return dev_; }

 private:
  std::vector<int32_t> host_;
  Device dev_;
  std::vector<Level> levels_;
  int chunks_ = 0, nodes_ = 0, roots_ = 0, N_ = 0, paths_ = 0;
};

// How the chunk walks (the serial part: the products with the state and v_new, forward, and with
// the state gradient and dvn, backward) and the backward's per-chunk state products (S and dS
// with dO, v_new and dvn) multiply on tensor cores.
//  - kExact: each fp32 operand split into two or three bf16 parts (two to six mma a product): fp32's
//    products, end states within 1e-4 of the fp64 oracle.
//  - kBf16: each operand rounded to bf16 once, one mma a product, fp32 accumulators and state:
//    the precision of FLA's and FlashQLA's kernels, which round the state and v_new to bf16 for
//    their products; a few 2^-9 of relative error in o, the end states and the gradients.
// The prep computes as kExact's in both; with kBf16 it stores only what the walks read, rounded as
// they would round it (-W's high half, the scores in bf16: fewer bytes, the same bits), the
// backward stores in bf16 what its later kernels read only as bf16 operands (v_new, dvn, dW), the
// entering states and their gradients for the state products (<S, dS> then sums bf16 values) and
// those products' S dO and dS v_new for the input-gradient kernel (one more rounding of each),
// and the per-chunk input-gradient kernel's tensor-core products take one bf16 mma each too. At dk
// not a multiple of 16 the walks run on CUDA cores in fp32 and the state products exactly: kBf16
// is kExact there.
enum class GdnProducts { kExact, kBf16 };

// The bytes gdn_forward's Workspace needs for these products (kBf16 needs less: no U at dk 128,
// where the walks take U themselves, and in the backward's the buffers its kernels hand each other
// in bf16 at half size); a workspace sized for kExact serves either.
size_t gdn_forward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv, bool end_given,
                                   GdnProducts products = GdnProducts::kExact);

// The gated delta rule along every root-to-row path (ops/cpu/gdn.h), chunked (WY / UT form):
// o (N, nv, dv) bf16; q, k (N, nk, dk) L2-normalised, v (N, nv, dv), beta (N, nv) bf16, g (N, nv) fp32; value
// head h reads key head h / (nv / nk). init (num_roots, nv, dk, dv) fp32 or null (zeros); end
// (num_nodes, nv, dk, dv) fp32 or null: each node's state after its last row. A node starts from
// its parent's end state. fp32 math and state. dk <= 128 a multiple of 8, dv <= 128 a multiple of 32.
// q, k, v and the states are read 16 bytes at a time (16-byte aligned, else an error naming the
// tensor), o written in pairs (4-byte aligned).
// Per (chunk, head) the chunk's U, W, decay sums and masked q.k scores; then the walk per (value
// head, 32 state columns) over the chunks in the plan's order carrying the state (a node's first
// chunk starts from its parent's end state, kept per node) that writes the outputs of its columns
// (at dk not a multiple of 16 it stores each chunk's entering state and v_new, and a third kernel
// per (chunk, head) the outputs): two kernels whatever the tree (three at dk not a multiple of 16),
// except the bf16 walks at dk 128 (dv a multiple of 64), which launch once a level of the plan's
// paths (GdnPlan::levels, at most the tree's depth), a level's paths side by side, 32 or 64 state
// columns a block.
void gdn_forward(bf16* o, float* end, const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta,
                 const float* init, const GdnPlan& plan, int nk, int nv, int dk, int dv, double scale, Workspace ws,
                 cudaStream_t stream, GdnProducts products = GdnProducts::kExact);

// As gdn_forward_workspace_bytes, for gdn_backward.
size_t gdn_backward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv,
                                    GdnProducts products = GdnProducts::kExact);

// Its backward (ops/cpu/gdn.h gdn_tree_backward_chunked, the algorithm followed): dq, dk (N, nk,
// dk), dv (N, nv, dv) bf16, dg, dbeta (N, nv) fp32 (+= unless !accumulate); d_init (num_roots, nv, dk,
// dv) fp32 += or null; d_end (num_nodes, nv, dk, dv) fp32 or null: the gradient reaching each
// node's end state from outside the batch. A parent's end-state gradient sums its children's
// initial-state gradients in a fixed order (the reverse of the plan's chunk order; the bf16 walks
// at dk 128: last child first in packed order): deterministic, no atomics. Recomputes the
// forward's walk (its first kernel also keeps each chunk's T = (I + A)^-1 and the transposed
// scores), then: the reverse walk per (value head, 32 state columns) carrying the end-state
// gradient and taking the dO terms on its own columns (at dk not a multiple of 16 a kernel per
// (chunk, head) computes them first); per (chunk, head, 64 state rows) the products with the
// entering state and its gradient; per (chunk, head) the inputs' gradients; the key-head group
// sums: six launches whatever the tree (seven at dk not a multiple of 16), except that the bf16
// walks at dk 128 launch once a level of paths (gdn_forward). d_o and the state gradients 16-byte
// aligned as the forward's inputs.
void gdn_backward(bf16* dq, bf16* dk, bf16* dv, float* dg, float* dbeta, float* d_init, const bf16* d_o,
                  const float* d_end, const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta,
                  const float* init, const GdnPlan& plan, int nk, int nv, int dk_, int dv_, double scale, Workspace ws,
                  cudaStream_t stream, bool accumulate = true, GdnProducts products = GdnProducts::kExact);

}  // namespace tt::cuda
