// Action tokens (data/actions.h): the percentiles, the ids, the round trip within half a bin,
// clipping, and the statistics file.
#include "data/actions.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/check.h"

namespace tt::data {
namespace {

TEST(ActionBins, PercentilesAreNumpysLinearQuantiles) {
  // Dimension 0: 0, 1, ..., 100 -> q01 = 1, q99 = 99; dimension 1 constant.
  std::vector<std::vector<float>> acts;
  for (int i = 0; i <= 100; ++i) acts.push_back({(float)i, 3.0f});
  const ActionBins b = fit_action_bins(acts, 1000, 256);
  EXPECT_DOUBLE_EQ(b.low[0], 1.0);
  EXPECT_DOUBLE_EQ(b.high[0], 99.0);
  EXPECT_DOUBLE_EQ(b.low[1], 3.0);
  EXPECT_DOUBLE_EQ(b.high[1], 3.0);
  EXPECT_EQ(b.first_id(), 1000 - 256);
  // Four values: numpy.quantile([0, 1, 2, 10], 0.99) = 2 + 0.97 * 8.
  const ActionBins c = fit_action_bins({{0}, {1}, {2}, {10}}, 100, 10);
  EXPECT_NEAR(c.high[0], 2 + 0.97 * 8, 1e-12);
  EXPECT_NEAR(c.low[0], 0.03, 1e-12);
}

// A few extreme values (3e38 among 20 values in [-1, 1]) stretch the 1st-99th percentile range so
// far that the middle half of the actions shares one bin: a warning names the dimension; an
// ordinary spread and a mostly constant dimension (a gripper) give none.
TEST(ActionBins, StretchedBinsAreNamed) {
  std::vector<std::vector<float>> acts;
  for (int i = 0; i < 20; ++i) acts.push_back({-1.0f + 0.1f * (float)i, i < 18 ? 0.0f : 1.0f});
  EXPECT_TRUE(fit_action_bins(acts, 1000, 256).fit_warnings.empty());
  acts.push_back({3e38f, 0.0f});
  const ActionBins b = fit_action_bins(acts, 1000, 256);
  ASSERT_EQ(b.fit_warnings.size(), 1u);
  EXPECT_EQ(b.fit_warnings[0].rfind("action dimension 0: the middle half of its 21 values, [-0.5, 0.5], falls in one "
                                    "of 256 bins spanning its 1st-99th percentiles [",
                                    0),
            0u)
      << b.fit_warnings[0];
}

TEST(ActionBins, EncodeDecodeWithinHalfABinAndClip) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 2.0f);
  std::vector<std::vector<float>> acts;
  for (int i = 0; i < 2000; ++i) acts.push_back({g(rng), 10 + g(rng) / 10});
  const ActionBins b = fit_action_bins(acts, 32000, 256);
  for (const auto& a : acts) {
    const std::vector<int32_t> ids = b.encode(a);
    for (int32_t id : ids) {
      ASSERT_GE(id, 32000 - 256);
      ASSERT_LT(id, 32000);
    }
    const std::vector<float> back = b.decode(ids);
    for (int d = 0; d < 2; ++d) {
      const double width = (b.high[d] - b.low[d]) / 256;
      if (a[d] >= b.low[d] && a[d] <= b.high[d]) {
        EXPECT_LE(std::fabs(back[d] - a[d]), 0.5 * width + 1e-5) << d;
      } else {  // clipped to an end bin
        EXPECT_EQ(ids[d], a[d] < b.low[d] ? 32000 - 256 : 31999);
      }
    }
  }
  // Far outside the range (u * bins past 2^31): still the end bins, not an undefined cast.
  EXPECT_EQ(b.encode({1e30f, -1e30f}), (std::vector<int32_t>{31999, 32000 - 256}));
  EXPECT_EQ(b.encode({-1e30f, 1e30f}), (std::vector<int32_t>{32000 - 256, 31999}));
  EXPECT_THROW(b.encode({1.0f}), Error);
  EXPECT_THROW(b.encode({NAN, 1.0f}), Error);
  EXPECT_THROW(b.decode({100, 31999}), Error);
  // A constant dimension takes its middle bin and decodes to its value.
  const ActionBins c = fit_action_bins({{4}, {4}}, 50, 10);
  EXPECT_EQ(c.encode({4.0f})[0], 40 + 5);
  EXPECT_FLOAT_EQ(c.decode({45})[0], 4.0f);
}

TEST(ActionBins, StatisticsFileRoundTripAndErrors) {
  const ActionBins b = fit_action_bins({{0, 1}, {1, 2}, {2, 4}}, 500, 64);
  const ActionBins r = ActionBins::from_json(b.to_json(), "ckpt/action_bins.json");
  EXPECT_EQ(r.bins, 64);
  EXPECT_EQ(r.vocab_size, 500);
  EXPECT_EQ(r.low, b.low);
  EXPECT_EQ(r.high, b.high);
  auto err = [](const std::string& text) {
    try {
      ActionBins::from_json(text, "f.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string ok = R"("format": "treetrain-action-bins", "version": 1, "vocab_size": 500, )";
  EXPECT_EQ(err("{" + ok + R"("bins": 64, "low": [0], "high": [1]})"), "");
  EXPECT_EQ(err("{" + ok + R"("bins": 600, "low": [0], "high": [1]})"),
            "f.json: field \"bins\": expected an integer in [2, vocab_size = 500], got 600");
  EXPECT_EQ(err("{" + ok + R"("bins": 64, "low": [0, 1], "high": [1]})"),
            "f.json: fields \"low\" and \"high\" have 2 and 1 values, expected one per action dimension each");
  EXPECT_EQ(err("{" + ok + R"("bins": 64, "low": [2], "high": [1]})"), "f.json: dimension 0: high 1 below low 2");
  EXPECT_EQ(err(R"({"format": "x"})"), "f.json: field \"format\": expected \"treetrain-action-bins\", got \"x\"");
}

}  // namespace
}  // namespace tt::data
