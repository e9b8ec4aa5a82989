// Generation: prefill, KV-cache decode and sampling, on either backend, written once over the
// decoder's no-grad forward.
//
// The KV cache (KVCache) holds, per attention layer, K and V rows as attention reads them (after
// norms and RoPE) in one buffer of `capacity` rows; spans of it are handed out to prompts and
// samples. Per recurrent layer (Gated DeltaNet) it holds state slots: the recurrent state (fp32 or
// wider) and the conv context (the last K - 1 pre-conv rows) of one sequence each; a prompt's
// prefill stores its slot, each sample's first decode step reads the prompt's slot and stores
// its own, later steps read and store their own (the state follows each sample's path). A forward writes its rows there through a CacheWrite and later batches read spans of
// it as their carry (external KV prefixes with query ranges): the cache is the decoder's carry.
//
// generate() takes prompts in groups that fit max_batch_tokens cache rows. For a group: one
// prefill forward of every prompt (each its own tree; logits of its last row only), then decode
// steps until every sample has stopped: one row per live sample (each its own one-token tree at
// position len(prompt) + tokens generated before it), reading its prompt's span (visible to all
// of that prompt's samples: the K samples of a prompt share its prefill and its cache rows) and
// its own generated span, and writing its own K/V at the end of that span. Only new rows are
// computed; the logits of a decode step equal those of a full forward of the same sequence (up
// to float rounding: tests/model/generate_test.cc). With the draws on the backend each decode
// step is enqueued before the draws of the step before come back (SamplingOptions::overlap; its
// tokens are those draws, still on the backend), so the host prepares and launches a step while
// the GPU runs the one before; the samples are those of one step at a time (a row whose sample
// stopped meanwhile is computed and dropped).
//
// Sampling: temperature 0 is greedy (argmax, ties to the lower id); otherwise a draw from
// softmax(logits / T). With top_p = 1 the backend draws (the Gumbel-max trick of
// ops/cpu/sampling.h, keyed by (seed, prompt index, sample index, step)), so a decode step copies
// a token and a logprob per row, not its logits; with top_p < 1 the logits come to the host and
// the draw is restricted to the smallest set of most likely tokens whose probability reaches
// top_p (nucleus; sample_token, a splitmix64 stream per sample). A seed reproduces a run on a
// given backend. A sample ends at max_new_tokens, or after emitting
// a stop id or an eos id (the stopping token is kept). logprobs[j] = log p(token j | context) under
// the model at temperature 1 (the policy's own probability, what RL objectives use).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace tt::model {

template <class E>
class KVCache {
 public:
  // capacity rows for every attention layer of `model` (on its backend's memory), and
  // state_slots slots of every recurrent layer's state and conv context (LayerCarry::state).
  KVCache(Decoder<E>& model, int64_t capacity, int64_t state_slots = 0);
  // Whether the model has recurrent layers (then prompts and samples need state slots).
  bool recurrent() const { return recurrent_; }
  // The first of `n` fresh state slots; throws tt::Error past state_slots.
  int64_t reserve_slots(int64_t n);
  // Every recurrent layer of `carry` starts root r from slot slots[r] (-1: zeros).
  void read_state(Carry<E>& carry, std::vector<int32_t> slots) const;
  // Slot dst's states and conv tails become slot src's (a sequence forked from another).
  void copy_state(int64_t dst, int64_t src);
  int64_t capacity() const { return capacity_; }
  int64_t used() const { return used_; }
  // The memory it holds (its K/V rows and state slots), in bytes.
  int64_t bytes() const {
    int64_t n = 0;
    for (int l = 0; l < layers_; ++l) n += (int64_t)(k_[l].size() + v_[l].size() + state_[l].size() + conv_[l].size());
    return n;
  }
  // The first row of a fresh span of `rows` rows; throws tt::Error past the capacity.
  int64_t reserve(int64_t rows);
  void clear() { used_ = slots_used_ = 0; }
  // Gives back every row from `rows` on (rows <= used()).
  void truncate(int64_t rows);
  // Layer l's K and V rows ((capacity, row elems) on the backend; null where the layer keeps none).
  const typename E::Act* k(int layer) const { return reinterpret_cast<const typename E::Act*>(k_[layer].data()); }
  const typename E::Act* v(int layer) const { return reinterpret_cast<const typename E::Act*>(v_[layer].data()); }
  // Adds to every layer of `carry` the span [begin, begin + len) as a prefix visible to queries
  // [q_begin, q_end) (no gradient).
  void read(Carry<E>& carry, int64_t begin, int len, int q_begin, int q_end) const;
  // Batch row i's K/V go to row rows[i]; root r's recurrent state and conv tail to slot
  // state_slots[r] (empty: none stored; -1: that root's not stored).
  CacheWrite<E> write(std::vector<int32_t> rows, std::vector<int32_t> state_slots = {}) const;

