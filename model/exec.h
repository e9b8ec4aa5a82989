// The execution backends of the decoder and the op vocabulary the layer kinds are written in.
//
// A layer kind's forward and backward are written once, as templates over an execution backend E
// (model/exec_cpu.h: CpuExec<float|double>, the reference; model/exec_cuda.h: CudaExec, bf16 on
// the GPU). E names its element types and provides the ops below, each with one meaning on every
// backend; where the GPU fuses or keeps a sum in fp32, the CPU computes the same function in T.
//
// Types: Act (activations: T | bf16), Stat (rstd, lse: T | fp32), Acc (fp32 sums of several GEMM
// products and relayed gradients: T | fp32), Param (master weights and gradients: T | fp32),
// Weight (what the ops read: the master weights | their bf16 copy), KV (an external KV prefix of
// the attention primitive: ops/cpu/attention.h | ops/cuda/attention.h), Layout (a batch's
// attention layout: node ranges | tree tiles), Rope (positions, theta, and on the GPU a cos/sin
// table), Buffer (grow-only memory of the backend), Targets (a head chunk's target list).
//
// Traits: kSeparateWeights (Weight is a rounded copy of Param), kBackwardConsumesSaved (backward
// may overwrite what forward saved: the GPU reuses gate/up for their gradients; the CPU keeps them,
// so a backward can be repeated), kHeadGradInForward (the GPU takes the LM head's gradient inside
// the training forward, chunk by chunk, and never holds the batch's logits; the CPU keeps logits
// and their gradient and takes it in backward), kMaxExternalKV, kDefaultHeadChunkBytes.
//
// Ops (shapes: N rows, C hidden, H heads, HS head dim, IC/OC a Linear's in/out features). Outputs
// are overwritten unless a gradient contract says +=; every backend enqueues in order on its own
// stream (the CPU runs at once).
//   embedding_forward(out (N,C), tokens (N), wte (V,C))          embedding_backward(dwte +=)
//   rmsnorm_forward(out, rstd (rows), x (rows,C), w (C))        rmsnorm_backward(dx, dw +=, dout:
//       Act or Acc; accumulate_dx: dx += (true) or dx = (false))
//   linear(out (N,OC): Act or Acc, x (N,IC), w (OC,IC))         out = x w^T
//   linear_dx(dx (N,IC): Act or Acc, dout (N,OC), w, accumulate) dx (+)= dout w
//   linear_dw(dw (OC,IC) +=, dout (N,OC), x (N,IC))
//   residual_add(out, x: Act, y: Acc)  out = x + y (one rounding)   add_inplace(y: Act, x: Acc)
//   swiglu_forward(h, gate, up)   swiglu_backward(dgate, dup, dh, gate, up) (may alias gate/up)
//   Fused forms (the same function as the ops they combine; the GPU runs them as one kernel for a
//   decode step's few rows, ops/cuda/gemv.h, and as the separate ops otherwise):
//   norm_linear(n, rstd, x, norm_w, eps, w_offset, outs[]): n = rmsnorm(x), out_s = linear(n, w_s)
//   norm_linear_swiglu(n, rstd, x, ..., gate, up, h, wg, wu): gate, up = linear(n, wg | wu),
//       h = swiglu(gate, up)
//   linear_residual(out, res, x, w, sum (Acc scratch)): out = res + linear(x, w) (one rounding)
//   qk_norm_rope_pair(q side (NH heads), k side (NKV heads), rope, ..., v, store_k, store_v,
//       store_rows): both qk_norm_rope_forward calls, then (store_k set) scatter_rows of k and v
//   qk_norm_rope_attention(the pair's arguments, out, lse, layout, ext, n_ext): qk_norm_rope_pair,
//       then attention_forward of its q, k and v (the GPU runs both as one kernel where a decode
//       step's attention is clustered, ops/cuda/attention_decode.h)
//   rope_forward(x (N,H,HS) in place, rope)   rope_backward(dx in place)
//   qk_norm_rope_forward(out (N,H,HS), rstd (N H), x, w (HS), rope): rope(rmsnorm(x) w)
//   qk_norm_rope_backward(dx =, dw +=, dout (destroyed), x, w, rstd, rope)
//   attention_forward / attention_backward: the one attention primitive (ops/*/attention.h)
//   gather_rows(out (R,C), in, rows (R))   scatter_rows(out[rows[r]] = in[r])
//   cross_entropy(loss +=, lse (rows), dlogits (rows,V) or null, logits (rows,V), targets,
//       row_begin, rows, V, dloss): the weighted loss of the chunk's targets (and with the
//       targets' second weights c, *c_loss += sum c ce: the unweighted NLL), and its gradient
//       dloss * d(loss)/d(logits) when dlogits is set (may alias logits)
//   sample_rows(token (R), logprob (R) fp64, logits (R,V), temperature, keys (R)): greedy or the
//       Gumbel-max draw per row and the token's log-probability (ops/cpu/sampling.h)
//   begin_head() / end_head(): the ops between them are the LM head's (GPU profile class);
//   begin_vision() / end_vision() the same for the VLA media stage
#pragma once

