// Segment-level execution (arXiv 2605.11744): long sequences, and long paths of trees, run segment
// by segment, in training and in inference through the same segment operator.
//
// Semantics (config section `segments`, SegmentConfig). Every path is cut by depth into segments
// of `length` S tokens (segment i: depths [i S, (i + 1) S); data::plan_segments). In every
// attention layer the KV heads split into local heads and the long-range heads of
// `long_range.heads` (grouped-query attention: a query head follows its KV head):
//   - local heads attend causally to [carried tail ; the segment]: the tail is the last M =
//     `tail` K/V rows of the path before the segment (the previous segment's last M rows, M <= S);
//   - long-range heads attend inside the segment and, in the layers `long_range.layers` only,
//     also to R = `long_range.retrieve` K/V pairs retrieved from the pool: the long-range heads'
//     keys and values of every earlier segment of the path (on a tree: the ancestors' segments
//     only), detached (no gradient ever) and never changed. Retrieval (ops/cpu/retrieval.h): the
//     previous segment's end query (its last row's queries) against the pool's keys, both
//     without RoPE, summed over the KV head's query heads; the top R, ties to the earlier
//     position, in their sequence order;
//   - the tail and the retrieved pairs are external KV prefixes of the one attention primitive
//     with head sets (ExternalKV::heads). Positions: segment i shifts its rows by
//     P_i = max(M_i, R_i) (M_i = min(M, i S), R_i = min(R, i S) with retrieval, else 0), so the
//     token at depth d sits at P_i + d - i S, and a prefix of n rows sits right before it at
//     P_i - n .. P_i - 1. That is the paper's re-indexing (prefix at 0..n-1, segment shifted by
//     n) up to one common shift, so every query-key distance, hence every RoPE score, is the
//     paper's; positions stay below S + max(M, R) however long the path. Keys are kept as
//     attention read them at the positions they were computed at, and re-rotated to the
//     segment's positions by the operator (RoPE rotations compose: R(a) R(b) = R(a + b)); the
//     pool keeps its keys without RoPE.
//   - a recurrent (Gated DeltaNet, linear_attention) layer needs no window: its state and conv
//     window continue across the boundary exactly as without segments (a segment's root starts
//     from the end state of the node it hangs from and reads that node's conv tail: the carry
//     of a partition gateway), so a model of such layers only computes the unsegmented forward.
//     Long-range layers are full_attention layers.
//
// Training (forward_backward_segmented): the loss of segment i is l_i, the weighted loss of the
// targets whose source rows lie in segment i. The objective is the truncated one,
// L_K = sum_i l_i(theta; C~_{i-1}), where the tail (and a recurrent layer's state and conv
// tail) entering segment i carries gradient through at most K = `tbptt` segment transitions
// (K = 0: detached). Its exact gradient is taken with one backward per depth: column d of a
// segment (d = 0..K) is the backward of the losses d segments below it, seeded by its own loss
// (d = 0) or by the tail gradients its children's column d - 1 pushed into its rows (d >= 1); only
// columns d < K push on into the parent (a recurrent layer's offered end states take the
// children's state gradients of depth d the same way). So every segment runs its forward once and
// up to K + 1 backwards (K = 1: two), and
// parameter gradients are the sum over columns. A segment's activations stay live until its
// last column ran and its children read their tails: K + 1 segments of a long sequence at once
// (the pool, detached, is kept for the whole path). Both backends: a column is a backward on
// the same forward's activations (Decoder::backward with `again` while columns remain, so the
// GPU's MLP recomputes the gate/up it takes its gradients in: 2 N C I multiply-adds per layer
// and extra column, no extra forward; with_loss false past column 0, so the head runs once), and
// the tail's key gradients are rotated back in the accumulators' precision (fp32 on the GPU).
// Cost per segment of a long sequence: one forward and 1 + K backwards of the blocks.
//
// Inference (SegmentedSequence, generate_segmented): a prompt is prefilled segment by segment
// through the same prefixes, then decoding runs inside the current segment with the KV cache,
// rolling into a new segment every S tokens; the logits equal the training forward's (bitwise on
// the CPU: tests/model/segments_test.cc). A recurrent layer's state and conv tail live in a state
// slot per sequence (a sample or a mark copies its source's). Both backends; the KV cache holds
// open segments only (a closed segment lives on in its successor's tail and in the pool), so the
// memory of a prefill is bounded by S rows of cache plus the pool of the long-range layers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/partition.h"
#include "model/config.h"
#include "model/segment_config.h"
#include "model/decoder.h"
#include "model/generate.h"
#include "model/partitioned.h"

