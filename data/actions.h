// Action tokens for the VLA path (issue 16; OpenVLA's scheme, ../shared/research/anchors-ssm-vla.md
// 5.2): each dimension of a continuous action is cut into `bins` uniform bins between the 1st and
// 99th percentile of the training data (linear interpolation between order statistics, as
// numpy.quantile), values outside clipped to the end bins, and bin b of any dimension is token id
// vocab_size - bins + b: the last `bins` ids of the vocabulary. Decoding maps an id back to its
// bin's centre. (OpenVLA digitises against 256 edges, 255 centres; here `bins` bins, `bins`
// centres.) The statistics travel with checkpoints as action_bins.json (to_json / from_json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tt::data {

struct ActionBins {
  int bins = 256;
  int64_t vocab_size = 0;
  std::vector<double> low, high;  // (action dims) the 1st and 99th percentiles
  // From fit_action_bins (not saved): each dimension whose middle half of values (the 25th to
  // 75th percentile, not all equal) falls in one bin, so the tokens cannot tell most of its
  // actions apart (a few extreme values stretched the bins); one message each, naming it.
  std::vector<std::string> fit_warnings;

  int dims() const { return (int)low.size(); }
  int32_t first_id() const { return (int32_t)(vocab_size - bins); }
  std::vector<int32_t> encode(const std::vector<float>& action) const;  // throws for a wrong length
  std::vector<float> decode(const std::vector<int32_t>& ids) const;     // throws for an id outside the bins
  std::string to_json() const;
  // Throws tt::Error naming `where` and the field.
  static ActionBins from_json(const std::string& text, const std::string& where);
};

// The bins of a set of actions (each the same length, at least one), for a vocabulary of
// vocab_size ids (bins <= vocab_size).
ActionBins fit_action_bins(const std::vector<std::vector<float>>& actions, int64_t vocab_size, int bins = 256);

}  // namespace tt::data
