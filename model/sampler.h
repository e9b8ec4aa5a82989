// The draw side of generation, shared by generate() (model/generate.h) and generate_segmented()
// (model/segments.h): the prompts' checks, each sample's random streams, the request that asks a
// forward for draws (or logits), and taking a row's draw into a sample.
#pragma once

#include <cstdint>
#include <vector>

#include "model/decoder.h"
#include "model/generate.h"
#include "model/init.h"

namespace tt::model {

// Seconds on the steady clock.
double now_s();

// Throws tt::Error naming the prompt: empty, a token outside the vocabulary, or longer than
// max_position_embeddings with max_new_tokens (max_position: the largest position generation may
// reach, or 0 for the config's own bound).
void check_prompts(const ModelConfig& cfg, const std::vector<Prompt>& prompts, const SamplingOptions& opt,
                   bool bounded_positions = false);

// One sample's draws: prompt p (its index in the call), sample s, its output.
struct SampleStream {
  SampleStream(const SamplingOptions& opt, int64_t p, int s, Sample* out);
  int64_t p;
  int s;
  SplitMix64 rng;  // the host sampler's stream (top_p < 1, or logits wanted)
  uint64_t key;    // the backend sampler's key (top_p = 1)
  Sample* out;
  bool done = false;
  // The key of the draw of its next token, or (ahead draws still in flight) of the one after those.
  uint64_t next_key(int ahead = 0) const { return SplitMix64{key + out->tokens.size() + ahead}.next(); }
};

// Whether the backend draws (top_p = 1 and no logits wanted), else the host from logits.
inline bool draws_on_backend(const SamplingOptions& opt, bool want_logits) { return opt.top_p == 1 && !want_logits; }

// The request for rows `rows` of a forward: draws with the samples' keys, or logits. ahead > 0
// (draws on the backend): a step enqueued while each sample's last `ahead` draws are in flight,
// its tokens those draws (InferRequest::tokens_from_draws) and its keys those of the draws after.
InferRequest draw_request(std::vector<int32_t> rows, const std::vector<SampleStream*>& who, const SamplingOptions& opt,
                          bool on_backend, int ahead = 0);

// Appends row r's draw of `res` to x (from the backend's draw or the row's logits) and marks it
// done at a stop id, an eos id or max_new_tokens.
void take_draw(SampleStream& x, const InferResult& res, int r, int V, const SamplingOptions& opt, bool on_backend);

}  // namespace tt::model