namespace tt::model {

// The retrieval pool of a path, per long-range layer: K rows (without RoPE) and V rows of every
// earlier segment, as spans of the chunks that hold them (a piece's or a closed segment's rows).
template <class E>
struct PoolSpan {
  std::vector<const typename E::Act*> k, v;  // [decoder layer] null outside long_range.layers; (rows, NL, HS)
  int rows = 0;
};

// Rows of a piece or a segment as the retrieval pool keeps them, per long-range layer and for the
// long-range KV heads only (NL = |long_range.heads| of NKV: slot s the s-th such head, as
// ops/cpu/retrieval.h's pool_slot): K without RoPE (rotated back from the positions `pos` they
// were computed at) and V, copied from the rows' carry (export_carry, or the KV cache's rows).
template <class E>
class PoolChunk {
 public:
  // Rows rows[j] of layer l's k[l], v[l] (after RoPE at pos[j]; rows and pos host).
  void assign(Decoder<E>& model, const SegmentConfig& cfg, const std::vector<const typename E::Act*>& k,
              const std::vector<const typename E::Act*>& v, const std::vector<int32_t>& rows,
              const std::vector<int32_t>& pos);
  // Rows [begin, end) as a span of the pool.
  PoolSpan<E> span(int begin, int end) const;
  int rows() const { return rows_; }
  int64_t bytes() const {
    int64_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l) n += (int64_t)(k_[l].size() + v_[l].size());
    return n;
  }

 private:
  std::vector<typename E::Buffer> k_, v_;  // [layer] (rows, NL, HS); empty outside long_range.layers
  std::vector<int64_t> row_elems_;
  int rows_ = 0;
};

// One segment's history as the operator reads it: the tail (rows `tail_rows` of each attention
// layer's k / v source, computed at segment i - 1's positions), the pool, and the end query.
template <class E>
struct SegmentHistory {
  int64_t segment = 0;                          // i (0: no history)
  std::vector<const typename E::Act*> k, v;     // [decoder layer] tail sources (rows, NKV, HS)
  std::vector<int32_t> tail_rows;               // (M_i) host, rows of those sources, oldest first
  std::vector<PoolSpan<E>> pool;                // the path's earlier segments, oldest first
  std::vector<const typename E::Act*> q;        // [decoder layer] the end query (NH, HS), or null
  int32_t q_pos = 0;                            // the position it was computed at
};

// The prefixes one segment reads (its carried tail and its retrieval prefix), built from its
// history by the same code in training and inference.
template <class E>
class SegmentReads {
 public:
  using Act = typename E::Act;
  using Acc = typename E::Acc;
  SegmentReads(Decoder<E>& model, const SegmentConfig& cfg);
  SegmentReads(SegmentReads&&) = default;
  // Builds the prefixes of h.segment; with tail_grads, the tail's gradient accumulators too.
  void build(const SegmentHistory<E>& h, bool tail_grads);
  // Adds this segment's prefixes to every layer of `carry`, visible to queries [q_begin, q_end).
  void append_to(Carry<E>& carry, int q_begin, int q_end) const;
  // Whether the tail entries of `carry` (added by append_to) take gradients, zeroing the
  // accumulators when they start to.
  void set_tail_grads(Carry<E>& carry, bool on);
  // The tail gradients accumulated by a backward, rotated back to the positions the rows were
  // computed at and added to dk[l], dv[l] (rows of the tail's sources, (rows, NKV, HS) Acc).
  void push_tail_grads(const std::vector<Acc*>& dk, const std::vector<Acc*>& dv);
  int64_t tail_len() const { return tail_len_; }
  int64_t retrieved_len() const { return ret_len_; }
  // The selected pool rows of layer l ((NKV, R) host, -1 for local heads; tests).
  std::vector<int32_t> retrieved_rows(int layer) const;

 private:
  typename E::Rope rope(const int32_t* pos, int n) const;
  Decoder<E>* model_;
  const SegmentConfig* cfg_;
  int L_ = 0, NH_ = 0, NKV_ = 0, HS_ = 0;
  int64_t tail_len_ = 0, ret_len_ = 0;
  bool grads_ = false;
  std::vector<char> attention_;                    // [layer] keeps K/V
  typename E::Buffer tail_pos_, tail_rows_;        // (M_i) int32 on the backend
  std::vector<typename E::Buffer> tk_, tv_, dk_, dv_;  // [layer] (M_i, KD)
  std::vector<typename E::Buffer> rk_, rv_, idx_;      // [layer] (R_i, KD), (NKV, R_i)
  typename E::Buffer ret_pos_, q_pos_, qn_, pool_k_, pool_v_;
  mutable typename E::Buffer rope_store_;  // the RoPE table of rope() (a backend's storage)
};

struct SegmentRunStats {
  int pieces = 0;           // segment pieces run (a sequence: its segments)
  int64_t tokens = 0;       // tokens computed (each once)
  int forwards = 0, backwards = 0;  // backwards: the columns run (at most K + 1 per piece)
  int64_t peak_live_tokens = 0;     // most tokens whose activations were live at once
  int64_t pool_rows = 0;            // rows the pool held at its largest (one path)
  double nll_sum = 0;
};

