// Gated DeltaNet ops on DFS-packed trees, CUDA (see gdn.h): the row ops' kernels and sequences in
// gdn_rows.cuh, the delta rule's in gdn_rule.cuh, both run here on a stream (CudaRunner); the
// plan's tables.
#include "ops/cuda/gdn.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "base/check.h"
#include "ops/cuda/attention_device.cuh"
#include "ops/cuda/attention_sm90_device.cuh"
#include "ops/cuda/check.h"
#include "ops/cuda/kernel_util.cuh"
#include "ops/cuda/mma_sm80.cuh"
#include "ops/cuda/tma.h"
// The kernels and their launch sequences, after the primitives they are written against.
#include "ops/cuda/gdn_rows.cuh"
#include "ops/cuda/gdn_rule.cuh"

namespace tt::cuda {

namespace {

// Runs gdn_rows.cuh's and gdn_rule.cuh's sequences on a stream.
struct CudaRunner {
  cudaStream_t stream;
  template <class... P, class... A>
  void launch(void (*kernel)(P...), dim3 grid, int block, size_t smem, const A&... args) {
    if (smem > 0)
      detail::set_attribute_once(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
    kernel<<<grid, block, smem, stream>>>(args...);
    TT_CUDA_CHECK_LAUNCH();
  }
  void zero(void* p, size_t bytes) { TT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream)); }
  // A (rows, heads, cols) tensor of the walks' stages as a TMA map: boxes of box_cols columns x
  // box_rows rows of one head, 128-byte swizzle (WalkTmaStage, BwdWalkTmaStage).
  template <class T>
  CUtensorMap map(const T* base, int64_t rows, int heads, int cols, int box_cols, int box_rows) {
    constexpr CUtensorMapDataType kType =
        std::is_same_v<T, float> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return tma_map_3d(kType, sizeof(T), base, rows, heads, cols, box_cols, box_rows, CU_TENSOR_MAP_SWIZZLE_128B,
                      "gdn walk");
  }
};

}  // namespace

void gdn_path_prev(int32_t* prev, const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent,
                   int num_nodes, cudaStream_t stream) {
  CudaRunner run{stream};
  path_prev_on(run, prev, node_start, node_len, node_parent, num_nodes);
}

void conv1d_silu_forward(bf16* out, const bf16* x, const bf16* w, const int32_t* prev, int N, int C, int K,
                         cudaStream_t stream) {
  CudaRunner run{stream};
  conv_forward_on(run, out, x, w, prev, N, C, K);
}

size_t conv1d_silu_backward_workspace_bytes(int N, int C, int K) { return ConvScratch(N, C, K, nullptr).bytes; }

void conv1d_silu_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev,
                          const int32_t* pos, const int32_t* subtree_end, int N, int C, int K, Workspace ws,
                          cudaStream_t stream, bool accumulate) {
  CudaRunner run{stream};
  conv_backward_on(run, dx, dw, dout, x, w, prev, pos, subtree_end, N, C, K, ws, accumulate);
}

void conv1d_silu_backward(float* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w, const int32_t* prev,
                          const int32_t* pos, const int32_t* subtree_end, int N, int C, int K, Workspace ws,
                          cudaStream_t stream, bool accumulate) {
  CudaRunner run{stream};
  conv_backward_on(run, dx, dw, dout, x, w, prev, pos, subtree_end, N, C, K, ws, accumulate);
}

void l2norm_forward(bf16* y, float* rstd, const bf16* x, int rows, int D, double eps, cudaStream_t stream) {
  CudaRunner run{stream};
  l2norm_forward_on(run, y, rstd, x, rows, D, eps);
}

void l2norm_backward(bf16* dx, const bf16* dy, const bf16* x, const float* rstd, int rows, int D, cudaStream_t stream,
                     bool accumulate) {
  CudaRunner run{stream};
  l2norm_backward_on(run, dx, dy, x, rstd, rows, D, accumulate);
}

void gated_rmsnorm_forward(bf16* y, float* rstd, const bf16* x, const bf16* z, const bf16* w, int rows, int D,
                           double eps, cudaStream_t stream) {
  CudaRunner run{stream};
  gated_rmsnorm_forward_on(run, y, rstd, x, z, w, rows, D, eps);
}

