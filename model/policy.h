// A VLA policy in closed loop (issue 17): the context the episode tree gives step t in training
// (data/episode_tree.h: the instruction, then the observations of the history, each its frame
// slots and state row), built incrementally in the KV cache, and the step's action tokens
// decoded from it (greedy, restricted to a range of ids).
//
// reset() prefills the instruction (rows [0, L) of the cache). observe() appends one observation:
// with the full history it is one more node after the last (its rows stay in the cache, so each
// step computes only its own rows); with a window of W it re-prefills the instruction's
// successors from the last W observations (their positions start after the instruction, as in
// the window trie). Action tokens are never part of a later step's context: they go to rows past
// the context, given back after the step. Positions are depths, as in training.
//
// With segments (the run trained with segments.length > 0): the same context through the segment
// operator (model/segments.h SegmentedPath): each row reads the carried tail and retrieved pairs
// of its segment and the segment's earlier rows, as the segmented training forward of the step's
// path does, so the logits are that forward's; the cache holds the open segment only (a ring of
// segments.length + capacity rows), so an episode with the full history runs as long as it goes,
// and `capacity` bounds the rows one step adds (its observation and fed-back action tokens); with
// a window, a capacity that holds the window's rows and the action tokens lets each step go on
// from the instruction's end instead of prefilling the instruction again.
//
// Hybrid language models (Gated DeltaNet layers): the recurrent state and conv tail after the
// cache's rows live in a state slot beside them, and every point the cache goes back to (the
// context before a step's action tokens, the instruction for a window, the start of a failed step)
// has a copy of its state to come back to, so the logits are those of a forward of the path as
// with attention only.
#pragma once

#include <cstdint>
#include <vector>

#include "data/packing.h"
#include "model/generate.h"
#include "model/segments.h"

namespace tt::model {

// One observation: its frames' pixels (each (3, S, S), as data::tower_pixels gives them) and
// its state (empty: none).
struct Observation {
  std::vector<std::vector<float>> frames;
  std::vector<float> state;
};

template <class E>
class VlaPolicy {
 public:
  // window 0: full history. capacity: cache rows (the longest context plus the action); with
  // segments (enabled), the most rows one step adds. Throws tt::Error for segments the model
  // cannot run (SegmentConfig::validate).
  VlaPolicy(Decoder<E>& model, int window, int64_t capacity = 1 << 14, const SegmentConfig& segments = {});

  // Throws tt::Error for an instruction that is empty, holds an id outside the vocabulary or
  // leaves no row of the capacity for an observation, before anything changes (the episode goes
  // on); a reset whose prefill throws leaves no episode (act() throws until a reset succeeds).
  void reset(const std::vector<int32_t>& instruction);
  // reset() in pieces, so a server answers other clients between them: begin_reset() checks the
  // instruction as reset() does and ends the episode (act() throws until the last piece is in);
  // each reset_piece() prefills the instruction's next `rows` tokens at most (rows >= 1) and
  // returns whether all of it is in. The episode is reset()'s, its logits up to float rounding
  // (the same sums in other chunks). A piece whose prefill throws (an allocation, the forward)
  // ends the reset: no episode, as a reset that throws (rows < 1 is refused, changing nothing).
  void begin_reset(const std::vector<int32_t>& instruction);
  bool reset_piece(int64_t rows);
  // The memory its context holds (the KV cache and state slots; with segments the ring and the
  // retrieval pool, which grows with the episode), in bytes.
  int64_t bytes() const { return cache_.bytes() + (path_ ? path_->bytes() : 0); }
  // Prefills of the instruction: one a reset, and with segments and a window one more for each
  // step whose window (with its fed-back action tokens) the ring cannot hold past the instruction
  // (the steps in between go back to a mark after it).
  int64_t instruction_prefills() const { return instruction_prefills_; }
  // Tokens of the instruction in the cache (during a reset in pieces; its length after one).
  int64_t reset_done() const { return instruction_.empty() ? pending_done_ : (int64_t)instruction_.size(); }
  // Appends the step's observation and decodes `n_tokens` action tokens greedily among ids
  // [first_id, end_id). logits (optional): the first token's logits (V) before the restriction.
  // Throws tt::Error for a malformed observation, a step whose context and fed-back action
  // tokens pass the capacity, or non-finite logits; a step that throws leaves the history and
  // the cache as they were (the next step's logits are those it would have had without it).
  std::vector<int32_t> act(const Observation& obs, int n_tokens, int32_t first_id, int32_t end_id,
                           std::vector<double>* logits = nullptr);

  // The context of the last act() as one packed sequence (tokens, positions, frame slots; pixels
  // loaded): what the episode tree's path of that step holds before its action.
  data::PackedBatch context() const;

 private:
  data::PackedBatch observation_batch(const Observation& obs, int depth) const;
  // The observation's node forward reading the cache's [0, used) and writing its rows after it;
  // returns the last row's logits.
  std::vector<double> prefill(const data::PackedBatch& b);
  template <class Feed>
  std::vector<int32_t> decode(std::vector<double> logits, int n_tokens, int32_t first_id, int32_t end_id,
                              std::vector<double>* first_logits, Feed&& feed);
  std::vector<int32_t> act_segmented(const Observation& obs, int n_tokens, int32_t first_id, int32_t end_id,
                                     std::vector<double>* first_logits);

  // Recurrent layers: the cache back to `rows` rows and the state to slot `from`'s copy of it
  // (no copy when no rows came since: the state is that one).
  void rewind(int64_t rows, int32_t from);
  void save_state(int32_t slot);

  Decoder<E>& m_;
  int window_;
  KVCache<E> cache_;
  // State slots (recurrent models): after the cache's rows, after the instruction, before the
  // step, after the step's context.
  static constexpr int32_t kNow = 0, kInstruction = 1, kBefore = 2, kContext = 3, kSlots = 4;
  std::unique_ptr<SegmentedPath<E>> path_;  // with segments: the context (cache_ unused)
  // With segments and a window: the path after the instruction (null: the next step prefills it).
  std::shared_ptr<const typename SegmentedPath<E>::Mark> instruction_mark_;
  int64_t instruction_prefills_ = 0;
  std::vector<int32_t> instruction_;
  std::vector<int32_t> pending_;  // a reset in pieces: the instruction, its first pending_done_ tokens in
  int64_t pending_done_ = 0;
  std::vector<Observation> history_;  // the context's observations (the window's, or all)
};

}  // namespace tt::model
