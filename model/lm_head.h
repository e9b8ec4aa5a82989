// The head: final RMSNorm, LM head (its own weight, or the embedding's when tied) and the
// weighted cross-entropy over the batch's target list.
//
// The LM head runs on head rows only (rows that are the source of a target; a row that predicts
// nothing has no logits gradient), in chunks of at most R rows: for each chunk the head GEMM
// writes logits (R, V), the loss takes them, and in training their gradient dloss * dCE/dlogits.
// Where the backend takes the head's gradient in forward (E::kHeadGradInForward: the GPU), the
// chunk's gradient overwrites its logits in place and dW_lm += dlogits^T nf and
// dnf = dlogits W_lm are taken at once, so the batch's logits never exist and forward() already
// accumulates the head's weight gradient (backward() must follow exactly once). Otherwise (the
// CPU reference) forward keeps the head rows' logits and their gradient, and backward() takes
// the head's gradient like every other: a backward can be repeated.
//
// Parameters: model.norm.weight (C), lm_head.weight (V, C) unless tie_word_embeddings.
// Saved (training): nf (N,C), rstd (N), dnf (N,C) the gradient of nf; without kHeadGradInForward
// also logits, dlogits (n_rows, V) and lse (n_rows).
// FLOPs: model FLOPs charge the head on every packed row, executed FLOPs on head rows.
#pragma once

#include <string>
#include <vector>

#include "model/block.h"
#include "model/config.h"

namespace tt::model {

// Head rows [r0, r0 + rows) and their targets [t_begin, t_end) (targets sorted by head row).
struct HeadChunk {
  int r0 = 0, rows = 0, t_begin = 0, t_end = 0;
};

template <class E>
struct HeadCall {
  Mode mode = Mode::kTrain;
  const BatchView<E>* batch = nullptr;
  const typename E::Weight* w = nullptr;
  typename E::Param* g = nullptr;
  char* saved = nullptr;    // saved_bytes(N, n_rows, mode)
  char* scratch = nullptr;  // scratch_bytes(R, mode)
  const typename E::Act* x = nullptr;  // (N, C) the residual stream after the last block
  typename E::Act* dx = nullptr;       // backward: (N, C) overwritten with d x
  double* loss = nullptr;              // (1) on the backend's memory: += sum_t w_t ce_t (and the
                                       // batch targets' c_loss: sum_t cnt_t ce_t)
  double loss_scale = 1.0;             // the gradient's dloss
  const std::vector<HeadChunk>* chunks = nullptr;
  int R = 0;                           // rows per chunk
};

class LmHeadKind final : public LayerKind {
 public:
  // wte_offset: the embedding's weight, read as the head's when the config ties them.
  LmHeadKind(const ModelConfig& cfg, int64_t wte_offset, ParamTable::Builder& b);

  std::string kind() const override { return "lm_head"; }
  Flops flops(const Work& w, Pass p) const override;
  int vocab() const { return V_; }

  // Rows per chunk for a byte budget of logits (at least 1, at most n_rows).
  template <class E>
  int chunk_rows(int64_t chunk_bytes, int n_rows) const;
  // The chunks of n_rows head rows of R rows each, with their target ranges (tgt_src ascending).
  static std::vector<HeadChunk> plan_chunks(int n_rows, int R, const std::vector<int32_t>& tgt_src_sorted);

  template <class E>
  size_t saved_bytes(int N, int n_rows, Mode mode) const;
  template <class E>
  size_t scratch_bytes(int R, Mode mode) const;
  // Training: nf, the loss, and (kHeadGradInForward) the head's gradient. No-grad: nf and, when
  // c.loss is set, the loss.
  template <class E>
  void forward(E& e, const HeadCall<E>& c) const;
  template <class E>
  void backward(E& e, const HeadCall<E>& c) const;
  // No-grad: logits of rows[0..n) (device list; null: rows 0..n-1) into out (n, V), host, after
  // forward() on the same call.
  template <class E>
  void logits(E& e, const HeadCall<E>& c, const int32_t* rows, int n, double* out) const;
  // No-grad: a token drawn from the logits of rows[0..n) (device list; null: rows 0..n-1) and its
  // log-probability (ops/cpu/sampling.h), into token (n) and logprob (n) on the device, after
  // forward() on the same call; keys (n) on the device.
  template <class E>
  void sample(E& e, const HeadCall<E>& c, const int32_t* rows, int n, double temperature, const uint64_t* keys,
              int32_t* token, double* logprob) const;
  // Training without kHeadGradInForward: the head rows' logits the forward kept, (n_rows, V).
  template <class E>
  std::vector<double> saved_logits(const E& e, const HeadCall<E>& c) const;

 private:
  // The head over rows[0..n) (or head rows 0..n-1 when rows is null) in chunks of c.R rows:
  // f(r0, m, logits (m, V) of rows r0..r0+m) per chunk, inside begin_head / end_head.
  template <class E, class F>
  void for_each_chunk(E& e, const HeadCall<E>& c, const int32_t* rows, int n, F&& f) const;

  template <class E>
  struct Saved;
  template <class E>
  struct Scratch;
  template <class E>
  void chunk_backward(E& e, const HeadCall<E>& c, const Saved<E>& s, const Scratch<E>& t, const HeadChunk& ch,
                      const typename E::Act* x_rows, const typename E::Act* dlogits) const;

  int C_, V_;
  double eps_;
  double norm_offset_;  // model.norm: 1 under qwen3_5_text (zero-centred)
  int64_t norm_, lm_;  // offsets; lm_ is the embedding's when tied
};

}  // namespace tt::model