size_t gated_rmsnorm_backward_workspace_bytes(int rows, int D) { return gated_rmsnorm_workspace(rows, D); }

void gated_rmsnorm_backward(bf16* dx, bf16* dz, float* dw, const bf16* dy, const bf16* x, const bf16* z,
                            const bf16* w, const float* rstd, int rows, int D, Workspace ws, cudaStream_t stream,
                            bool accumulate) {
  CudaRunner run{stream};
  gated_rmsnorm_backward_on(run, dx, dz, dw, dy, x, z, w, rstd, rows, D, ws, accumulate);
}

void gdn_gates_forward(float* g, bf16* beta, const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N,
                       int H, cudaStream_t stream) {
  CudaRunner run{stream};
  gates_forward_on(run, g, beta, a, b, A_log, dt_bias, N, H);
}

size_t gdn_gates_backward_workspace_bytes(int N, int H) { return gates_workspace(N, H); }

void gdn_gates_backward(bf16* da, bf16* db, float* dA_log, float* ddt_bias, const float* dg, const float* dbeta,
                        const bf16* a, const bf16* b, const bf16* A_log, const bf16* dt_bias, int N, int H,
                        Workspace ws, cudaStream_t stream) {
  CudaRunner run{stream};
  gates_backward_on(run, da, db, dA_log, ddt_bias, dg, dbeta, a, b, A_log, dt_bias, N, H, ws);
}

void GdnPlan::make(const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent, int num_nodes) {
  TT_CHECK(num_nodes >= 0, "GdnPlan: num_nodes = ", num_nodes);
  std::vector<int32_t> root(num_nodes, -1), count(num_nodes);
  int32_t next = 0;
  roots_ = 0, chunks_ = 0;
  for (int n = 0; n < num_nodes; ++n) {
    TT_CHECK(node_start[n] == next && node_len[n] > 0, "GdnPlan: node ", n, " must start at ", next,
             " with a positive length, got start ", node_start[n], " len ", node_len[n]);
    TT_CHECK(node_parent[n] >= -1 && node_parent[n] < n, "GdnPlan: node ", n, " has parent ", node_parent[n],
             " (expected -1 or an earlier node)");
    if (node_parent[n] < 0) root[n] = roots_++;
    count[n] = (node_len[n] + kGdnChunk - 1) / kGdnChunk;
    chunks_ += count[n];
    next += node_len[n];
  }
  nodes_ = num_nodes;
  N_ = next;
  host_.clear();
  levels_.clear();
  paths_ = 0;
  dev_ = Device{};
  if (num_nodes == 0) return;  // no chunks: nothing to upload

  // Children (packed order), subtree chunks, each node's heaviest child.
  std::vector<int32_t> child0(num_nodes + 1, 0), child, below(count), heavy(num_nodes, -1);
  for (int n = 0; n < num_nodes; ++n)
    if (node_parent[n] >= 0) ++child0[node_parent[n] + 1];
  for (int n = 0; n < num_nodes; ++n) child0[n + 1] += child0[n];
  child.resize(child0[num_nodes]);
  {
    std::vector<int32_t> fill(child0.begin(), child0.end() - 1);
    for (int n = 0; n < num_nodes; ++n)
      if (node_parent[n] >= 0) child[fill[node_parent[n]]++] = n;
  }
  for (int n = num_nodes - 1; n >= 0; --n)  // children after their parent
    if (node_parent[n] >= 0) below[node_parent[n]] += below[n];
  for (int n = 0; n < num_nodes; ++n)
    for (int32_t i = child0[n]; i < child0[n + 1]; ++i)
      if (heavy[n] < 0 || below[child[i]] > below[heavy[n]]) heavy[n] = child[i];
  // Paths: from each root and each light child down its heaviest children.
  struct Path {
    int level, chunks, first;  // first: its first node
  };
  std::vector<Path> paths;
  std::vector<int32_t> level(num_nodes);
  for (int n = 0; n < num_nodes; ++n) {
    const int p = node_parent[n];
    if (p >= 0 && heavy[p] == n) {
      level[n] = level[p];
      continue;
    }
    level[n] = p < 0 ? 0 : level[p] + 1;
    int chunks = 0;
    for (int m = n; m >= 0; m = heavy[m]) chunks += count[m];
    paths.push_back({level[n], chunks, n});
  }
  std::stable_sort(paths.begin(), paths.end(), [](const Path& a, const Path& b) {
    return a.level != b.level ? a.level < b.level : a.chunks > b.chunks;
  });
  // The chunks path by path, each path's nodes in order, each node's from its first row.
  std::vector<int32_t> row0, len, node, flags, path0;
  for (const Path& path : paths) {
    if ((int)levels_.size() <= path.level) levels_.push_back(Level{(int)path0.size()});
    Level& l = levels_.back();
    ++l.paths, l.chunks += path.chunks, l.max_path_chunks = std::max(l.max_path_chunks, path.chunks);
    path0.push_back((int32_t)row0.size());
    for (int m = path.first; m >= 0; m = heavy[m])
      for (int32_t c0 = 0; c0 < node_len[m]; c0 += kGdnChunk) {
        row0.push_back(node_start[m] + c0);
        len.push_back(std::min<int32_t>(kGdnChunk, node_len[m] - c0));
        node.push_back(m);
        flags.push_back((c0 == 0 ? 1 : 0) | (c0 + kGdnChunk >= node_len[m] ? 2 : 0));
      }
  }
  path0.push_back((int32_t)row0.size());
  paths_ = (int)paths.size();

  for (const std::vector<int32_t>* t : {&row0, &len, &node, &flags}) host_.insert(host_.end(), t->begin(), t->end());
  host_.insert(host_.end(), node_parent, node_parent + num_nodes);
  for (const std::vector<int32_t>* t : {&root, &path0, &child0, &child})
    host_.insert(host_.end(), t->begin(), t->end());
  TT_CHECK(table_bytes() <= max_table_bytes(N_, nodes_), "GdnPlan: ", table_bytes(), " table bytes over the bound ",
           max_table_bytes(N_, nodes_));
}

