// The FLOP API of the layer kinds: what a batch asks of the model (Work), and the FLOPs a kind
// spends on it (Flops), as model FLOPs (the conventional count MFU is stated in) and executed
// FLOPs (what the backend really runs: the LM head only on rows that predict a target).
//
// Conventions: a multiply-add is 2 FLOPs; a Linear of P weights costs 2 P per row forward and
// 4 P backward (input and weight gradients); an attention pair costs 4 HS per query head forward
// (Q K^T and P V) and 8 HS backward. Norm weights count as P weights (6 C per row in training),
// as the trainer's MFU always has; elementwise work (norms, RoPE, SwiGLU, softmax) is not counted.
// Model FLOPs charge the LM head on every packed row; executed FLOPs on Work::head_rows.
#pragma once

#include <cstdint>

#include "data/packing.h"

namespace tt::model {

enum class Pass { kTrain, kForward };  // forward + backward, or forward only

struct Work {
  int64_t tokens = 0;         // packed rows
  int64_t visible_pairs = 0;  // attention (query, key) pairs, external prefixes included
  int64_t head_rows = 0;      // rows the LM head runs on: sources of at least one target
  int64_t frames = 0;         // frames the vision tower runs on (PackedBatch::frames)
  int64_t state_rows = 0;     // rows the state projection fills

  // The batch's rows, pairs (PackedBatch::visible_pairs) and distinct target source rows.
  static Work of(const data::PackedBatch& batch);
  Work& operator+=(const Work& o) {
    tokens += o.tokens;
    visible_pairs += o.visible_pairs;
    head_rows += o.head_rows;
    frames += o.frames;
    state_rows += o.state_rows;
    return *this;
  }
};

struct Flops {
  double model = 0;
  double executed = 0;
  Flops& operator+=(const Flops& o) {
    model += o.model;
    executed += o.executed;
    return *this;
  }
};

// 2 FLOPs per multiply-add, times 3 in training (forward, input gradient, weight gradient).
inline double pass_factor(Pass p) { return p == Pass::kTrain ? 6.0 : 2.0; }

}  // namespace tt::model
