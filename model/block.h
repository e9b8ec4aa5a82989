// What the decoder loop and the layer kinds share: the batch as the ops see it, the carry (what
// crosses a cut), and the interface of a residual block.
//
// The decoder (model/decoder.h) is an input stage, a list of residual blocks and a head. A layer
// of the Hugging Face model is two blocks: its mixer (attention; later Gated DeltaNet) and its
// MLP. A block computes x_out = x_in + f(norm(x_in)) and its exact reverse; it owns its
// parameters (a slice of the table), the layout of what its forward saves, and its FLOP count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/exec.h"
#include "model/flops.h"
#include "model/param_table.h"

namespace tt::model {

// A packed batch as the ops read it, on the backend's memory (the decoder uploads it once per
// forward). Head rows are the rows that are the source of a target, ascending; targets are
// sorted stably by their source and their src indexes head_rows.
template <class E>
struct BatchView {
  int N = 0;
  const int32_t* tokens = nullptr;  // (N)
  const int32_t* pos = nullptr;     // (N) depth positions
  typename E::Layout layout{};      // the attention's view of the DFS layout
  typename E::Rope rope{};
  int n_rows = 0;
  const int32_t* head_rows = nullptr;  // (n_rows)
  typename E::Targets targets{};       // (n_tgt)
};

// The carry: what one piece of a sequence or tree hands to the pieces that read it, per layer,
// with the gradient that comes back. A partition gateway, a segment's carried KV tail and the
// inference KV cache are all carries.
//   Reading side: carry[l].kv lists the external KV prefixes layer l's attention reads (each a
//   span of rows with its own query range; its dk/dv, when set, accumulate the readers' gradient
//   in Acc precision, fp32 on the GPU).
//   Writing side: Decoder::export_carry gives a forward's own rows (K/V as attention reads them,
//   after norms and RoPE) as one entry per layer; the caller points dk/dv at its accumulators and
//   passes the same carry to backward(), which adds them to the gradient of those rows.
// Layers without cross-piece state (the MLP) have an empty entry.
//   Recurrent layers (Gated DeltaNet) read, per root of the batch (roots in node order), the state
//   it starts from and its conv context (the last K - 1 pre-conv rows of its path before the root,
//   oldest first) from slot state_slot[r] of `state` and `conv`; slot -1 starts from zeros (a
//   carry given to a recurrent layer lists every root's slot; no carry: zeros). The inference
//   cache keeps them per prompt and per sample (model/generate.h). In training (a partition
//   gateway) the reader's backward adds its roots' state and conv-context gradients into slot
//   state_slot[r] of d_state and d_conv (Acc, +=). The offering side of a forward (training, or
//   no-grad for partition.recompute's first pass, which needs no gradient buffers):
//   node offer_node[s] of the batch leaves its end state and conv tail in slot s of offer_state /
//   offer_conv (what its child pieces read), and its backward adds the gradients the readers left
//   in slot s of offer_d_state / offer_d_conv (complete by then: readers run backward first).
//   Segments (model/segments.h) read their carried tail and retrieval prefix as kv entries whose
//   head sets (KV::heads) split local from long-range heads; their keys, kept at the positions
//   they were computed at, are re-rotated to the segment's positions by the segment operator.
//   export_carry also gives an attention layer's queries (q): a segment's end query scores the
//   retrieval pool.
template <class E>
struct LayerCarry {
  std::vector<typename E::KV> kv;
  const typename E::Act* q = nullptr;      // export_carry: (N, NH, HS) the rows' queries, after RoPE
  const typename E::Acc* state = nullptr;  // (slots, recurrent_state_elems) fp32 or wider
  const typename E::Act* conv = nullptr;   // (slots, conv_context_elems)
  std::vector<int32_t> state_slot;         // (num_roots) host; empty: every root from zeros
  typename E::Acc* d_state = nullptr;      // training: (slots, recurrent_state_elems) +=
  typename E::Acc* d_conv = nullptr;       // training: (slots, conv_context_elems) +=
  std::vector<int32_t> offer_node;         // (offers) host, nodes of the batch
  typename E::Acc* offer_state = nullptr;  // (offers, recurrent_state_elems) forward writes
  typename E::Act* offer_conv = nullptr;   // (offers, conv_context_elems) forward writes
  const typename E::Acc* offer_d_state = nullptr;  // (offers, recurrent_state_elems) backward reads
  const typename E::Acc* offer_d_conv = nullptr;   // (offers, conv_context_elems) backward reads
};
template <class E>
using Carry = std::vector<LayerCarry<E>>;  // [decoder layer]

// Where a no-grad forward stores what later batches read (the inference KV cache): batch row i's
// K and V of layer l go to row rows[i] of k[l], v[l] ((capacity, NKV, HS) each, after norms and
// RoPE, as attention reads them). Layers without a cache entry have null pointers.
// A recurrent layer stores, per root r with state_slot[r] >= 0, its state after the root's last
// row and the last K - 1 pre-conv rows of that row's path into slot state_slot[r] of state[l] and
// conv[l] (each tree of such a batch is one node: a prompt, a decode row).
// q[l], where set, receives the batch's query rows of attention layer l as attention read them,
// (N, NH, HS) in batch order (segmented inference keeps a segment's end query for retrieval).
template <class E>
struct CacheWrite {
  std::vector<typename E::Act*> k, v;  // [decoder layer]
  std::vector<typename E::Act*> q;     // [decoder layer] or empty; null where not kept
  std::vector<int32_t> rows;           // (N) host
  std::vector<typename E::Acc*> state;  // [decoder layer] null where the layer keeps none
  std::vector<typename E::Act*> conv;   // [decoder layer]
  std::vector<int32_t> state_slot;      // (num_roots) host; empty: no state stored
};

// The arguments of one block call. Pointers are on the backend's memory.
template <class E>
struct BlockCall {
  Mode mode = Mode::kTrain;
  const BatchView<E>* batch = nullptr;
  const typename E::Weight* w = nullptr;  // the flat weight buffer (table offsets)
  typename E::Param* g = nullptr;         // the flat gradient buffer (backward: +=)
  char* saved = nullptr;                  // this block's region of saved_bytes(N)
  char* scratch = nullptr;                // backward's region of scratch_bytes(N), shared by all blocks
  const typename E::Act* x_in = nullptr;  // (N, C) forward: the residual stream entering
  typename E::Act* x_out = nullptr;       // (N, C) forward: the residual stream leaving
  typename E::Act* dx = nullptr;          // (N, C) backward: d x_out in, d x_in out
  typename E::Acc* sum = nullptr;         // (N, C) an Acc buffer shared by all blocks
  const LayerCarry<E>* carry = nullptr;   // what this layer reads from outside the batch, or null
  const LayerCarry<E>* relay = nullptr;   // backward: gradients relayed into this batch's rows
  bool keep_saved = false;                // backward: leave `saved` intact (another backward follows)
  // No-grad forward with a CacheWrite: this layer's cache buffers and the batch's rows there.
  typename E::Act* store_k = nullptr;
  typename E::Act* store_v = nullptr;
  const int32_t* store_rows = nullptr;  // (N) on the backend's memory
  typename E::Act* store_q = nullptr;   // (N, NH, HS) the batch's queries (CacheWrite::q), or null
  // ... and a recurrent layer's state and conv slots (CacheWrite::state_slot, host).
  typename E::Acc* store_state = nullptr;
  typename E::Act* store_conv = nullptr;
  const std::vector<int32_t>* store_slot = nullptr;
};

// RMSNorm calls with a weight offset (1: Qwen3.5's zero-centred weights, applied as 1 + w): the
// backends with the Qwen3.5 ops take it (E::kHybridOps); the others only run offset 0 (their
// check_model refuses Qwen3.5), so the argument is dropped for them.
template <class E, class... A>
void norm_forward(E& e, double offset, A... a) {
  if constexpr (E::kHybridOps) e.rmsnorm_forward(a..., offset);
  else e.rmsnorm_forward(a...);
}
template <class E, class... A>
void norm_backward(E& e, double offset, A... a) {
  if constexpr (E::kHybridOps) e.rmsnorm_backward(a..., offset);
  else e.rmsnorm_backward(a...);
}
template <class E, class... A>
void qk_norm_backward(E& e, double offset, A... a) {
  if constexpr (E::kHybridOps) e.qk_norm_rope_backward(a..., offset);
  else e.qk_norm_rope_backward(a...);
}

// A layer kind's backend-independent half: which decoder layer it belongs to, its parameter
// slice, and its FLOP count. Its math lives in templates over the backend (forward<E>,
// backward<E>, saved_bytes<E>, ...), which BlockOf<K, E> turns into a Block<E>.
class LayerKind {
 public:
  virtual ~LayerKind() = default;
  virtual std::string kind() const = 0;  // "full_attention", "swiglu_mlp", ...
  virtual Flops flops(const Work& w, Pass p) const = 0;
  int layer() const { return layer_; }
  const ParamSlice& params() const { return slice_; }
  // A recurrent layer's per-sequence state kept by the inference cache (LayerCarry::state, conv):
  // elements of its recurrent state and of its conv context; 0 for stateless kinds.
  virtual int64_t recurrent_state_elems() const { return 0; }
  virtual int64_t conv_context_elems() const { return 0; }

