// Gated DeltaNet (the linear-attention layer of Qwen3-Next and Qwen3.5) on DFS-packed trees, CPU
// reference: plain loops, fp64 accumulation and fp64 recurrent state, templated on float and
// double. Every op follows root-to-token paths, never the packed order, so a node's conv window
// and recurrent state come from its own ancestors and never from a finished sibling.
//
// Tree layout (data/packing.h): tokens in DFS order; node n holds rows [node_start[n],
// node_start[n] + node_len[n]) and its parent is an earlier node (-1 at a root). The r-th root
// (in node order) is the r-th tree of the batch.
//
// The layer (HF Qwen3NextGatedDeltaNet; ../shared/research/anchors-ssm-vla.md section 1.4):
// projections -> conv1d_silu over [q | k | v] channels -> l2norm of q and k per head -> gates
// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) -> gdn_tree_forward (value head h reads
// key head h / (nv / nk)) -> gated_rmsnorm(o, z) per value head -> out_proj.
//
// Gradient contract as elsewhere in ops/cpu: backward outputs are accumulated (+=).
#pragma once

#include <cstdint>

namespace tt::cpu {

// prev (N): the token before row i on its root-to-token path: i - 1 inside a node, the last row
// of the parent node at a node's first row, -1 at a root's first row. Throws tt::Error for a
// layout that is not DFS-packed (nodes tiling [0, N) in order, parents earlier).
void path_prev(int32_t* prev, const int32_t* node_start, const int32_t* node_len, const int32_t* node_parent,
               int num_nodes, int N);

// Depthwise causal conv1d + SiLU along paths, w (C, K) as HF's conv1d.weight (C, 1, K), no bias:
//   out[i, c] = silu(sum_{j < K} w[c, j] x[a_{K-1-j}(i), c]),  a_0(i) = i, a_{m+1}(i) = prev[a_m(i)],
// x at -1 being 0: the last K - 1 tokens of the path, which cross as many ancestor nodes as they
// need (one-token nodes included). x, out (N, C).
template <class T>
void conv1d_silu_forward(T* out, const T* x, const T* w, const int32_t* prev, int N, int C, int K);
// dx (N, C) +=, dw (C, K) += (either may be null).
template <class T>
void conv1d_silu_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const int32_t* prev, int N, int C,
                          int K);

// L2 norm per row (HF l2norm): y = x / sqrt(sum x^2 + eps); rstd (rows) saved.
template <class T>
void l2norm_forward(T* y, T* rstd, const T* x, int rows, int D, double eps);
template <class T>
void l2norm_backward(T* dx, const T* dy, const T* x, const T* rstd, int rows, int D);  // dx +=

// Gated RMSNorm per row (HF Qwen3NextRMSNormGated, plain weight): y = w x rsqrt(mean(x^2) + eps)
// silu(z); rstd (rows) saved. x, z, y (rows, D), w (D).
template <class T>
void gated_rmsnorm_forward(T* y, T* rstd, const T* x, const T* z, const T* w, int rows, int D, double eps);
// dx, dz (rows, D) +=, dw (D) += (any may be null).
template <class T>
void gated_rmsnorm_backward(T* dx, T* dz, T* dw, const T* dy, const T* x, const T* z, const T* w, const T* rstd,
                            int rows, int D);

// The gates per row and value head (HF Qwen3NextGatedDeltaNet): beta = sigmoid(b),
// g = -exp(A_log[h]) softplus(a + dt_bias[h]). a, b, g, beta (N, H); A_log, dt_bias (H).
template <class T>
void gdn_gates_forward(T* g, T* beta, const T* a, const T* b, const T* A_log, const T* dt_bias, int N, int H);
// da, db (N, H) overwritten; dA_log, ddt_bias (H) += (either may be null).
template <class T>
void gdn_gates_backward(T* da, T* db, T* dA_log, T* ddt_bias, const T* dg, const T* dbeta, const T* a, const T* b,
                        const T* A_log, const T* dt_bias, int N, int H);

