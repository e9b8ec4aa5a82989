// SegmentConfig: checks and the derived sizes of segment-level execution (see segments.h).
#include "model/segment_config.h"

#include <algorithm>

#include "base/check.h"

namespace tt::model {

void SegmentConfig::validate(const ModelConfig& m) const {
  // A user's config error: the message alone (no check location).
  auto require = [](bool ok, auto&&... parts) {
    if (!ok) throw Error(str(parts...));
  };
  if (!enabled()) {
    require(length == 0, "segments.length: ", length, ", expected >= 1 (or 0: segments off)");
    return;
  }
  require(tail >= 0 && tail <= length, "segments.tail: ", tail, ", expected 0 <= tail <= segments.length (",
           length, "): the tail is the previous segment's last rows");
  require(tbptt >= 0 && tbptt <= 1024, "segments.tbptt: ", tbptt,
           ", expected in [0, 1024] (0: the carried tail is detached)");
  require(long_range.retrieve >= 0, "segments.long_range.retrieve: ", long_range.retrieve, ", expected >= 0");
  const int L = (int)m.num_hidden_layers, NKV = (int)m.num_key_value_heads;
  const std::vector<LayerSpec> specs = m.layer_specs();
  std::vector<char> seen(std::max(L, 0), 0);
  for (int l : long_range.layers) {
    require(l >= 0 && l < L, "segments.long_range.layers: layer ", l, ", expected an index in [0, ", L, ")");
    require(!seen[l], "segments.long_range.layers: layer ", l, " is listed twice");
    require(specs[l].mixer == "full_attention", "segments.long_range.layers: layer ", l, " is ", specs[l].mixer,
             ", expected a full_attention layer (a linear_attention layer carries its whole history in its "
             "recurrent state; it retrieves nothing)");
    seen[l] = 1;
  }
  require(NKV <= 64, "segments: head sets take at most 64 KV heads, the model has num_key_value_heads ", NKV);
  std::vector<char> seen_h(std::max(NKV, 0), 0);
  for (int h : long_range.heads) {
    require(h >= 0 && h < NKV, "segments.long_range.heads: KV head ", h, ", expected an index in [0, ", NKV,
             ") (num_key_value_heads)");
    require(!seen_h[h], "segments.long_range.heads: KV head ", h, " is listed twice");
    seen_h[h] = 1;
  }
  require(long_range.retrieve == 0 || (!long_range.layers.empty() && !long_range.heads.empty()),
           "segments.long_range.retrieve: ", long_range.retrieve,
           " pairs with no long-range layers or heads (expected both long_range.layers and long_range.heads, or "
           "retrieve: 0)");
  // Long-range layers only choose where the retrieved pairs are read: without heads to read them,
  // or without pairs, listing layers would change nothing.
  require(long_range.layers.empty() || (!long_range.heads.empty() && long_range.retrieve > 0),
           "segments.long_range.layers: ", long_range.layers.size(), " layers listed, but ",
           long_range.heads.empty() ? "long_range.heads is empty (no head reads retrieved pairs)"
                                    : "long_range.retrieve is 0 (no pairs are retrieved)",
           "; expected long_range.heads and retrieve > 0 with them, or layers: []");
  require(max_position() < m.max_position_embeddings, "segments: positions reach ", max_position(),
           " (length + max(tail, long_range.retrieve) - 1), expected below model.max_position_embeddings ",
           m.max_position_embeddings);
}

std::string SegmentConfig::ignored_key() const {
  if (enabled()) return "";
  const SegmentConfig off;
  if (tail != off.tail) return "segments.tail";
  if (tbptt != off.tbptt) return "segments.tbptt";
  if (!long_range.layers.empty()) return "segments.long_range.layers";
  if (!long_range.heads.empty()) return "segments.long_range.heads";
  if (long_range.retrieve != off.long_range.retrieve) return "segments.long_range.retrieve";
  return "";
}

uint64_t SegmentConfig::long_heads() const {
  uint64_t m = 0;
  for (int h : long_range.heads) m |= uint64_t(1) << h;
  return m;
}

uint64_t SegmentConfig::local_heads(int num_kv_heads) const {
  const uint64_t all = num_kv_heads >= 64 ? ~uint64_t(0) : (uint64_t(1) << num_kv_heads) - 1;
  return all & ~long_heads();
}

bool SegmentConfig::long_layer(int layer) const {
  return std::find(long_range.layers.begin(), long_range.layers.end(), layer) != long_range.layers.end();
}

int64_t SegmentConfig::retrieved_rows(int64_t i) const {
  return retrieval() ? std::min(long_range.retrieve, i * length) : 0;
}

int64_t SegmentConfig::shift(int64_t i) const { return std::max(tail_rows(i), retrieved_rows(i)); }

int64_t SegmentConfig::position(int64_t depth) const {
  const int64_t i = depth / length;
  return shift(i) + depth - i * length;
}

int64_t SegmentConfig::max_position() const {
  return length + std::max(tail, retrieval() ? long_range.retrieve : int64_t(0)) - 1;
}

}  // namespace tt::model
