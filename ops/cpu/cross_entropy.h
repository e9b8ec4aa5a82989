// Weighted cross-entropy over an explicit target list, CPU reference.
// A target t says: the logits row src[t] predicts token tok[t] with weight w[t]. A row may be
// the source of several targets (a branch point: the last token of a node predicts the first
// token of each child) or of none. loss = sum_t w[t] * (lse(row src[t]) - logits[src[t], tok[t]]).
// Forward saves lse per row. Gradient contract: dlogits is overwritten (rows without targets
// get zeros).
#pragma once
#include <cstdint>

namespace tt::cpu {

// logits (N, V); lse (N) out; tgt_src, tgt_tok (n_tgt); tgt_w (n_tgt). Returns the loss (fp64 sum).
// With tgt_c (n_tgt) set, *c_loss += sum_t tgt_c[t] * ce_t as well: the same cross-entropies under
// other weights (the trainer's unweighted NLL takes the targets' path counts).
template <class T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* tgt_src, const int32_t* tgt_tok,
                             const double* tgt_w, int n_tgt, int N, int V, const double* tgt_c = nullptr,
                             double* c_loss = nullptr);

// dlogits (N, V) = dloss * d(loss)/d(logits).
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* tgt_src,
                            const int32_t* tgt_tok, const double* tgt_w, int n_tgt, int N, int V,
                            double dloss);

}  // namespace tt::cpu
