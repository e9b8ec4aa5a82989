// The built-in navigation environment (data/nav_env.h): the expert solves every layout in the
// shortest number of actions (SPL 1), success means stopping within the radius of the named
// landmark, frames are deterministic and show what the agent faces, the expert episodes are the
// `episodes` format, and bad specs are errors naming the field.
#include "data/nav_env.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "base/check.h"
#include "data/episodes.h"

namespace tt::data {
namespace {

TEST(NavEnv, TheExpertSucceedsOnEveryLayoutWithSplOne) {
  NavSpec spec;
  std::set<int> goals, lengths;
  for (int64_t e = 0; e < 300; ++e) {
    NavEnv env(spec, nav_layout_seed(1, e));
    const int shortest = env.shortest();
    EXPECT_GE(shortest, 1);
    goals.insert(env.goal());
    lengths.insert(shortest);
    while (!env.done()) env.step(env.expert_action());
    ASSERT_TRUE(env.success()) << "episode " << e;
    EXPECT_EQ(env.steps_taken(), shortest + 1) << "the shortest path, then stop";
    EXPECT_DOUBLE_EQ(env.spl(), 1.0);
  }
  EXPECT_EQ(goals.size(), 3u);
  EXPECT_GE(lengths.size(), 4u) << "layouts of several difficulties";
}

TEST(NavEnv, SuccessNeedsAStopNearTheNamedLandmark) {
  NavSpec spec;
  spec.max_steps = 5;
  NavEnv far(spec, nav_layout_seed(2, 0));
  far.step(kNavStop);  // at the start, which is never at the goal
  EXPECT_TRUE(far.done());
  EXPECT_FALSE(far.success());
  EXPECT_EQ(far.spl(), 0.0);
  NavEnv wander(spec, nav_layout_seed(2, 1));
  for (int i = 0; i < 5; ++i) wander.step(kNavLeft);  // turning in place until max_steps
  EXPECT_TRUE(wander.done());
  EXPECT_FALSE(wander.success()) << "never stopped";
  EXPECT_THROW(wander.step(kNavForward), Error);
}

TEST(NavEnv, FramesAreDeterministicAndFollowThePose) {
  NavSpec spec;
  NavEnv a(spec, nav_layout_seed(3, 4)), b(spec, nav_layout_seed(3, 4));
  const Image f0 = a.render();
  EXPECT_EQ(f0.width, 16);
  EXPECT_EQ(f0.rgb, b.render().rgb);
  a.step(kNavLeft);
  EXPECT_NE(a.render().rgb, f0.rgb) << "a turn changes the view";
  for (int i = 0; i < 3; ++i) a.step(kNavLeft);
  EXPECT_EQ(a.render().rgb, f0.rgb) << "four turns face the same way again";
  // At the expert's stop pose the named landmark's colour fills the middle column.
  NavEnv g(spec, nav_layout_seed(3, 5));
  while (g.expert_action() != kNavStop) g.step(g.expert_action());
  const Image f = g.render();
  const uint8_t* mid = f.rgb.data() + ((size_t)8 * 16 + 8) * 3;
  const int dominant = mid[0] > mid[1] && mid[0] > mid[2] ? 0 : mid[1] > mid[2] ? 1 : 2;
  if (g.goal() < 3) EXPECT_EQ(dominant, g.goal()) << "red, green, blue landmarks";
}

TEST(NavEnv, ExpertEpisodesAreTheEpisodesFormat) {
  const std::filesystem::path dir = std::filesystem::path(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") / "nav";
  std::filesystem::remove_all(dir);
  NavSpec spec;
  const int64_t frames = write_nav_episodes(spec, 6, 9, 0.0, (dir / "ep.jsonl").string());
  const std::vector<Episode> eps = read_episodes((dir / "ep.jsonl").string(), 16);
  ASSERT_EQ(eps.size(), 6u);
  int64_t steps = 0;
  for (size_t e = 0; e < eps.size(); ++e) {
    NavEnv env(spec, nav_layout_seed(9, (int64_t)e));
    EXPECT_EQ(eps[e].instruction, env.instruction());
    ASSERT_EQ((int)eps[e].steps.size(), env.shortest() + 1) << "noise 0: the shortest path and a stop";
    EXPECT_EQ(eps[e].steps.back().action_ids, std::vector<int32_t>{spec.action_base + kNavStop});
    steps += (int64_t)eps[e].steps.size();
  }
  EXPECT_EQ(frames, steps);
  // Noise moves off the path but keeps the expert's labels: every episode still ends in a stop.
  write_nav_episodes(spec, 20, 9, 0.5, (dir / "noisy.jsonl").string());
  for (const Episode& ep : read_episodes((dir / "noisy.jsonl").string(), 16))
    if ((int)ep.steps.size() < spec.max_steps) EXPECT_EQ(ep.steps.back().action_ids[0], spec.action_base);
}

TEST(NavEnv, BadSpecsNameTheField) {
  NavSpec s;
  s.landmarks = 5;
  try {
    NavEnv e(s, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nav: landmarks = 5, expected a value in [3, 4]"), std::string::npos) << e.what();
  }
  NavSpec t;
  EXPECT_THROW(write_nav_episodes(t, 1, 1, 1.5, "/tmp/x.jsonl"), Error);
  EXPECT_NE(nav_layout_seed(1, 0), nav_layout_seed(7777, 0)) << "training and eval streams differ";
}

}  // namespace
}  // namespace tt::data
