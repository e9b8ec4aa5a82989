// The head: final norm, LM head and loss on every backend (see lm_head.h).
#include "model/lm_head.h"

#include <algorithm>

#include "base/check.h"
#include "model/carve.h"
#include "model/exec_cpu.h"
#include "model/exec_cuda.h"

namespace tt::model {

LmHeadKind::LmHeadKind(const ModelConfig& cfg, int64_t wte_offset, ParamTable::Builder& b)
    : LayerKind(-1, ParamSlice{}),
      C_((int)cfg.hidden_size),
      V_((int)cfg.vocab_size),
      eps_(cfg.rms_norm_eps),
      norm_offset_(cfg.qwen3_5() ? 1.0 : 0.0) {
  b.begin_block("lm_head");
  const int first =
      b.add("model.norm.weight", {cfg.hidden_size}, cfg.qwen3_5() ? ParamRole::kZeroNorm : ParamRole::kNormWeight);
  norm_ = b.offset(first);
  int last = first;
  if (cfg.tie_word_embeddings) {
    lm_ = wte_offset;
  } else {
    last = b.add("lm_head.weight", {cfg.vocab_size, cfg.hidden_size}, ParamRole::kMatrix);
    lm_ = b.offset(last);
  }
  b.end_block();
  slice_ = ParamSlice{"lm_head", first, last + 1};
}

Flops LmHeadKind::flops(const Work& w, Pass p) const {
  const double f = pass_factor(p), C = C_, V = V_;
  return Flops{f * (C + V * C) * (double)w.tokens, f * (C * (double)w.tokens + V * C * (double)w.head_rows)};
}

template <class E>
int LmHeadKind::chunk_rows(int64_t chunk_bytes, int n_rows) const {
  const int64_t r = std::max<int64_t>(1, chunk_bytes / ((int64_t)sizeof(typename E::Act) * V_));
  return (int)std::max<int64_t>(1, std::min<int64_t>(r, n_rows));
}

std::vector<HeadChunk> LmHeadKind::plan_chunks(int n_rows, int R, const std::vector<int32_t>& tgt_src_sorted) {
  std::vector<HeadChunk> out;
  int t = 0;
  const int n_tgt = (int)tgt_src_sorted.size();
  for (int r0 = 0; r0 < n_rows; r0 += R) {
    HeadChunk ch;
    ch.r0 = r0;
    ch.rows = std::min(R, n_rows - r0);
    ch.t_begin = t;
    while (t < n_tgt && tgt_src_sorted[t] < r0 + ch.rows) ++t;
    ch.t_end = t;
    out.push_back(ch);
  }
  return out;
}

template <class E>
struct LmHeadKind::Saved {
  using Act = typename E::Act;
  Act* nf;                  // (N, C) final norm output
  typename E::Stat* rstd;   // (N)
  Act* dnf;                 // (N, C) gradient of nf (training)
  Act* logits;              // (n_rows, V) training without kHeadGradInForward
  Act* dlogits;             // (n_rows, V) likewise
  typename E::Stat* lse;    // (n_rows) likewise
  size_t bytes;

  Saved(const LmHeadKind& h, int N, int n_rows, Mode mode, char* base) {
    const int64_t n = N, nr = n_rows;
    const bool train = mode == Mode::kTrain, keep = train && !E::kHeadGradInForward;
    Carver c{base};
    nf = c.take<Act>(n * h.C_);
    rstd = c.take<typename E::Stat>(n);
    dnf = c.take<Act>(train ? n * h.C_ : 0);
    logits = c.take<Act>(keep ? nr * h.V_ : 0);
    dlogits = c.take<Act>(keep ? nr * h.V_ : 0);
    lse = c.take<typename E::Stat>(keep ? nr : 0);
    bytes = c.bytes();
  }
};

// One chunk's working set.
template <class E>
struct LmHeadKind::Scratch {
  using Act = typename E::Act;
  Act* logits;             // (R, V) the chunk's logits (then their gradient, in place)
  typename E::Stat* lse;   // (R)
  Act* x_rows;             // (R, C) gathered nf rows
  Act* dx_rows;            // (R, C) their gradient
  size_t bytes;