void GdnPlan::upload(void* tables, cudaStream_t stream) {
  if (host_.empty()) return;
  TT_CUDA_CHECK(cudaMemcpyAsync(tables, host_.data(), table_bytes(), cudaMemcpyHostToDevice, stream));
  refer_to(tables);
}

void GdnPlan::refer_to(const void* tables) {
  const int32_t* t = static_cast<const int32_t*>(tables);
  dev_.chunk_row0 = t;
  dev_.chunk_len = t + chunks_;
  dev_.chunk_node = t + 2 * chunks_;
  dev_.chunk_flags = t + 3 * chunks_;
  dev_.node_parent = t + 4 * chunks_;
  dev_.node_root = t + 4 * chunks_ + nodes_;
  dev_.path_chunk0 = t + 4 * chunks_ + 2 * nodes_;
  dev_.node_child0 = dev_.path_chunk0 + paths_ + 1;
  dev_.node_child = dev_.node_child0 + nodes_ + 1;
}

size_t gdn_forward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv, bool end_given, GdnProducts products) {
  return RuleScratch(plan, nv, dk, dv, end_given, /*walk_saves=*/!walk_writes_outputs(dk), products, nullptr).bytes;
}

size_t gdn_backward_workspace_bytes(const GdnPlan& plan, int nv, int dk, int dv, GdnProducts products) {
  return RuleBwdScratch(plan, nv, dk, dv, products, nullptr).bytes;
}

void gdn_backward(bf16* dq, bf16* dk, bf16* dv, float* dg, float* dbeta, float* d_init, const bf16* d_o,
                  const float* d_end, const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta,
                  const float* init, const GdnPlan& plan, int nk, int nv, int dk_, int dv_, double scale, Workspace ws,
                  cudaStream_t stream, bool accumulate, GdnProducts products) {
  CudaRunner run{stream};
  rule_backward(run, dq, dk, dv, dg, dbeta, d_init, d_o, d_end, q, k, v, g, beta, init, plan, nk, nv, dk_, dv_, scale,
                ws, accumulate, products);
}

void gdn_forward(bf16* o, float* end, const bf16* q, const bf16* k, const bf16* v, const float* g, const bf16* beta,
                 const float* init, const GdnPlan& plan, int nk, int nv, int dk, int dv, double scale, Workspace ws,
                 cudaStream_t stream, GdnProducts products) {
  CudaRunner run{stream};
  rule_forward(run, o, end, q, k, v, g, beta, init, plan, nk, nv, dk, dv, scale, ws, products);
}

}  // namespace tt::cuda