// Piece k of `plan` as its batch: data::pack_piece with the segment's positions (cfg.position of
// each token's depth).
data::PackedBatch segment_batch(const SegmentConfig& cfg, const data::SegmentPlan& plan, int piece);

// What the segments of a plan execute (the FLOP API's Work): their rows and head rows, and the
// attention pairs each query sees, on average over heads and layers: its in-segment ancestors,
// the tail for the local heads and the retrieved pairs for the long-range heads of the
// long_range.layers (the paper's effective context S + a M + b (1 - a) R).
Work segment_work(const SegmentConfig& cfg, const data::SegmentPlan& plan, const ModelConfig& model);

// Training forward and backward of a tree under `cfg` (plan = data::plan_segments(tree, S)):
// grads() += the gradient of loss_scale * L_K; returns loss_scale * sum of the targets' w ce.
// Episode trees (a model with a vision tower): each segment piece runs the tower on the frames its
// slots show (load_frames fills their pixels; a frame whose slots a segment boundary cuts runs in
// both pieces); the columns' gradients of its media rows are summed and the tower's backward runs
// once, with the piece's last column (Decoder::backward's `again`), so the gradients that reach a
// frame's slot rows through later segments' tails reach the tower too.
template <class E>
double forward_backward_segmented(Decoder<E>& model, const SegmentConfig& cfg, const data::SegmentPlan& plan,
                                  double loss_scale, SegmentRunStats* stats = nullptr,
                                  const LoadPieceFrames& load_frames = {});

// The logits of every target source row of a tree's pieces from the segmented training forward,
// piece by piece (tests of training-inference consistency): rows in the tree's packed order.
template <class E>
std::vector<std::vector<double>> segmented_piece_logits(Decoder<E>& model, const SegmentConfig& cfg,
                                                        const data::SegmentPlan& plan,
                                                        const LoadPieceFrames& load_frames = {});

// Generation with segments: every prompt prefilled segment by segment (the carried tail, the pool
// and retrieval as in training), decoding inside the current segment with the KV cache and
// rolling into a new one every S tokens. Options and results as generate() (num_samples samples
// each continue their prompt's last segment). With logits_out, the logits of every position
// (prompt rows from the prefill, then each decode step's) of prompt 0's sample 0 (tests).
template <class E>
std::vector<Completion> generate_segmented(Decoder<E>& model, const SegmentConfig& cfg,
                                           const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                                           GenerateStats* stats = nullptr,
                                           std::vector<std::vector<double>>* logits_out = nullptr);

// One growing path through the segment operator in inference, row by row as it comes (a VLA
// policy's episode: its instruction, then each step's observation and action tokens): the rows
// of depths [depth(), depth() + n) prefilled through the same prefixes as training, rolling into
// a new segment every S rows, so their logits equal the segmented training forward's of the path.
// The cache holds the open segment's rows in a ring of S + `ahead` rows: at most `ahead` rows may
// be appended after a mark() and then undone by rewind() (a policy's step: its observation and
// fed-back action tokens, none of them a later step's context once rewound). With recurrent
// (Gated DeltaNet) layers the path and each live mark hold a state slot of their own, of five: at
// most three marks alive at once (a rewind copies one into a fresh slot; a policy's step takes two
// and a window's policy keeps one after the instruction).
template <class E>
class SegmentedPath {
 public:
  SegmentedPath(Decoder<E>& model, const SegmentConfig& cfg, int64_t ahead);
  ~SegmentedPath();
  SegmentedPath(const SegmentedPath&) = delete;
  SegmentedPath& operator=(const SegmentedPath&) = delete;
  int64_t depth() const { return depth_; }
  int64_t ahead() const { return ahead_; }
  // The memory the path holds: its ring of cache rows and state slots, and with retrieval the
  // pool of its closed segments (which grows with the path), in bytes.
  int64_t bytes() const;
  void clear();
  // The rows of `b` (one causal node, its media; its positions are ignored) at the path's next
  // depths; returns the logits of its last row (V). A batch that is not one valid node (a token
  // outside the vocabulary, ...) is refused before any row is appended; where the rows span
  // segments, one segment's forward at a time, so a forward failing keeps the earlier segments'
  // rows (depth() says how many) and leaves the path as it was after them (recurrent states are
  // written to a fresh slot, taken once the forward is through). A failure after a forward, as
  // its rows join their segment (an allocation), leaves the path refusing append() and mark()
  // until rewind() to an earlier mark or clear().
  std::vector<double> append(const data::PackedBatch& b);
  // The path as it is now, and back to a mark taken at most `ahead` rows ago.
  struct Mark;
  std::shared_ptr<const Mark> mark() const;
  void rewind(const std::shared_ptr<const Mark>& m);

 private:
  struct Impl;
  Decoder<E>& model_;
  const SegmentConfig cfg_;
  int64_t ahead_ = 0, depth_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tt::model