  Scratch(const LmHeadKind& h, int R, Mode mode, char* base) {
    const int64_t r = R;
    const bool chunk_logits = mode == Mode::kNoGrad || E::kHeadGradInForward;
    Carver c{base};
    logits = c.take<Act>(chunk_logits ? r * h.V_ : 0);
    lse = c.take<typename E::Stat>(chunk_logits ? r : 0);
    x_rows = c.take<Act>(r * h.C_);
    dx_rows = c.take<Act>(mode == Mode::kTrain ? r * h.C_ : 0);
    bytes = c.bytes();
  }
};

template <class E>
size_t LmHeadKind::saved_bytes(int N, int n_rows, Mode mode) const {
  return Saved<E>(*this, N, n_rows, mode, nullptr).bytes;
}

template <class E>
size_t LmHeadKind::scratch_bytes(int R, Mode mode) const {
  return Scratch<E>(*this, R, mode, nullptr).bytes;
}

template <class E>
void LmHeadKind::chunk_backward(E& e, const HeadCall<E>& c, const Saved<E>& s, const Scratch<E>& t,
                                const HeadChunk& ch, const typename E::Act* x_rows,
                                const typename E::Act* dlogits) const {
  const BatchView<E>& b = *c.batch;
  const bool all_rows = b.n_rows == b.N;
  typename E::Act* dx_rows = all_rows ? s.dnf + (int64_t)ch.r0 * C_ : t.dx_rows;
  e.linear_dw(c.g + lm_, dlogits, x_rows, ch.rows, C_, V_);
  e.linear_dx(dx_rows, dlogits, c.w + lm_, ch.rows, C_, V_, /*accumulate=*/false);
  if (!all_rows) e.scatter_rows(s.dnf, dx_rows, b.head_rows + ch.r0, ch.rows, C_);
}

template <class E>
void LmHeadKind::forward(E& e, const HeadCall<E>& c) const {
  const BatchView<E>& b = *c.batch;
  const int N = b.N;
  const bool train = c.mode == Mode::kTrain, fused = E::kHeadGradInForward;
  const Saved<E> s(*this, N, b.n_rows, c.mode, c.saved);
  const Scratch<E> t(*this, c.R, c.mode, c.scratch);
  norm_forward(e, norm_offset_, s.nf, s.rstd, c.x, c.w + norm_, N, C_, eps_);
  if (!c.loss) return;  // no-grad without the loss: logits() reads nf
  const bool all_rows = b.n_rows == N;  // head rows are then 0..N-1: no gather or scatter
  e.begin_head();
  if (train && fused && !all_rows) e.zero(s.dnf, sizeof(typename E::Act) * (size_t)N * C_);
  for (const HeadChunk& ch : *c.chunks) {
    const typename E::Act* x_rows = all_rows ? s.nf + (int64_t)ch.r0 * C_ : t.x_rows;
    if (!all_rows) e.gather_rows(t.x_rows, s.nf, b.head_rows + ch.r0, ch.rows, C_);
    const bool chunk_logits = !train || fused;
    typename E::Act* logits = chunk_logits ? t.logits : s.logits + (int64_t)ch.r0 * V_;
    typename E::Stat* lse = chunk_logits ? t.lse : s.lse + ch.r0;
    typename E::Act* dlogits = !train ? nullptr : fused ? logits : s.dlogits + (int64_t)ch.r0 * V_;
    e.linear(logits, x_rows, c.w + lm_, ch.rows, C_, V_);
    typename E::Targets tgt = b.targets;
    tgt.src += ch.t_begin;
    tgt.tok += ch.t_begin;
    tgt.w += ch.t_begin;
    if (tgt.c) tgt.c += ch.t_begin;
    tgt.n_tgt = ch.t_end - ch.t_begin;
    e.cross_entropy(c.loss, lse, dlogits, logits, tgt, ch.r0, ch.rows, V_, c.loss_scale);
    if (train && fused) chunk_backward(e, c, s, t, ch, x_rows, dlogits);
  }
  e.end_head();
}

template <class E>
void LmHeadKind::backward(E& e, const HeadCall<E>& c) const {
  const BatchView<E>& b = *c.batch;
  const int N = b.N;
  const Saved<E> s(*this, N, b.n_rows, Mode::kTrain, c.saved);
  if (!E::kHeadGradInForward) {
    const Scratch<E> t(*this, c.R, Mode::kTrain, c.scratch);
    const bool all_rows = b.n_rows == N;
    e.begin_head();
    if (!all_rows) e.zero(s.dnf, sizeof(typename E::Act) * (size_t)N * C_);
    for (const HeadChunk& ch : *c.chunks) {
      const typename E::Act* x_rows = all_rows ? s.nf + (int64_t)ch.r0 * C_ : t.x_rows;
      if (!all_rows) e.gather_rows(t.x_rows, s.nf, b.head_rows + ch.r0, ch.rows, C_);
      chunk_backward(e, c, s, t, ch, x_rows, s.dlogits + (int64_t)ch.r0 * V_);
    }
    e.end_head();
  }
  // dx starts as the final norm's input gradient (overwritten).
  norm_backward(e, norm_offset_, c.dx, c.g + norm_, s.dnf, c.x, c.w + norm_, s.rstd, N, C_, /*accumulate_dx=*/false);
}

template <class E, class F>
void LmHeadKind::for_each_chunk(E& e, const HeadCall<E>& c, const int32_t* rows, int n, F&& f) const {
  const BatchView<E>& b = *c.batch;
  const Saved<E> s(*this, b.N, b.n_rows, c.mode, c.saved);
  const Scratch<E> t(*this, c.R, c.mode, c.scratch);
  e.begin_head();
  for (int r0 = 0; r0 < n; r0 += c.R) {
    const int m = std::min(c.R, n - r0);
    const typename E::Act* x_rows = s.nf + (int64_t)r0 * C_;
    if (rows) {
      e.gather_rows(t.x_rows, s.nf, rows + r0, m, C_);
      x_rows = t.x_rows;
    }
    e.linear(t.logits, x_rows, c.w + lm_, m, C_, V_);
    f(r0, m, t.logits);
  }
  e.end_head();
}

template <class E>
void LmHeadKind::logits(E& e, const HeadCall<E>& c, const int32_t* rows, int n, double* out) const {
  std::vector<typename E::Act> host((size_t)c.R * V_);
  for_each_chunk(e, c, rows, n, [&](int r0, int m, const typename E::Act* logits) {
    e.download(host.data(), logits, sizeof(typename E::Act) * (size_t)m * V_);
    for (int64_t i = 0; i < (int64_t)m * V_; ++i) out[(int64_t)r0 * V_ + i] = E::to_double(host[i]);
  });
}

template <class E>
void LmHeadKind::sample(E& e, const HeadCall<E>& c, const int32_t* rows, int n, double temperature,
                        const uint64_t* keys, int32_t* token, double* logprob) const {
  for_each_chunk(e, c, rows, n, [&](int r0, int m, const typename E::Act* logits) {
    e.sample_rows(token + r0, logprob + r0, logits, m, V_, temperature, keys + r0);
  });
}

template <class E>
std::vector<double> LmHeadKind::saved_logits(const E& e, const HeadCall<E>& c) const {
  TT_CHECK(!E::kHeadGradInForward && c.mode == Mode::kTrain, "model: the ", E::kName,
           " backend keeps no logits in a training forward (use infer())");
  const BatchView<E>& b = *c.batch;
  const Saved<E> s(*this, b.N, b.n_rows, c.mode, c.saved);
  std::vector<typename E::Act> host((size_t)b.n_rows * V_);
  e.download(host.data(), s.logits, sizeof(typename E::Act) * host.size());
  return std::vector<double>(host.begin(), host.end());
}

#define TT_HEAD_INSTANTIATE(E)                                                                     \
  template int LmHeadKind::chunk_rows<E>(int64_t, int) const;                                      \
  template size_t LmHeadKind::saved_bytes<E>(int, int, Mode) const;                                \
  template size_t LmHeadKind::scratch_bytes<E>(int, Mode) const;                                   \
  template void LmHeadKind::forward<E>(E&, const HeadCall<E>&) const;                              \
  template void LmHeadKind::backward<E>(E&, const HeadCall<E>&) const;                             \
  template void LmHeadKind::logits<E>(E&, const HeadCall<E>&, const int32_t*, int, double*) const; \
  template std::vector<double> LmHeadKind::saved_logits<E>(const E&, const HeadCall<E>&) const;   \
  template void LmHeadKind::sample<E>(E&, const HeadCall<E>&, const int32_t*, int, double, const uint64_t*, int32_t*, \
                                      double*) const;
TT_HEAD_INSTANTIATE(CpuExec<float>)
TT_HEAD_INSTANTIATE(CpuExec<double>)
TT_HEAD_INSTANTIATE(CudaExec)
#undef TT_HEAD_INSTANTIATE

}  // namespace tt::model
