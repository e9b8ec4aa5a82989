// Generation with the KV cache (see generate.h).
#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>

#include "base/check.h"
#include "model/init.h"
#include "model/sampler.h"

namespace tt::model {

template <class E>
KVCache<E>::KVCache(Decoder<E>& model, int64_t capacity, int64_t state_slots)
    : exec_(&model.exec()),
      layers_(model.architecture().num_layers()),
      capacity_(capacity),
      slots_(state_slots),
      state_elems_(layers_),
      conv_elems_(layers_),
      state_(layers_),
      conv_(layers_),
      row_elems_(layers_),
      k_(layers_),
      v_(layers_) {
  TT_CHECK(capacity >= 0 && state_slots >= 0, "KVCache: capacity ", capacity, ", state slots ", state_slots);
  for (int l = 0; l < layers_; ++l) {
    state_elems_[l] = model.recurrent_state_elems(l);
    conv_elems_[l] = model.conv_context_elems(l);
    if (state_elems_[l] > 0) {
      recurrent_ = true;
      model.exec().ensure(state_[l], sizeof(typename E::Acc) * (size_t)std::max<int64_t>(slots_, 1) * state_elems_[l]);
      model.exec().ensure(conv_[l], sizeof(typename E::Act) * (size_t)std::max<int64_t>(slots_, 1) *
                                        std::max<int64_t>(conv_elems_[l], 1));
    }
    row_elems_[l] = model.carry_row_elems(l);
    if (row_elems_[l] == 0) continue;
    const size_t bytes = sizeof(typename E::Act) * (size_t)capacity * (size_t)row_elems_[l];
    model.exec().ensure(k_[l], bytes);
    model.exec().ensure(v_[l], bytes);
  }
}

template <class E>
void KVCache<E>::truncate(int64_t rows) {
  TT_CHECK(rows >= 0 && rows <= used_, "KVCache: truncate to ", rows, " rows of ", used_, " in use");
  used_ = rows;
}

template <class E>
int64_t KVCache<E>::reserve(int64_t rows) {
  TT_CHECK(rows >= 0 && used_ + rows <= capacity_, "KVCache: ", rows, " more rows past ", used_, " of ", capacity_);
  const int64_t first = used_;
  used_ += rows;
  return first;
}

template <class E>
void KVCache<E>::read(Carry<E>& carry, int64_t begin, int len, int q_begin, int q_end) const {
  TT_CHECK((int)carry.size() == layers_, "KVCache: a carry of ", carry.size(), " layers, expected ", layers_);
  TT_CHECK(begin >= 0 && len >= 0 && begin + len <= used_, "KVCache: rows [", begin, ", ", begin + len,
           ") outside the ", used_, " reserved");
  if (len == 0) return;
  for (int l = 0; l < layers_; ++l) {
    const int64_t e = row_elems_[l];
    if (e == 0) continue;
    typename E::KV kv;
    kv.k = reinterpret_cast<const typename E::Act*>(k_[l].data()) + begin * e;
    kv.v = reinterpret_cast<const typename E::Act*>(v_[l].data()) + begin * e;
    kv.dk = nullptr;
    kv.dv = nullptr;
    kv.len = len;
    kv.q_begin = q_begin;
    kv.q_end = q_end;
    carry[l].kv.push_back(kv);
  }
}

template <class E>
int64_t KVCache<E>::reserve_slots(int64_t n) {
  TT_CHECK(n >= 0 && slots_used_ + n <= slots_, "KVCache: ", n, " more state slots past ", slots_used_, " of ", slots_);
  const int64_t first = slots_used_;
  slots_used_ += n;
  return first;
}

template <class E>
void KVCache<E>::read_state(Carry<E>& carry, std::vector<int32_t> slots) const {
  TT_CHECK((int)carry.size() == layers_, "KVCache: a carry of ", carry.size(), " layers, expected ", layers_);
  for (int32_t s : slots)
    TT_CHECK(s >= -1 && s < slots_used_, "KVCache: state slot ", s, " outside the ", slots_used_, " reserved");
  for (int l = 0; l < layers_; ++l) {
    if (state_elems_[l] == 0) continue;
    carry[l].state = reinterpret_cast<const typename E::Acc*>(state_[l].data());
    carry[l].conv = reinterpret_cast<const typename E::Act*>(conv_[l].data());
    carry[l].state_slot = slots;
  }
}

template <class E>
void KVCache<E>::copy_state(int64_t dst, int64_t src) {
  TT_CHECK(dst >= 0 && dst < slots_used_ && src >= 0 && src < slots_used_, "KVCache: copy of state slot ", src,
           " to ", dst, " outside the ", slots_used_, " reserved");
  if (dst == src) return;
  for (int l = 0; l < layers_; ++l) {
    const int64_t se = state_elems_[l], ce = conv_elems_[l];
    if (se == 0) continue;
    auto* s = reinterpret_cast<typename E::Acc*>(state_[l].data());
    exec_->copy(s + dst * se, s + src * se, se);
    if (ce == 0) continue;
    auto* c = reinterpret_cast<typename E::Act*>(conv_[l].data());
    exec_->copy(c + dst * ce, c + src * ce, ce);
  }
}

template <class E>
CacheWrite<E> KVCache<E>::write(std::vector<int32_t> rows, std::vector<int32_t> state_slots) const {
  CacheWrite<E> w;
  for (int32_t r : rows) TT_CHECK(r >= 0 && r < used_, "KVCache: write to row ", r, " outside the ", used_, " reserved");
  for (int32_t s : state_slots)
    TT_CHECK(s >= -1 && s < slots_used_, "KVCache: state slot ", s, " outside the ", slots_used_, " reserved");
  for (int l = 0; l < layers_; ++l) {
    const bool has = row_elems_[l] > 0;
    w.k.push_back(has ? reinterpret_cast<typename E::Act*>(const_cast<char*>(k_[l].data())) : nullptr);
    w.v.push_back(has ? reinterpret_cast<typename E::Act*>(const_cast<char*>(v_[l].data())) : nullptr);
    const bool rec = state_elems_[l] > 0 && !state_slots.empty();
    w.state.push_back(rec ? reinterpret_cast<typename E::Acc*>(const_cast<char*>(state_[l].data())) : nullptr);
    w.conv.push_back(rec ? reinterpret_cast<typename E::Act*>(const_cast<char*>(conv_[l].data())) : nullptr);
  }
  w.rows = std::move(rows);
  w.state_slot = std::move(state_slots);
  return w;
}

void SamplingOptions::validate() const {
  TT_CHECK(max_new_tokens >= 1, "--max-new-tokens: ", max_new_tokens, ", expected >= 1");
  TT_CHECK(std::isfinite(temperature) && temperature >= 0, "--temperature: ", temperature, ", expected >= 0");
  TT_CHECK(top_p > 0 && top_p <= 1, "--top-p: ", top_p, ", expected in (0, 1]");
  TT_CHECK(num_samples >= 1, "--num-samples: ", num_samples, ", expected >= 1");
  TT_CHECK(max_batch_tokens >= 1, "max_batch_tokens: ", max_batch_tokens, ", expected >= 1");
}

Draw sample_token(const double* x, int V, double temperature, double top_p, double u) {
  int best = 0;
  for (int i = 1; i < V; ++i)
    if (x[i] > x[best]) best = i;
  const double mx = x[best];
  double z = 0;
  for (int i = 0; i < V; ++i) z += std::exp(x[i] - mx);
  const double lse = mx + std::log(z);
  if (temperature == 0) return Draw{best, x[best] - lse};
  std::vector<double> p(V);
  double total = 0;
  for (int i = 0; i < V; ++i) total += p[i] = std::exp((x[i] - mx) / temperature);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  double mass = total;
  int kept = V;
  if (top_p < 1) {  // most likely first, ties by id; keep the smallest prefix reaching top_p
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double c = 0;
    for (kept = 0; kept < V;) {
      c += p[order[kept++]];
      if (c >= top_p * total) break;
    }
    mass = c;
  }
  const double target = u * mass;
  double c = 0;
  int tok = order[kept - 1];
  for (int j = 0; j < kept; ++j) {
    c += p[order[j]];
    if (target < c) {
      tok = order[j];
      break;
    }
  }
  return Draw{tok, x[tok] - lse};
}

namespace {

// The stream of prompt p's sample s.
SplitMix64 stream_of(uint64_t seed, int64_t p, int s) {
  SplitMix64 r{seed ^ ((uint64_t)p * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)s * 0xc2b2ae3d27d4eb4full)};
  r.next();
  return r;
}

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// One sample in flight: its draws and where its rows go.
struct Live : SampleStream {
  Live(const SamplingOptions& opt, int64_t prompt_index, int p_in_group, int s, int64_t gen_row_, Sample* out)
      : SampleStream(opt, prompt_index, s, out), pg(p_in_group), gen_row(gen_row_) {}
  int pg;                 // prompt index within the group
  int64_t gen_row;        // first cache row of its generated tokens
  int32_t slot = -1;      // recurrent models: its state slot
};

}  // namespace

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check_prompts(const ModelConfig& cfg, const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                   bool bounded_positions) {
  const int64_t V = cfg.vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Prompt& pr = prompts[i];
    TT_CHECK(!pr.tokens.empty(), "prompt ", i + 1, " ('", pr.id, "'): no tokens");
    for (int32_t t : pr.tokens)
      TT_CHECK(t >= 0 && t < V, "prompt ", i + 1, " ('", pr.id, "'): token ", t, " outside vocab_size ", V);
    if (bounded_positions) continue;
    TT_CHECK((int64_t)pr.tokens.size() + opt.max_new_tokens <= cfg.max_position_embeddings, "prompt ", i + 1, " ('",
             pr.id, "'): ", pr.tokens.size(), " tokens + --max-new-tokens ", opt.max_new_tokens,
             " exceed model.max_position_embeddings ", cfg.max_position_embeddings);
  }
}

