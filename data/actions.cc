// Action tokens (see actions.h).
#include "data/actions.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/json.h"

namespace tt::data {
namespace {

// numpy.quantile's default ("linear"): position p (n - 1) between the values `v`, sorted.
double quantile(const std::vector<double>& v, double p) {
  const double pos = p * (double)(v.size() - 1);
  const size_t i = (size_t)std::floor(pos);
  const size_t j = std::min(i + 1, v.size() - 1);
  return v[i] + (pos - (double)i) * (v[j] - v[i]);
}

// The bin of finite value x among `bins` uniform bins over [low, high]; outside, the end bins.
int bin_index(double x, double low, double high, int bins) {
  const double span = high - low;
  // A constant dimension (span 0) maps to its middle bin.
  const double u = span > 0 ? (x - low) / span : 0.5;
  // Clamped as a double: a value far outside the bins' range (u * bins past 2^31) would make the
  // cast undefined (INT_MIN on x86, bin 0 for a huge positive action).
  return (int)std::clamp(std::floor(u * bins), 0.0, (double)(bins - 1));
}

}  // namespace

ActionBins fit_action_bins(const std::vector<std::vector<float>>& actions, int64_t vocab_size, int bins) {
  TT_CHECK(!actions.empty() && !actions[0].empty(), "action bins: expected at least one non-empty action");
  if (bins < 2 || bins > vocab_size)
    throw Error(str("action bins: ", bins, " bins (data.action_bins; stats --action-bins) for a vocabulary of ",
                    vocab_size, " ids (model.vocab_size; --vocab-size): the bins are the vocabulary's last ids, "
                    "expected 2 <= bins <= ", vocab_size));
  const size_t D = actions[0].size();
  ActionBins b;
  b.bins = bins;
  b.vocab_size = vocab_size;
  for (size_t d = 0; d < D; ++d) {
    std::vector<double> col;
    for (const auto& a : actions) {
      TT_CHECK(a.size() == D, "action bins: an action of ", a.size(), " values among actions of ", D);
      col.push_back(a[d]);
    }
    std::sort(col.begin(), col.end());
    b.low.push_back(quantile(col, 0.01));
    b.high.push_back(quantile(col, 0.99));
    const double q25 = quantile(col, 0.25), q75 = quantile(col, 0.75);
    if (q25 < q75 && bin_index(q25, b.low[d], b.high[d], bins) == bin_index(q75, b.low[d], b.high[d], bins))
      b.fit_warnings.push_back(str("action dimension ", d, ": the middle half of its ", col.size(), " values, [", q25,
                                   ", ", q75, "], falls in one of ", bins, " bins spanning its 1st-99th percentiles [",
                                   b.low[d], ", ", b.high[d], "]: a few extreme values stretch the bins, and the "
                                   "action tokens cannot tell most of its actions apart"));
  }
  return b;
}

std::vector<int32_t> ActionBins::encode(const std::vector<float>& action) const {
  TT_CHECK((int)action.size() == dims(), "action bins: an action of ", action.size(), " values, expected ", dims());
  std::vector<int32_t> out;
  for (int d = 0; d < dims(); ++d) {
    if (!std::isfinite(action[d]))
      throw Error(str("action bins: action value ", action[d], " in dimension ", d, ", expected a finite number"));
    out.push_back(first_id() + bin_index(action[d], low[d], high[d], bins));
  }
  return out;
}

std::vector<float> ActionBins::decode(const std::vector<int32_t>& ids) const {
  TT_CHECK((int)ids.size() == dims(), "action bins: ", ids.size(), " action ids, expected ", dims());
  std::vector<float> out;
  for (int d = 0; d < dims(); ++d) {
    const int bin = ids[d] - first_id();
    TT_CHECK(bin >= 0 && bin < bins, "action bins: id ", ids[d], " is not an action token (expected [", first_id(),
             ", ", vocab_size, "))");
    out.push_back((float)(low[d] + (bin + 0.5) / bins * (high[d] - low[d])));
  }
  return out;
}

std::string ActionBins::to_json() const {
  const nlohmann::json j = {{"format", "treetrain-action-bins"}, {"version", 1}, {"bins", bins},
                            {"vocab_size", vocab_size},         {"low", low},    {"high", high}};
  return j.dump(1) + "\n";
}

ActionBins ActionBins::from_json(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = parse_json_strict(text);
  } catch (const std::exception& e) {
    throw Error(str(where, ": invalid JSON: ", e.what()));
  }
  auto need = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) throw Error(str(where, ": missing field \"", key, "\""));
    return j.at(key);
  };
  if (need("format") != "treetrain-action-bins")
    throw Error(str(where, ": field \"format\": expected \"treetrain-action-bins\", got ", need("format").dump()));
  if (need("version") != 1) throw Error(str(where, ": field \"version\": expected 1, got ", need("version").dump()));
  ActionBins b;
  const nlohmann::json &bins = need("bins"), &vocab = need("vocab_size"), &low = need("low"), &high = need("high");
  if (!vocab.is_number_integer() || vocab.get<int64_t>() < 2)
    throw Error(str(where, ": field \"vocab_size\": expected an integer >= 2, got ", vocab.dump()));
  b.vocab_size = vocab.get<int64_t>();
  if (!bins.is_number_integer() || bins.get<int64_t>() < 2 || bins.get<int64_t>() > b.vocab_size)
    throw Error(str(where, ": field \"bins\": expected an integer in [2, vocab_size = ", b.vocab_size, "], got ",
                    bins.dump()));
  b.bins = bins.get<int>();
  auto numbers = [&](const nlohmann::json& a, const char* key, std::vector<double>* out) {
    if (!a.is_array() || a.empty()) throw Error(str(where, ": field \"", key, "\": expected a list of numbers"));
    for (const auto& x : a) {
      if (!x.is_number() || !std::isfinite(x.get<double>()))
        throw Error(str(where, ": field \"", key, "\": expected finite numbers, got ", x.dump()));
      out->push_back(x.get<double>());
    }
  };
  numbers(low, "low", &b.low);
  numbers(high, "high", &b.high);
  if (b.low.size() != b.high.size())
    throw Error(str(where, ": fields \"low\" and \"high\" have ", b.low.size(), " and ", b.high.size(),
                    " values, expected one per action dimension each"));
  for (size_t d = 0; d < b.low.size(); ++d)
    if (b.high[d] < b.low[d])
      throw Error(str(where, ": dimension ", d, ": high ", b.high[d], " below low ", b.low[d]));
  return b;
}

}  // namespace tt::data
