// Partitioned training of one tree: its pieces (data/partition.h) run through the decoder one at
// a time, ancestors crossing each cut as differentiable gateways. One scheduler for every
// backend (the decoder's Carry is the gateway).
//
// Schedule (Partition::schedule): forward a piece with its gateway as its carry (per layer one
// external KV prefix per gateway segment, pointing straight at the resident ancestor pieces'
// exported rows: nothing is recomputed or copied); then its child pieces, recursively; then the
// piece's backward. Each piece owns per-layer carry-gradient accumulators (N_piece rows, in the
// backend's Acc precision: fp32 on the GPU); a child's backward adds (+=) its gateway gradients
// into the accumulators of the ancestor pieces its segments point at, and a piece's backward adds
// its own accumulators to the gradient of its rows (the relay carry). Since every descendant
// finishes before its ancestor's backward, those gradients are complete when they are used.
// Activations live only for the pieces on the current root-to-piece chain.
//
// With `recompute` (partition.recompute), a piece that has child pieces keeps only what they
// read: its forward is a no-grad one that stores the piece's per-layer K/V rows (as attention
// reads them) and its offered recurrent states and conv tails, and its activations are dropped;
// after its children, its backward runs the training forward again (same batch, same gateway,
// hence the same K/V rows) and then the backward. What stays resident along the chain is then
// the K/V rows (bf16 on the GPU) and their fp32 gradient accumulators, not the activations; a leaf
// piece trains as before. Cost: one more forward of the blocks for every non-leaf piece.
//
// Limits: one gateway segment is one external prefix of the attention, so a piece's gateway may
// have at most E::kMaxExternalKV segments (a tt::Error says so otherwise).
//
// Recurrent layers (a hybrid's Gated DeltaNet): a piece offers the end state and conv tail of
// each node a child piece hangs from (LayerCarry::offer_*); the child's root starts from that
// state, its conv window reads that tail, and its backward adds their gradients (fp32 or wider)
// into the parent's accumulators, which the parent's backward feeds into the delta rule's
// end-state gradient and its conv inputs (and, through its own root, further up).
//
// Exactness: the loss, parameter gradients and hence the update equal unpartitioned training of
// the tree (tests/equivalence/partition_test.cc), because every query sees the same keys (gateway
// rows = the ancestor chain), every recurrent root the same state and conv window, and every K/V
// row, state and conv row receives the gradients of all its readers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/check.h"
#include "data/partition.h"
#include "data/tree.h"
#include "model/decoder.h"

namespace tt::model {

struct PartitionRunStats {
  int64_t tokens_processed = 0;   // sum of piece tokens (== n_tree: each token's loss and gradient once)
  int64_t tokens_recomputed = 0;  // recompute: tokens whose forward ran twice (the non-leaf pieces')
  int64_t peak_live_tokens = 0;   // most tokens whose activations were resident at once
  int64_t peak_kept_tokens = 0;   // recompute: most tokens resident as K/V rows only (no activations)
  int pieces = 0;
  int pieces_recomputed = 0;      // recompute: pieces that kept only their rows (counted as they ran)
  double nll_sum = 0;             // the pieces' unweighted NLL sums (Losses::nll_sum)
};

// Recurrent layers across pieces (partitions and segments): a child piece's root starts from the
// end state and conv tail of the node it hangs from, which its parent piece offers. For a plan of
// `split`: each node's index in its piece's batch; the nodes of piece k its child pieces hang from
// (distinct, in child order: the piece's offers); and which of its parent's offers piece k reads
// (tree_id names the tree in the error for an inconsistent plan).
// (Made once per plan, linear in its nodes and pieces.)
struct PieceOffers {
  PieceOffers(const data::Tree& split, const data::Partition& plan);
  const std::vector<int32_t>& offers(int k) const { return offers_[k]; }
  int32_t parent_slot(int k, const std::string& tree_id) const;