SampleStream::SampleStream(const SamplingOptions& opt, int64_t p_, int s_, Sample* out_)
    : p(p_), s(s_), rng(stream_of(opt.seed, p_, s_)), key(stream_of(opt.seed ^ 0x5bd1e995ull, p_, s_).next()),
      out(out_) {}

InferRequest draw_request(std::vector<int32_t> rows, const std::vector<SampleStream*>& who, const SamplingOptions& opt,
                          bool on_backend, int ahead) {
  TT_CHECK(ahead == 0 || on_backend, "draw_request: a step ahead needs the draws on the backend");
  InferRequest r;
  r.loss = false;
  r.rows = InferRequest::Rows::kList;
  r.list = std::move(rows);
  r.sample = on_backend;
  r.temperature = opt.temperature;
  r.tokens_from_draws = ahead > 0;
  if (on_backend)
    for (const SampleStream* x : who) r.keys.push_back(x->next_key(ahead));
  return r;
}

void take_draw(SampleStream& x, const InferResult& res, int r, int V, const SamplingOptions& opt, bool on_backend) {
  Draw d;
  if (on_backend) {
    d = Draw{res.tokens[r], res.logprobs[r]};
  } else {
    d = sample_token(res.logits.data() + (size_t)r * V, V, opt.temperature, opt.top_p, x.rng.uniform());
  }
  // NaN or infinite logits (weights that overflow the forward) have no distribution to draw from.
  if (!std::isfinite(d.logprob))
    throw Error(str("prompt ", x.p + 1, ", sample ", x.s + 1, ", new token ", x.out->tokens.size() + 1,
                    ": the model's logits are not finite (log-probability ", d.logprob,
                    "); its weights overflow the forward"));
  x.out->tokens.push_back(d.token);
  x.out->logprobs.push_back(d.logprob);
  if (contains(opt.stop, d.token)) x.out->finish = "stop";
  else if (contains(opt.eos, d.token)) x.out->finish = "eos";
  else if ((int)x.out->tokens.size() == opt.max_new_tokens) x.out->finish = "length";
  x.done = !x.out->finish.empty();
}

