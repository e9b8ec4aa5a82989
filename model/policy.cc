// A VLA policy in closed loop over the KV cache (see policy.h).
#include "model/policy.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "base/check.h"

namespace tt::model {
namespace {

// The rows an observation takes in the context: its frames' slots and its state row.
int64_t rows_of(const Observation& obs, int64_t tokens_per_frame) {
  return (int64_t)obs.frames.size() * tokens_per_frame + (obs.state.empty() ? 0 : 1);
}

// Throws unless every logit is finite (a NaN argmax would silently pick the range's first id).
void check_finite(const std::vector<double>& logits, int token) {
  for (size_t i = 0; i < logits.size(); ++i)
    TT_CHECK(std::isfinite(logits[i]), "policy: non-finite logits for action token ", token, " (logit ", i, " = ",
             logits[i], "); the inputs (state, pixels) or the weights are out of range");
}

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

// Tokens as one causal node at positions 0.. (the instruction, a fed-back action token).
data::PackedBatch token_batch(const std::vector<int32_t>& tokens) {
  data::PackedBatch b;
  b.tokens = tokens;
  one_node(b, (int)tokens.size(), 0);
  return b;
}

}  // namespace

template <class E>
VlaPolicy<E>::VlaPolicy(Decoder<E>& model, int window, int64_t capacity, const SegmentConfig& segments)
    : m_(model), window_(window), cache_(model, segments.enabled() ? 0 : capacity, segments.enabled() ? 0 : kSlots) {
  TT_CHECK(window >= 0, "policy: history window ", window, ", expected 0 (full) or >= 1");
  TT_CHECK(model.config().vision.enabled(), "policy: the model has no vision section");
  if (segments.enabled()) path_ = std::make_unique<SegmentedPath<E>>(model, segments, capacity);
  else if (cache_.recurrent()) cache_.reserve_slots(kSlots);
}

template <class E>
void VlaPolicy<E>::save_state(int32_t slot) {
  if (cache_.recurrent() && cache_.used() > 0) cache_.copy_state(slot, kNow);
}

template <class E>
void VlaPolicy<E>::rewind(int64_t rows, int32_t from) {
  const bool moved = cache_.used() != rows;
  cache_.truncate(rows);
  if (cache_.recurrent() && rows > 0 && moved) cache_.copy_state(kNow, from);
}

template <class E>
void VlaPolicy<E>::reset(const std::vector<int32_t>& instruction) {
  begin_reset(instruction);
  reset_piece((int64_t)instruction.size());
}

template <class E>
void VlaPolicy<E>::begin_reset(const std::vector<int32_t>& instruction) {
  TT_CHECK(!instruction.empty(), "policy: an empty instruction");
  TT_CHECK(path_ || (int64_t)instruction.size() < cache_.capacity(), "policy: an instruction of ", instruction.size(),
           " tokens exceeds the context of ", cache_.capacity(), " rows (the KV cache's; observations and the action",
           " follow the instruction)");
  const int64_t V = m_.config().vocab_size;
  for (size_t i = 0; i < instruction.size(); ++i)
    TT_CHECK(instruction[i] >= 0 && instruction[i] < V, "policy: instruction[", i, "] = ", instruction[i],
             ", expected a token id in [0, ", V, ")");
  std::vector<int32_t> copy = instruction;  // first: a copy that fails leaves the episode as it was
  pending_.clear();  // no reset under way until the path is cleared (clear() may throw)
  pending_done_ = 0;
  instruction_mark_.reset();
  cache_.truncate(0);  // the rows (the state slots stay reserved)
  history_.clear();
  instruction_.clear();  // until the last piece is in: a failed reset leaves no episode to act in
  if (path_) path_->clear();
  pending_ = std::move(copy);
}

template <class E>
bool VlaPolicy<E>::reset_piece(int64_t rows) {
  TT_CHECK(rows >= 1, "policy: a reset piece of ", rows, " rows, expected >= 1");
  TT_CHECK(!pending_.empty(), "policy: reset_piece() without begin_reset()");
  const int64_t at = pending_done_, n = std::min<int64_t>(rows, (int64_t)pending_.size() - at);
  try {
    data::PackedBatch b = token_batch(std::vector<int32_t>(pending_.begin() + at, pending_.begin() + at + n));
    if (path_) {
      path_->append(b);  // at the path's next depths
    } else {
      one_node(b, (int)n, (int)at);  // after the cache's rows
      prefill(b);
    }
    pending_done_ += n;
    if (pending_done_ < (int64_t)pending_.size()) return false;
    if (!path_) save_state(kInstruction);
    if (path_ && window_ > 0) instruction_mark_ = path_->mark();  // each step's window goes on from it
    ++instruction_prefills_;
    instruction_ = std::move(pending_);
  } catch (...) {
    pending_.clear();  // first (clear() below may throw): no reset to go on with
    pending_done_ = 0;
    cache_.truncate(0);
    if (path_) path_->clear();
    throw;
  }
  pending_.clear();
  pending_done_ = 0;
  return true;
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
  // Recurrent layers start from the state after the cache's rows and leave theirs in its place.
  std::vector<int32_t> slot_out;
  if (cache_.recurrent()) {
    cache_.read_state(carry, {used > 0 ? kNow : -1});
    slot_out = {kNow};
  }
  const int64_t begin = cache_.reserve(n);
  std::vector<int32_t> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = (int32_t)(begin + i);
  const CacheWrite<E> w = cache_.write(rows, slot_out);
  InferRequest req;
  req.loss = false;
  req.rows = InferRequest::Rows::kList;
  req.list = {n - 1};
  return m_.infer(b, req, used > 0 || cache_.recurrent() ? &carry : nullptr, &w).logits;
}

// The action tokens from the context's last logits, greedily among [first_id, end_id): each but
// the last fed back (feed(b, k): token k as a one-row batch, reading the context and the action's
// earlier tokens; returns its logits).
template <class E>
template <class Feed>
std::vector<int32_t> VlaPolicy<E>::decode(std::vector<double> logits, int n_tokens, int32_t first_id, int32_t end_id,
                                          std::vector<double>* first_logits, Feed&& feed) {
  check_finite(logits, 0);
  if (first_logits) *first_logits = logits;
  std::vector<int32_t> out;
  for (int k = 0; k < n_tokens; ++k) {
    const int32_t tok = (int32_t)(std::max_element(logits.begin() + first_id, logits.begin() + end_id) - logits.begin());
    out.push_back(tok);
    if (k + 1 == n_tokens) break;
    data::PackedBatch b = token_batch({tok});
    logits = feed(b, k);
    check_finite(logits, k + 1);
  }
  return out;
}

template <class E>
std::vector<int32_t> VlaPolicy<E>::act(const Observation& obs, int n_tokens, int32_t first_id, int32_t end_id,
                                       std::vector<double>* first_logits) {
  const int V = (int)m_.config().vocab_size;
  TT_CHECK(n_tokens >= 1 && 0 <= first_id && first_id < end_id && end_id <= V, "policy: ", n_tokens,
           " action tokens among ids [", first_id, ", ", end_id, "), expected >= 1 in the vocabulary of ", V);
  TT_CHECK(!instruction_.empty(), "policy: act() before reset()",
           pending_.empty() ? "" : " is done (the instruction's pieces are still coming)");
  observation_batch(obs, 0);  // checks the observation before anything changes
  if (path_) return act_segmented(obs, n_tokens, first_id, end_id, first_logits);
  // The step's rows: its context (the cache's earlier rows with the full history, the instruction
  // and the window's observations with a window) and the action tokens fed back (all but the last).
  const int64_t P = m_.config().vision.tokens_per_frame(), used = cache_.used();
  int64_t need = rows_of(obs, P) + n_tokens - 1;
  if (window_ == 0) {
    need += used;
  } else {
    need += (int64_t)instruction_.size();
    for (size_t i = history_.size() + 1 > (size_t)window_ ? history_.size() + 1 - window_ : 0; i < history_.size(); ++i)
      need += rows_of(history_[i], P);
  }
  TT_CHECK(need <= cache_.capacity(), "policy: the step needs ", need, " rows (its context and ", n_tokens - 1,
           " fed-back action tokens), more than the context of ", cache_.capacity(), " rows",
           window_ == 0 ? " (the full history grows every step: reset the episode)" : "");
  // A failed step leaves the history and the cache as they were: the new observation comes off
  // the history (the one it pushed out of the window goes back) and the cache gives back the
  // step's rows (with a window the next step rebuilds its rows after the instruction anyway).
  // What may fail before the try changes nothing: the saved state and `dropped`'s room first,
  // then the history (push_back's copy failing leaves it as it was; the rest cannot fail).
  if (window_ == 0) save_state(kBefore);  // a window's failed step goes back to the instruction
  std::vector<Observation> dropped;
  dropped.reserve(1);
  history_.push_back(obs);
  if (window_ > 0 && (int)history_.size() > window_) {
    dropped.push_back(std::move(history_.front()));
    history_.erase(history_.begin());
  }
  try {
    int depth = (int)instruction_.size();
    std::vector<double> logits;
    if (window_ == 0) {  // the earlier observations' rows are in the cache already
      depth = (int)used;
      const data::PackedBatch b = observation_batch(obs, depth);
      logits = prefill(b);
      depth += b.n_tokens;
    } else {
      rewind((int64_t)instruction_.size(), kInstruction);
      for (const Observation& o : history_) {
        const data::PackedBatch b = observation_batch(o, depth);
        logits = prefill(b);
        depth += b.n_tokens;
      }
    }
    const int64_t context_rows = cache_.used();
    if (n_tokens > 1) save_state(kContext);  // rows follow only with fed-back action tokens
    const std::vector<int32_t> out = decode(std::move(logits), n_tokens, first_id, end_id, first_logits,
                                            [&](data::PackedBatch& b, int k) {
                                              b.pos = {depth + k};
                                              return prefill(b);
                                            });
    rewind(context_rows, kContext);  // actions are no later step's context
    return out;
  } catch (...) {
    history_.pop_back();
    if (!dropped.empty()) history_.insert(history_.begin(), std::move(dropped.front()));
    if (window_ == 0) rewind(used, kBefore);
    else rewind((int64_t)instruction_.size(), kInstruction);
    throw;
  }
}

// The same step through the segment operator: with the full history the observation's rows
// follow the path's (a mark before them undoes a failed step), with a window the path is rebuilt
// from the instruction; the action tokens fed back are undone after the step (a mark after the
// context).
template <class E>
std::vector<int32_t> VlaPolicy<E>::act_segmented(const Observation& obs, int n_tokens, int32_t first_id,
                                                 int32_t end_id, std::vector<double>* first_logits) {
  const int64_t P = m_.config().vision.tokens_per_frame();
  const int64_t step = rows_of(obs, P) + n_tokens - 1;
  if (step > path_->ahead())
    throw Error(str("policy: the step adds ", step, " rows (its observation and ", n_tokens - 1,
                    " fed-back action tokens), more than the ", path_->ahead(),
                    " one step may add with segments (the capacity)"));
  const auto before = path_->mark();  // first: a mark that cannot be taken leaves the history as it was
  std::vector<Observation> dropped;
  dropped.reserve(1);  // then nothing fails between the history's change and the try
  history_.push_back(obs);
  if (window_ > 0 && (int)history_.size() > window_) {
    dropped.push_back(std::move(history_.front()));
    history_.erase(history_.begin());
  }
  try {
    std::vector<double> logits;
    if (window_ == 0) {
      logits = path_->append(observation_batch(obs, 0));
    } else {
      // The window's rows after the instruction: back to the mark after it while every step since
      // it added no more rows than the ring holds past it (the rows before it are then still
      // there), else the instruction again.
      int64_t need = n_tokens - 1;
      for (const Observation& o : history_) need += rows_of(o, P);
      const int64_t at = (int64_t)instruction_.size();
      if (instruction_mark_ && need <= path_->ahead() && path_->depth() >= at) {
        path_->rewind(instruction_mark_);
      } else {
        instruction_mark_.reset();
        path_->clear();
        path_->append(token_batch(instruction_));
        ++instruction_prefills_;
        if (need <= path_->ahead()) instruction_mark_ = path_->mark();
      }
      for (const Observation& o : history_) logits = path_->append(observation_batch(o, 0));
    }
    const auto context = path_->mark();
    const std::vector<int32_t> out = decode(std::move(logits), n_tokens, first_id, end_id, first_logits,
                                            [&](data::PackedBatch& b, int) { return path_->append(b); });
    path_->rewind(context);  // actions are no later step's context
    return out;
  } catch (...) {
    history_.pop_back();
    if (!dropped.empty()) history_.insert(history_.begin(), std::move(dropped.front()));
    // With a window the next step rebuilds the path: cleared here, so a path a failure left half
    // updated (SegmentedPath::append) does not refuse that step's first mark.
    if (window_ == 0) path_->rewind(before);
    else path_->clear();
    throw;
  }
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