// The packed tree and the head shape of a gated delta rule call.
struct GdnTree {
  const int32_t* node_start = nullptr;  // (num_nodes)
  const int32_t* node_len = nullptr;    // (num_nodes)
  const int32_t* node_parent = nullptr; // (num_nodes)
  int num_nodes = 0;
  int N = 0;                 // packed rows
  int nk = 0, nv = 0;        // key heads (q, k) and value heads (v, g, beta, o, state); nv % nk == 0
  int dk = 0, dv = 0;        // head dims
  double scale = 1.0;        // applied to q (HF: dk^-1/2)
  int num_roots() const;     // nodes with parent -1
};

// The gated delta rule along every root-to-token path, per value head h with key head h / (nv/nk):
//   S' = exp(g_t) S_{t-1},  delta = beta_t (v_t - S'^T k_t),  S_t = S' + k_t delta^T,
//   o_t = scale S_t^T q_t,
// where S_{t-1} is the state after the token before t on its path: a node starts from its
// parent's end state, a root from init (its root's, or 0 when init is null).
// q, k (N, nk, dk), already L2-normalised; v (N, nv, dv); g, beta (N, nv): log decay (<= 0) and
// write strength (post-sigmoid). o (N, nv, dv). init (num_roots, nv, dk, dv) or null. end
// (num_nodes, nv, dk, dv) or null: each node's state after its last token (fp64, as the state).
// The recurrent form: the oracle.
template <class T>
void gdn_tree_forward(T* o, double* end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                      const double* init, const GdnTree& t);

// The same outputs by the chunked (WY / UT) form: each node is cut into chunks of at most
// `chunk` rows from its first row (no chunk straddles a node boundary); per chunk, with gamma the
// within-chunk cumulative sum of g and M = I + strictly_lower(beta_r k_r . k_s exp(gamma_r -
// gamma_s)), U = M^-1 (beta v), W = M^-1 (beta exp(gamma) k), v_new = U - W S,
// o_r = scale (exp(gamma_r) q_r^T S + sum_{s <= r} (q_r . k_s) exp(gamma_r - gamma_s) v_new_s),
// S <- exp(gamma_L) S + sum_s exp(gamma_L - gamma_s) k_s v_new_s^T.
template <class T>
void gdn_tree_forward_chunked(T* o, double* end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                              const double* init, const GdnTree& t, int chunk = 64);

// Backward of gdn_tree_forward: dq, dk (N, nk, dk), dv (N, nv, dv), dg, dbeta (N, nv) +=;
// d_init (num_roots, nv, dk, dv) += when not null; d_end (num_nodes, nv, dk, dv) or null: the
// gradient arriving at each node's end state from outside (a gateway's consumer, a cache). A
// parent's end-state gradient is d_end's plus the sum over its children of their initial-state
// gradients (fp64).
template <class T>
void gdn_tree_backward(T* dq, T* dk, T* dv, T* dg, T* dbeta, double* d_init, const T* d_o, const double* d_end,
                       const T* q, const T* k, const T* v, const T* g, const T* beta, const double* init,
                       const GdnTree& t);

// The same gradients by the chunked form (the algorithm a GPU kernel follows): per chunk of at
// most `chunk` rows (never straddling a node), in reverse, with dS the gradient of the chunk's end
// state S' and q~ = scale q:
//   dv_new_b = sum_{a >= b} (q~_a . k_b) e^(gam_a - gam_b) dO_a + e^(gam_L - gam_b) dS^T k_b,
//   dS_in = e^(gam_L) dS + sum_a e^(gam_a) q~_a dO_a^T - W^T dv_new,
//   dB1 = M^-T dv_new, dB2 = -M^-T (dv_new S_in^T) (B1 = beta v, B2 = beta e^gam k, M = I + A),
//   dA = -strictly_lower(dB1 U^T + dB2 W^T), then the chain into q, k, v, beta and gam, and
//   dg = the reverse cumulative sum of dgam within the chunk; a node's first chunk's dS_in goes to
// its parent's end state (or d_init).
template <class T>
void gdn_tree_backward_chunked(T* dq, T* dk, T* dv, T* dg, T* dbeta, double* d_init, const T* d_o,
                               const double* d_end, const T* q, const T* k, const T* v, const T* g, const T* beta,
                               const double* init, const GdnTree& t, int chunk = 64);

}  // namespace tt::cpu
