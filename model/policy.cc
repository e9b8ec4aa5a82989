// A VLA policy in closed loop over the KV cache (see policy.h).
#include "model/policy.h"

#include <algorithm>
#include <memory>

#include "base/check.h"

namespace tt::model {
namespace {

// n rows as one causal node at positions first_pos.. (a chain; its metadata only).
void one_node(data::PackedBatch& b, int n, int first_pos) {
  b.n_tokens = n;
  b.pos.clear();
  b.subtree_end.assign(n, n);
  for (int i = 0; i < n; ++i) b.pos.push_back(first_pos + i);
  b.node_start = {0};
  b.node_len = {n};
  b.node_parent = {-1};
  b.tree_start = {0, n};
}

}  // namespace

template <class E>
VlaPolicy<E>::VlaPolicy(Decoder<E>& model, int window, int64_t capacity)
    : m_(model), window_(window), cache_(model, capacity) {
  TT_CHECK(window >= 0, "policy: history window ", window, ", expected 0 (full) or >= 1");
  TT_CHECK(model.config().vision.enabled(), "policy: the model has no vision section");
}

template <class E>
void VlaPolicy<E>::reset(const std::vector<int32_t>& instruction) {
  TT_CHECK(!instruction.empty(), "policy: an empty instruction");
  cache_.clear();
  history_.clear();
  instruction_ = instruction;
  data::PackedBatch b;
  b.tokens = instruction;
  one_node(b, (int)instruction.size(), 0);
  prefill(b);
}

template <class E>
data::PackedBatch VlaPolicy<E>::observation_batch(const Observation& obs, int depth) const {
  const VisionConfig& v = m_.config().vision;
  const int P = (int)v.tokens_per_frame(), S = (int)v.image_size;
  data::PackedBatch b;
  b.tokens_per_frame = P;
  b.image_size = S;
  for (const std::vector<float>& px : obs.frames) {
    TT_CHECK(px.size() == (size_t)3 * S * S, "policy: a frame of ", px.size(), " values, expected 3 x ", S, " x ", S);
    b.slot_row.push_back((int32_t)b.tokens.size());
    b.slot_frame.push_back((int32_t)b.frames.size());
    b.frames.push_back(data::FrameRef{});
    b.pixels.insert(b.pixels.end(), px.begin(), px.end());
    b.tokens.insert(b.tokens.end(), P, (int32_t)v.image_token_index);
  }
  if (!obs.state.empty()) {
    b.state_dim = (int)obs.state.size();
    b.state_row.push_back((int32_t)b.tokens.size());
    b.state = obs.state;
    b.tokens.push_back((int32_t)v.state_token_index);
  }
  TT_CHECK(!b.tokens.empty(), "policy: an observation without frames or state");
  one_node(b, (int)b.tokens.size(), depth);
  return b;
}

template <class E>
std::vector<double> VlaPolicy<E>::prefill(const data::PackedBatch& b) {
  const int n = b.n_tokens, L = m_.architecture().num_layers();
  const int64_t used = cache_.used();
  Carry<E> carry(L);
  if (used > 0) cache_.read(carry, 0, (int)used, 0, n);
  const int64_t begin = cache_.reserve(n);
  std::vector<int32_t> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = (int32_t)(begin + i);
  const CacheWrite<E> w = cache_.write(rows);
  InferRequest req;
  req.loss = false;
  req.rows = InferRequest::Rows::kList;
  req.list = {n - 1};
  return m_.infer(b, req, used > 0 ? &carry : nullptr, &w).logits;
}

template <class E>
std::vector<int32_t> VlaPolicy<E>::act(const Observation& obs, int n_tokens, int32_t first_id, int32_t end_id,
                                       std::vector<double>* first_logits) {
  const int V = (int)m_.config().vocab_size;
  TT_CHECK(n_tokens >= 1 && 0 <= first_id && first_id < end_id && end_id <= V, "policy: ", n_tokens,
           " action tokens among ids [", first_id, ", ", end_id, "), expected >= 1 in the vocabulary of ", V);
  TT_CHECK(!instruction_.empty(), "policy: act() before reset()");
  history_.push_back(obs);
  int depth = (int)instruction_.size();
  std::vector<double> logits;
  if (window_ == 0) {  // the earlier observations' rows are in the cache already
    depth = (int)cache_.used();
    const data::PackedBatch b = observation_batch(obs, depth);
    logits = prefill(b);
    depth += b.n_tokens;
  } else {
    if ((int)history_.size() > window_) history_.erase(history_.begin());
    cache_.truncate((int64_t)instruction_.size());
    for (const Observation& o : history_) {
      const data::PackedBatch b = observation_batch(o, depth);
      logits = prefill(b);
      depth += b.n_tokens;
    }
  }
  if (first_logits) *first_logits = logits;
  const int64_t context_rows = cache_.used();
  std::vector<int32_t> out;
  for (int k = 0; k < n_tokens; ++k) {
    const int32_t tok =
        (int32_t)(std::max_element(logits.begin() + first_id, logits.begin() + end_id) - logits.begin());
    out.push_back(tok);
    if (k + 1 == n_tokens) break;
    data::PackedBatch b;  // the token, reading the context and the action's earlier tokens
    b.tokens = {tok};
    one_node(b, 1, depth + k);
    logits = prefill(b);
  }
  cache_.truncate(context_rows);  // actions are no later step's context
  return out;
}

template <class E>
data::PackedBatch VlaPolicy<E>::context() const {
  data::PackedBatch c;
  c.tokens = instruction_;
  for (const Observation& o : history_) {
    const data::PackedBatch b = observation_batch(o, 0);
    const int32_t at = (int32_t)c.tokens.size(), f0 = (int32_t)c.frames.size();
    c.tokens.insert(c.tokens.end(), b.tokens.begin(), b.tokens.end());
    for (size_t s = 0; s < b.slot_row.size(); ++s) {
      c.slot_row.push_back(at + b.slot_row[s]);
      c.slot_frame.push_back(f0 + b.slot_frame[s]);
    }
    c.frames.insert(c.frames.end(), b.frames.begin(), b.frames.end());
    c.pixels.insert(c.pixels.end(), b.pixels.begin(), b.pixels.end());
    for (int32_t r : b.state_row) c.state_row.push_back(at + r);
    c.state.insert(c.state.end(), b.state.begin(), b.state.end());
    c.tokens_per_frame = b.tokens_per_frame;
    c.image_size = b.image_size;
    c.state_dim = std::max(c.state_dim, b.state_dim);
  }
  one_node(c, (int)c.tokens.size(), 0);
  return c;
}

template class VlaPolicy<CpuExec<float>>;
template class VlaPolicy<CpuExec<double>>;

}  // namespace tt::model