template <class E>
std::vector<Completion> generate(Decoder<E>& model, const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                                 GenerateStats* stats) {
  opt.validate();
  GenerateStats st;
  const ModelConfig& cfg = model.config();
  const int V = (int)cfg.vocab_size, K = opt.num_samples, L = model.architecture().num_layers();
  check_prompts(cfg, prompts, opt);
  auto rows_of = [&](const Prompt& p) { return (int64_t)p.tokens.size() + (int64_t)K * opt.max_new_tokens; };
  // Groups of consecutive prompts within max_batch_tokens cache rows (a larger prompt goes alone).
  std::vector<std::pair<size_t, size_t>> groups;
  int64_t most = 0;
  for (size_t i = 0; i < prompts.size();) {
    size_t j = i;
    int64_t rows = 0;
    while (j < prompts.size() && (j == i || rows + rows_of(prompts[j]) <= opt.max_batch_tokens)) rows += rows_of(prompts[j++]);
    groups.emplace_back(i, j);
    most = std::max(most, rows);
    i = j;
  }
  std::vector<Completion> out(prompts.size());
  size_t most_prompts = 0;
  for (const auto& [g0, g1] : groups) most_prompts = std::max(most_prompts, g1 - g0);
  // State slots of the recurrent layers (none allocated without them): one per prompt and sample.
  KVCache<E> cache(model, most, (int64_t)most_prompts * (1 + K));
  for (const auto& [g0, g1] : groups) {
    cache.clear();
    // Prefill: every prompt of the group as its own tree, its rows into its cache span.
    data::PackedBatch pre;
    std::vector<int64_t> span(g1 - g0);
    std::vector<int32_t> rows, last;
    for (size_t i = g0; i < g1; ++i) {
      const std::vector<int32_t>& t = prompts[i].tokens;
      const int n = (int)t.size(), start = pre.n_tokens;
      span[i - g0] = cache.reserve(n);
      pre.node_start.push_back(start);
      pre.node_len.push_back(n);
      pre.node_parent.push_back(-1);
      pre.tree_start.push_back(start);
      for (int j = 0; j < n; ++j) {
        pre.tokens.push_back(t[j]);
        pre.pos.push_back(j);
        pre.subtree_end.push_back(start + n);
        rows.push_back((int32_t)(span[i - g0] + j));
      }
      pre.n_tokens += n;
      last.push_back(pre.n_tokens - 1);
    }
    pre.tree_start.push_back(pre.n_tokens);
    std::vector<int32_t> prompt_slot;  // recurrent models: each prompt's state after its prefill
    if (cache.recurrent())
      for (size_t i = g0; i < g1; ++i) prompt_slot.push_back((int32_t)cache.reserve_slots(1));
    std::vector<Live> live;
    for (size_t i = g0; i < g1; ++i) {
      out[i].id = prompts[i].id;
      out[i].samples.resize(K);
      for (int s = 0; s < K; ++s) {
        live.emplace_back(opt, (int64_t)i, (int)(i - g0), s, cache.reserve(opt.max_new_tokens), &out[i].samples[s]);
        if (cache.recurrent()) live.back().slot = (int32_t)cache.reserve_slots(1);
      }
    }
    const bool on_backend = draws_on_backend(opt, false);  // the backend draws; else the host (nucleus)
    auto request = [&](std::vector<int32_t> rows, const std::vector<Live*>& who, int ahead = 0) {
      return draw_request(std::move(rows), std::vector<SampleStream*>(who.begin(), who.end()), opt, on_backend, ahead);
    };
    // The prefill draws every sample's first token: prompt p's last row once per sample.
    std::vector<int32_t> first_rows;
    std::vector<Live*> everyone;
    for (Live& x : live) {
      first_rows.push_back(last[x.pg]);
      everyone.push_back(&x);
    }
    const CacheWrite<E> pre_write = cache.write(rows, prompt_slot);
    const double t_pre = now_s();
    const InferResult first = model.infer(pre, request(first_rows, everyone), nullptr, &pre_write);
    st.prefill_s += now_s() - t_pre;
    st.prefill_rows += pre.n_tokens;
    ++st.forwards;

    auto take = [&](Live& x, const InferResult& res, int r) { take_draw(x, res, r, V, opt, on_backend); };
    for (size_t r = 0; r < live.size(); ++r) take(live[r], first, (int)r);

    // Decode: one row per live sample, reading its prompt's span and its own generated rows. A
    // step's row j of a sample (j tokens drawn, `ahead` of them still in flight) computes token
    // j's K/V and the next logits.
    const size_t group0 = g0;  // (a structured binding is not captured by a C++17 lambda)
    std::deque<std::vector<Live*>> flight;  // the rows of each step in flight, oldest first
    struct Drain {  // an error with a step in flight leaves none behind: the model stays usable
      Decoder<E>& m;
      ~Drain() {
        if (m.in_flight() > 0) m.infer_abandon();
      }
    } drain{model};
    auto enqueue_step = [&](const std::vector<Live*>& act, int ahead) {
      const int B = (int)act.size();
      auto drawn = [&](const Live& x) { return (int)x.out->tokens.size() + ahead; };  // its row computes token drawn(x)
      data::PackedBatch step;
      step.n_tokens = B;
      Carry<E> carry(L);
      std::vector<int32_t> write_rows;
      for (int r = 0; r < B; ++r) {
        const Live& x = *act[r];
        const int j = drawn(x);
        const int plen = (int)prompts[group0 + x.pg].tokens.size();
        step.tokens.push_back(ahead ? 0 : x.out->tokens.back());  // ahead: the draws on the backend
        step.pos.push_back(plen + j - 1);
        step.subtree_end.push_back(r + 1);
        step.node_start.push_back(r);
        step.node_len.push_back(1);
        step.node_parent.push_back(-1);
        step.tree_start.push_back(r);
        write_rows.push_back((int32_t)(x.gen_row + j - 1));
      }
      step.tree_start.push_back(B);
      // The prompt span is visible to that prompt's rows (consecutive: live is prompt-major).
      for (int r = 0; r < B;) {
        int e = r;
        while (e < B && act[e]->pg == act[r]->pg) ++e;
        cache.read(carry, span[act[r]->pg], (int)prompts[group0 + act[r]->pg].tokens.size(), r, e);
        r = e;
      }
      for (int r = 0; r < B; ++r)
        cache.read(carry, act[r]->gen_row, drawn(*act[r]) - 1, r, r + 1);
      // Recurrent layers: a sample's first step starts from its prompt's state, later ones from its own.
      std::vector<int32_t> slot_in, slot_out;
      if (cache.recurrent()) {
        for (const Live* x : act) {
          slot_in.push_back(drawn(*x) == 1 ? prompt_slot[x->pg] : x->slot);
          slot_out.push_back(x->slot);
        }
        cache.read_state(carry, slot_in);
      }
      const CacheWrite<E> w = cache.write(write_rows, slot_out);
      std::vector<int32_t> all_rows(B);
      std::iota(all_rows.begin(), all_rows.end(), 0);
      const InferRequest req = request(all_rows, act, ahead);
      ++st.decode_steps;
      st.overlapped_steps += ahead > 0;
      st.decode_rows += B;
      ++st.forwards;
      if (on_backend) {  // collected by the loop below
        model.infer_enqueue(step, req, &carry, &w);
        flight.push_back(act);
        return;
      }
      const InferResult res = model.infer(step, req, &carry, &w);  // the host draws (top_p < 1)
      st.decode_enqueue_s += res.enqueue_s;
      for (int r = 0; r < B; ++r) take(*act[r], res, r);
    };
    // With the draws on the backend the next step is enqueued before this one's draws come back
    // (its tokens are those draws, still on the backend), so the host's preparation and launches
    // overlap the backend's work. It assumes no row stops at a stop or eos id (a row that reaches
    // max_new_tokens is known to stop); a row that does stop computes one step more than it needs,
    // its draw dropped. Every draw taken is one the plain loop would take: a row's inputs, position,
    // cache rows and key are the same.
    const double t_dec = now_s();
    while (true) {
      if (flight.empty()) {
        std::vector<Live*> act;
        for (Live& x : live)
          if (!x.done) act.push_back(&x);
        if (act.empty()) break;
        enqueue_step(act, 0);
        if (flight.empty()) continue;  // the host drew (top_p < 1)
      }
      const std::vector<Live*> last = flight.back();
      bool ahead = opt.overlap && flight.size() == 1;
      for (const Live* x : last) ahead = ahead && !x->done && (int)x->out->tokens.size() + 1 < opt.max_new_tokens;
      if (ahead) enqueue_step(last, 1);
      const InferResult res = model.infer_collect();
      st.decode_enqueue_s += res.enqueue_s;
      const std::vector<Live*> rows = std::move(flight.front());
      flight.pop_front();
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r]->done) {
          ++st.dropped_rows;
          continue;
        }
        take(*rows[r], res, (int)r);
      }
    }
    st.decode_s += now_s() - t_dec;
  }
  if (stats) *stats = st;
  return out;
}

template class KVCache<CpuExec<float>>;
template class KVCache<CpuExec<double>>;
template class KVCache<CudaExec>;
template std::vector<Completion> generate<CpuExec<float>>(Decoder<CpuExec<float>>&, const std::vector<Prompt>&,
                                                          const SamplingOptions&, GenerateStats*);
template std::vector<Completion> generate<CpuExec<double>>(Decoder<CpuExec<double>>&, const std::vector<Prompt>&,
                                                           const SamplingOptions&, GenerateStats*);
template std::vector<Completion> generate<CudaExec>(Decoder<CudaExec>&, const std::vector<Prompt>&,
                                                    const SamplingOptions&, GenerateStats*);

}  // namespace tt::model