 private:
  E* exec_ = nullptr;
  int layers_ = 0;
  int64_t capacity_ = 0, used_ = 0;
  bool recurrent_ = false;
  int64_t slots_ = 0, slots_used_ = 0;
  std::vector<int64_t> state_elems_, conv_elems_;  // [layer]
  std::vector<typename E::Buffer> state_, conv_;   // [layer] (slots, elems)
  std::vector<int64_t> row_elems_;                 // [layer] 0 where the layer keeps no K/V
  std::vector<typename E::Buffer> k_, v_;          // [layer] (capacity, row_elems)
};

struct SamplingOptions {
  int max_new_tokens = 128;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int num_samples = 1;       // per prompt
  uint64_t seed = 0;
  std::vector<int32_t> stop;  // ids that end a sample, besides eos
  std::vector<int32_t> eos;   // the model's eos_token_id(s)
  int64_t max_batch_tokens = 1 << 16;  // cache rows of one group of prompts (a prompt's rows plus
                                       // num_samples x max_new_tokens)
  // With the draws on the backend (top_p 1): enqueue each decode step before the draws of the one
  // before come back (generate()); off: one step at a time (the same draws; for comparisons).
  bool overlap = true;
  // Throws tt::Error naming the option for a value out of range.
  void validate() const;
};

struct Prompt {
  std::string id;
  std::vector<int32_t> tokens;
};

struct Sample {
  std::vector<int32_t> tokens;    // generated, after the prompt
  std::vector<double> logprobs;   // (tokens.size())
  std::string finish;             // "length" | "stop" | "eos"
};

struct Completion {
  std::string id;
  std::vector<Sample> samples;  // (num_samples)
};

// What generate() computed: rows of prefill (each prompt once, whatever num_samples) and of
// decode steps, and the forwards it ran.
struct GenerateStats {
  int64_t prefill_rows = 0;
  int64_t decode_rows = 0;
  int64_t forwards = 0;
  int64_t decode_steps = 0;
  double prefill_s = 0;  // wall time of the prefill forwards (their logits on the host)
  double decode_s = 0;   // wall time of the decode steps, sampling included
  double decode_enqueue_s = 0;  // of which the host spent enqueueing (InferResult::enqueue_s) with
                                // the backend drawing the tokens
  int64_t overlapped_steps = 0;  // decode steps enqueued before the draws of the step before came back
  int64_t dropped_rows = 0;      // their rows whose sample had stopped meanwhile (computed, not taken)
};

// Prompts must be non-empty with token ids in the vocabulary, and len + max_new_tokens at most
// max_position_embeddings (tt::Error naming the prompt otherwise).
template <class E>
std::vector<Completion> generate(Decoder<E>& model, const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                                 GenerateStats* stats = nullptr);

// The sampler on one row of logits (V): the token drawn with uniform u in [0, 1) (greedy ignores
// u) and its log-probability at temperature 1.
struct Draw {
  int32_t token;
  double logprob;
};
Draw sample_token(const double* logits, int V, double temperature, double top_p, double u);

}  // namespace tt::model