#include <cstdint>

namespace tt::model {

// What a forward keeps. kTrain saves what backward needs; kNoGrad saves nothing (one layer's
// working set at a time) and returns logits and/or the loss.
enum class Mode { kTrain, kNoGrad };

// One output of norm_linear: out (N, OC) = n w^T, w (OC, IC).
template <class Act, class Weight>
struct LinearOut {
  Act* out;
  const Weight* w;
  int OC;
};

// The fused forms as the ops they combine, written once: the CPU backend's implementation, and
// the GPU's for rows its fused kernels do not take.
namespace composed {

template <class E, class Act = typename E::Act, class Weight = typename E::Weight>
void norm_linear(E& e, Act* n, typename E::Stat* rstd, const Act* x, const Weight* norm_w, int N, int C, double eps,
                 double w_offset, const LinearOut<Act, Weight>* outs, int n_outs) {
  e.rmsnorm_forward(n, rstd, x, norm_w, N, C, eps, w_offset);
  for (int s = 0; s < n_outs; ++s) e.linear(outs[s].out, n, outs[s].w, N, C, outs[s].OC);
}

template <class E, class Act = typename E::Act, class Weight = typename E::Weight>
void norm_linear_swiglu(E& e, Act* n, typename E::Stat* rstd, const Act* x, const Weight* norm_w, int N, int C,
                        double eps, double w_offset, Act* gate, Act* up, Act* h, const Weight* wg, const Weight* wu,
                        int I) {
  e.rmsnorm_forward(n, rstd, x, norm_w, N, C, eps, w_offset);
  e.linear(gate, n, wg, N, C, I);
  e.linear(up, n, wu, N, C, I);
  e.swiglu_forward(h, gate, up, (int64_t)N * I);
}

template <class E, class Act = typename E::Act>
void linear_residual(E& e, Act* out, const Act* res, const Act* x, const typename E::Weight* w, int N, int IC, int OC,
                     typename E::Acc* sum) {
  e.linear(sum, x, w, N, IC, OC);
  e.residual_add(out, res, sum, (int64_t)N * OC);
}

template <class E, class Act = typename E::Act, class Weight = typename E::Weight>
void qk_norm_rope_pair(E& e, Act* q, typename E::Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                       typename E::Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV,
                       const typename E::Rope& r, int N, int HS, double eps, double w_offset, const Act* v,
                       Act* store_k, Act* store_v, const int32_t* store_rows) {
  e.qk_norm_rope_forward(q, q_rstd, q_pre, q_w, r, N, NH, HS, eps, w_offset);
  e.qk_norm_rope_forward(k, k_rstd, k_pre, k_w, r, N, NKV, HS, eps, w_offset);
  if (!store_k) return;
  e.scatter_rows(store_k, k, store_rows, N, NKV * HS);
  e.scatter_rows(store_v, v, store_rows, N, NKV * HS);
}

template <class E, class Act = typename E::Act, class Weight = typename E::Weight>
void qk_norm_rope_attention(E& e, Act* q, typename E::Stat* q_rstd, const Act* q_pre, const Weight* q_w, int NH, Act* k,
                            typename E::Stat* k_rstd, const Act* k_pre, const Weight* k_w, int NKV,
                            const typename E::Rope& r, int N, int HS, double eps, double w_offset, const Act* v,
                            Act* store_k, Act* store_v, const int32_t* store_rows, Act* out, typename E::Stat* lse,
                            const typename E::Layout& layout, const typename E::KV* ext, int n_ext) {
  e.qk_norm_rope_pair(q, q_rstd, q_pre, q_w, NH, k, k_rstd, k_pre, k_w, NKV, r, N, HS, eps, w_offset, v, store_k,
                      store_v, store_rows);
  e.attention_forward(out, lse, q, k, v, layout, ext, n_ext, N, NH, NKV, HS);
}

}  // namespace composed

}  // namespace tt::model
