// The configuration of segment-level execution (config section `segments`; the semantics are in
// model/segments.h): kept apart from the model layer so that configs parse without it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace tt::model {

struct SegmentConfig {
  int64_t length = 0;  // S, tokens per segment; 0: segments off
  int64_t tail = 0;    // M, carried K/V rows per layer (local heads), <= length
  int64_t tbptt = 1;   // K, segment transitions a loss's gradient crosses (0: detached tail and states)
  struct LongRange {
    std::vector<int> layers;  // L_long: decoder layers whose long-range heads read retrieved pairs
    std::vector<int> heads;   // long-range KV heads (any order, not necessarily contiguous)
    int64_t retrieve = 0;     // R, pairs retrieved per segment
  } long_range;

  bool enabled() const { return length > 0; }
  // With segments off: the first key of the section whose value is not its default (ignored then:
  // a forgotten length?), or "".
  std::string ignored_key() const;
  bool retrieval() const { return !long_range.layers.empty() && !long_range.heads.empty() && long_range.retrieve > 0; }
  // Throws tt::Error naming the `segments.` key for a value the model cannot run: sizes, layer
  // and head indices out of range or repeated, positions past max_position_embeddings, a
  // long-range layer that is not full_attention.
  void validate(const ModelConfig& model) const;
  uint64_t long_heads() const;                     // bit g: KV head g is long-range
  uint64_t local_heads(int num_kv_heads) const;    // the others
  bool long_layer(int layer) const;
  // Segment i's carried tail rows, retrieved rows and position shift P_i.
  int64_t tail_rows(int64_t i) const { return i > 0 ? tail : 0; }
  int64_t retrieved_rows(int64_t i) const;
  int64_t shift(int64_t i) const;
  // The position of the token at depth d.
  int64_t position(int64_t depth) const;
  // The largest position any token gets: S + max(M, R) - 1.
  int64_t max_position() const;
};

}  // namespace tt::model