 private:
  const data::Partition* plan_;
  std::vector<std::vector<int32_t>> offers_;  // [piece] batch indices of the nodes it offers
  std::vector<int32_t> slot_, listed_by_;     // [piece] its slot among its parent's offers; that parent
};

// Whether piece k keeps only its K/V rows between its forward and its backward (recompute).
inline bool keeps_rows_only(const data::Partition& plan, int k, bool recompute) {
  return recompute && !plan.pieces[k].child_pieces.empty();
}

// Walks plan.schedule for both backends' executors: forward(k) and backward(k) run piece k's
// halves; the walk checks that each piece runs forward, then (after all its child pieces)
// backward, exactly once, that gateways only read resident pieces, and counts the resident
// tokens (with `recompute`, a non-leaf piece's activations are resident only during its
// backward; the counts equal the plan's max_piece_tokens, kept_peak_tokens and
// recompute_tokens). Returns the run's statistics.
template <class Forward, class Backward>
PartitionRunStats walk_partition_schedule(const data::Partition& plan, const std::string& tree_id, Forward&& forward,
                                          Backward&& backward, bool recompute = false) {
  const int P = plan.num_pieces();
  TT_CHECK(P > 0, "partition of tree '", tree_id, "' has no pieces");
  TT_CHECK(plan.schedule.size() == 2 * (size_t)P, "partition of tree '", tree_id, "': schedule has ",
           plan.schedule.size(), " steps, expected ", 2 * P);
  std::vector<char> live(P, 0), done(P, 0);
  int64_t live_tokens = 0, kept_tokens = 0;
  PartitionRunStats st;
  st.pieces = P;
  for (const data::Step& step : plan.schedule) {
    const int k = step.piece;
    const data::Piece& piece = plan.pieces[k];
    if (step.phase == data::Phase::kForward) {
      TT_CHECK(!live[k] && !done[k], "partition schedule runs the forward of piece ", k, " twice");
      for (const data::GatewaySegment& seg : piece.gateway)
        TT_CHECK(seg.piece < k && live[seg.piece], "piece ", k, " reads a gateway of piece ", seg.piece,
                 ", which is not resident (schedule or plan is inconsistent)");
      forward(k);
      live[k] = 1;
      st.tokens_processed += piece.tokens;
      if (keeps_rows_only(plan, k, recompute)) {
        kept_tokens += piece.tokens;
        st.tokens_recomputed += piece.tokens;
        st.peak_kept_tokens = std::max(st.peak_kept_tokens, kept_tokens);
        // its no-grad forward's working set is one block's, not counted as activations
      } else {
        live_tokens += piece.tokens;
        st.peak_live_tokens = std::max(st.peak_live_tokens, live_tokens);
      }
    } else {
      TT_CHECK(live[k], "partition schedule runs the backward of piece ", k, " before its forward");
      for (int c : piece.child_pieces)
        TT_CHECK(done[c], "partition schedule runs the backward of piece ", k, " before that of its child ", c);
      if (keeps_rows_only(plan, k, recompute))  // the training forward again, then the backward
        st.peak_live_tokens = std::max(st.peak_live_tokens, live_tokens + piece.tokens);
      backward(k);
      live[k] = 0;
      done[k] = 1;
      (keeps_rows_only(plan, k, recompute) ? kept_tokens : live_tokens) -= piece.tokens;
    }
  }
  for (int k = 0; k < P; ++k) TT_CHECK(done[k], "partition schedule leaves piece ", k, " without a backward");
  return st;
}

// Fills a piece batch's pixels (PackedBatch::pixels) before it runs, as data::load_frames does a
// micro-batch's: episode trees (the trainer decodes each piece's frames when the piece comes).
// Called only for a piece with frames.
using LoadPieceFrames = std::function<void(data::PackedBatch&)>;

// Forward and backward of `split_tree` (data::split_long_nodes output) through `plan`
// (data::plan_partition of it): grads() += d(loss)/d(params); returns loss_scale * sum w * ce.
// recompute: non-leaf pieces keep only their K/V rows and run their forward again before their
// backward (above); the same loss and gradients. Episode trees (a model with a media stage): each
// piece runs the tower on its own frames (load_frames fills their pixels); a frame's tower output
// reaches later pieces as K/V rows like any other row.
template <class E>
double forward_backward_partitioned(Decoder<E>& model, const data::Tree& split_tree, const data::Partition& plan,
                                    double loss_scale, PartitionRunStats* stats = nullptr, bool recompute = false,
                                    const LoadPieceFrames& load_frames = {});

}  // namespace tt::model
