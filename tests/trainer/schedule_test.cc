// Learning-rate schedule values at the points that define it.
#include "trainer/schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tt::trainer {
namespace {

RunConfig cfg(const std::string& decay, int64_t warmup, int64_t total, double ratio) {
  RunConfig c;
  c.optim.lr = 1e-3;
  c.schedule.decay = decay;
  c.schedule.warmup_steps = warmup;
  c.train.max_steps = total;
  c.schedule.min_lr_ratio = ratio;
  return c;
}

// Each value is a few fp64 operations on exact inputs: relative 1e-15.
void expect_lr(double got, double want) { EXPECT_NEAR(got, want, 1e-15 * std::abs(want) + 1e-300); }

TEST(ScheduleTest, LinearWarmup) {
  const RunConfig c = cfg("cosine", 10, 110, 0.1);
  expect_lr(lr_at(c, 1), 1e-4);
  expect_lr(lr_at(c, 5), 5e-4);
  expect_lr(lr_at(c, 10), 1e-3);
}

TEST(ScheduleTest, CosineDecayToMinRatio) {
  const RunConfig c = cfg("cosine", 10, 110, 0.1);
  expect_lr(lr_at(c, 60), 1e-3 * (0.1 + 0.9 * 0.5));  // halfway: cos(pi/2) = 0
  expect_lr(lr_at(c, 110), 1e-4);
  expect_lr(lr_at(c, 35), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25))));
}

TEST(ScheduleTest, LinearDecayToMinRatio) {
  const RunConfig c = cfg("linear", 0, 100, 0.0);
  expect_lr(lr_at(c, 1), 1e-3 * (1 - 0.01));
  expect_lr(lr_at(c, 50), 5e-4);
  EXPECT_EQ(lr_at(c, 100), 0.0);
}

TEST(ScheduleTest, ConstantAfterWarmup) {
  const RunConfig c = cfg("constant", 4, 20, 0.1);
  expect_lr(lr_at(c, 2), 5e-4);
  EXPECT_EQ(lr_at(c, 5), 1e-3);
  EXPECT_EQ(lr_at(c, 20), 1e-3);
}

TEST(ScheduleTest, WarmupAsLongAsTheRun) {
  const RunConfig c = cfg("cosine", 8, 8, 0.5);
  expect_lr(lr_at(c, 4), 5e-4);
  EXPECT_EQ(lr_at(c, 8), 1e-3);
}

TEST(ScheduleTest, WarmupLongerThanTheRun) {
  // Still defined (a warning, not an error): the lr rises linearly and the run ends before warmup.
  const RunConfig c = cfg("cosine", 10, 4, 0.1);
  expect_lr(lr_at(c, 1), 1e-4);
  expect_lr(lr_at(c, 4), 4e-4);
}

}  // namespace
}  // namespace tt::trainer