 protected:
  LayerKind(int layer, const ParamSlice& slice) : layer_(layer), slice_(slice) {}
  int layer_;
  ParamSlice slice_;
};

// A residual block as the decoder loop runs it on backend E.
template <class E>
class Block {
 public:
  virtual ~Block() = default;
  virtual const LayerKind& spec() const = 0;
  // Bytes of what forward saves for N rows, and of backward's scratch (shared by all blocks).
  virtual size_t saved_bytes(int N) const = 0;
  virtual size_t scratch_bytes(int N) const = 0;
  virtual void forward(E& e, const BlockCall<E>& c) const = 0;
  virtual void backward(E& e, const BlockCall<E>& c) const = 0;
  // The rows this block offers to readers outside the batch (its carry entry), from its saved
  // region of a forward of N rows; dk/dv are left null. Kinds without cross-piece state leave it
  // empty.
  virtual void export_carry(const char* saved, int N, LayerCarry<E>& out) const = 0;
  // Elements per row of the gradient accumulators of export_carry's entries (dk and dv each).
  virtual int64_t carry_row_elems() const = 0;
};

// Block<E> of a kind K that provides, as templates over E: saved_bytes, scratch_bytes, forward,
// backward, export_carry, carry_row_elems (the kind's .cc instantiates them for every backend).
template <class K, class E>
class BlockOf final : public Block<E> {
 public:
  explicit BlockOf(const K& k) : k_(k) {}
  const LayerKind& spec() const override { return k_; }
  size_t saved_bytes(int N) const override { return k_.template saved_bytes<E>(N); }
  size_t scratch_bytes(int N) const override { return k_.template scratch_bytes<E>(N); }
  void forward(E& e, const BlockCall<E>& c) const override { k_.template forward<E>(e, c); }
  void backward(E& e, const BlockCall<E>& c) const override { k_.template backward<E>(e, c); }
  void export_carry(const char* saved, int N, LayerCarry<E>& out) const override {
    k_.template export_carry<E>(saved, N, out);
  }
  int64_t carry_row_elems() const override { return k_.carry_row_elems(); }

 private:
  const K& k_;
};

}  // namespace tt::model
