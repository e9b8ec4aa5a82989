// The closed-loop VLA policy (model/policy.h), CPU fp64: the context it builds in the KV cache at
// step t is, token for token and frame for frame, the episode tree's path of step t (its action
// aside), and its logits equal a full forward of that path, with the full history and with a
// window; later action tokens are decoded from the cache like a full forward of the context
// with the earlier ones appended. A reset or a step that throws (a long instruction, a malformed
// observation, a step past the capacity, non-finite logits) leaves the policy as it was. With
// segments the logits are the segmented training forward's of the step's path, and failures
// leave it as it was too. The same with a hybrid language model (Gated DeltaNet layers: their
// states and conv tails follow the cache, and come back with it after the action and failures).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <tuple>

#include "base/check.h"
#include "data/packing.h"
#include "data/episode_tree.h"
#include "data/frames.h"
#include "data/image.h"
#include "data/nav_env.h"
#include "model/decoder.h"
#include "model/policy.h"
#include "tests/equivalence/vla_fixture.h"
#include "tests/base/alloc_faults.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using tt::testing::fail_allocation;  // tests/base/alloc_faults.h

// The largest |a - b| relative to the largest |b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

// tiny_vla_config, or with Qwen3.5's hybrid decoder (layers linear, full, linear attention).
ModelConfig vla_config(bool hybrid) {
  ModelConfig c = tt::testing::tiny_vla_config();
  if (hybrid) model::testing::make_hybrid(c, "qwen3_5_text");
  return c;
}

std::vector<double> row_logits(Model<double>& m, const data::PackedBatch& b, int row) {
  InferRequest req;
  req.loss = false;
  req.rows = InferRequest::Rows::kList;
  req.list = {row};
  return m.infer(b, req).logits;
}

class PolicyVsTree : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(PolicyVsTree, ContextAndLogitsAreTheTreesPath) {
  const auto [window, hybrid] = GetParam();
  const ModelConfig cfg = vla_config(hybrid);
  Model<double> m(cfg);
  m.init(4);
  const data::Episode ep = tt::testing::tiny_episode(5, 2, 8);
  const data::Tree tree = tt::testing::vla_tree(ep, window, cfg, 13);
  VlaPolicy<CpuExec<double>> policy(m, window);
  policy.reset(ep.instruction);
  const int A = 2;  // action tokens a step
  for (int t = 0; t < 5; ++t) {
    Observation obs;
    for (const data::FrameRef& f : tree.media.frames)
      if (f.step == t) obs.frames.push_back(*f.pixels);
    obs.state = ep.steps[t].state;
    std::vector<double> logits;
    const std::vector<int32_t> acts = policy.act(obs, A, 10, 24, &logits);
    // The path of step t, packed alone as the per-timestep baseline packs it.
    data::PackedBatch path = data::pack_path_range(tree, t, t + 1);
    data::FrameSpec fs;
    fs.image_size = (int)cfg.vision.image_size;
    data::load_frames(path, fs);
    const data::PackedBatch ctx = policy.context();
    const int n = path.n_tokens - A;  // the path without its action
    ASSERT_EQ(ctx.n_tokens, n) << "step " << t;
    EXPECT_TRUE(std::equal(ctx.tokens.begin(), ctx.tokens.end(), path.tokens.begin())) << "step " << t;
    EXPECT_EQ(ctx.slot_row, path.slot_row) << "step " << t;
    EXPECT_EQ(ctx.slot_frame, path.slot_frame) << "step " << t;
    EXPECT_EQ(ctx.pixels, path.pixels) << "step " << t;
    EXPECT_EQ(ctx.state_row, path.state_row) << "step " << t;
    EXPECT_EQ(ctx.state, path.state) << "step " << t;
    // The first action token's logits: the path's row before its action.
    EXPECT_LT(rel_diff(logits, row_logits(m, path, n - 1)), 1e-12) << "step " << t;
    EXPECT_EQ(acts[0], 10 + std::max_element(logits.begin() + 10, logits.begin() + 24) - (logits.begin() + 10));
    // The second token: a full forward of the context with the first token appended.
    data::PackedBatch more = path;
    more.tokens[n] = acts[0];
    const std::vector<double> second = row_logits(m, more, n);
    EXPECT_EQ(acts[1], 10 + std::max_element(second.begin() + 10, second.begin() + 24) - (second.begin() + 10));
  }
}

INSTANTIATE_TEST_SUITE_P(Histories, PolicyVsTree, ::testing::Combine(::testing::Values(0, 2), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& i) {
                           const int w = std::get<0>(i.param);
                           return (w == 0 ? std::string("full") : "window" + std::to_string(w)) +
                                  (std::get<1>(i.param) ? "_hybrid" : "");
                         });

// An observation of `cameras` frames of random pixels and a 3-value state (tiny_vla_config's).
Observation random_obs(std::mt19937_64& rng, int cameras) {
  std::normal_distribution<float> d(0.f, 1.f);
  Observation o;
  for (int c = 0; c < cameras; ++c) {
    o.frames.emplace_back(3 * 4 * 4);
    for (float& x : o.frames.back()) x = d(rng);
  }
  o.state = {d(rng), d(rng), d(rng)};
  return o;
}

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// With segments: the policy's logits are the segmented training forward's of the step's path
// (data::path_tree, planned by data::plan_segments: the same carried tail, retrieval and segment
// positions), the first action token's and the second's (with the first fed back), over segment
// lengths whose boundaries cut frame slots (9 rows an observation) and fall inside the action;
// with the full history the cache keeps only the open segment, so the policy's ring is smaller
// than the episode. Tolerance: fp64, the same sums in other groupings (prefill chunks against a
// piece's forward): relative 1e-12.
struct SegCase {
  int window;
  int64_t length, tail;
  bool retrieval;
  bool hybrid = false;
  int64_t ahead = 0;  // the policy's capacity (0: one step's rows); a window's rows fit 40
};
class PolicySegments : public ::testing::TestWithParam<SegCase> {};

TEST_P(PolicySegments, LogitsAreTheSegmentedTrainingForwardsOfThePath) {
  const SegCase c = GetParam();
  const ModelConfig cfg = vla_config(c.hybrid);
  Model<double> m(cfg);
  m.init(4);
  SegmentConfig seg;
  seg.length = c.length;
  seg.tail = c.tail;
  if (c.retrieval) seg.long_range = {{1}, {0}, 3};  // the one KV head long-range in layer 1
  const int steps = 6, A = 2;
  const data::Episode ep = tt::testing::tiny_episode(steps, 2, 8);
  const data::Tree tree = tt::testing::vla_tree(ep, c.window, cfg, 13);
  const int64_t step_rows = 2 * 4 + 1 + A - 1;
  VlaPolicy<CpuExec<double>> policy(m, c.window, c.ahead > 0 ? c.ahead : step_rows, seg);
  policy.reset(ep.instruction);
  data::FrameSpec fs;
  fs.image_size = (int)cfg.vision.image_size;
  const model::LoadPieceFrames load = [&](data::PackedBatch& b) { data::load_frames(b, fs); };
  int cut = 0;
  for (int t = 0; t < steps; ++t) {
    Observation obs;
    for (const data::FrameRef& f : tree.media.frames)
      if (f.step == t) obs.frames.push_back(*f.pixels);
    obs.state = ep.steps[t].state;
    std::vector<double> logits;
    const std::vector<int32_t> acts = policy.act(obs, A, 10, 24, &logits);
    data::Tree path = data::path_tree(tree, t);
    const int n = (int)path.nodes[0].tokens.size() - A;  // the path without its action
    const data::PackedBatch ctx = policy.context();
    ASSERT_EQ(ctx.n_tokens, n) << "step " << t;
    // The reference: the target rows' logits of the path's segmented training forward, piece by
    // piece (a chain: in depth order), the action's two.
    auto reference = [&](const data::Tree& p) {
      const data::SegmentPlan plan = data::plan_segments(p, seg.length);
      for (const data::FrameSlot& s : plan.split.media.slots) cut += s.count > 0;
      std::vector<std::vector<double>> rows;
      const int V = (int)cfg.vocab_size;
      for (const std::vector<double>& piece : segmented_piece_logits(m, seg, plan, load))
        for (size_t r = 0; r < piece.size() / V; ++r) rows.emplace_back(piece.begin() + r * V, piece.begin() + (r + 1) * V);
      EXPECT_EQ(rows.size(), (size_t)A);
      return rows;
    };
    const std::vector<std::vector<double>> ref = reference(path);
    ASSERT_EQ(ref.size(), (size_t)A);
    EXPECT_LT(rel_diff(logits, ref[0]), 1e-12) << "step " << t;
    EXPECT_EQ(acts[0], 10 + std::max_element(logits.begin() + 10, logits.begin() + 24) - (logits.begin() + 10));
    path.nodes[0].tokens[n] = acts[0];  // the second token: the first fed back
    const std::vector<double> second = reference(path)[1];
    EXPECT_EQ(acts[1], 10 + std::max_element(second.begin() + 10, second.begin() + 24) - (second.begin() + 10))
        << "step " << t;
  }
  EXPECT_GT(cut, 0) << "a segment boundary inside a frame slot";
  // With a window the steps go on from the instruction's end when the ring holds the window's 19
  // rows (two observations of 9 and a fed-back token), else prefill it again (all but the first
  // step, whose window of one observation, 10 rows, a ring of 10 holds).
  EXPECT_EQ(policy.instruction_prefills(), c.window > 0 && c.ahead == 0 ? steps : 1);
  // A step that adds more rows than the capacity is refused before anything changes.
  if (c.ahead > 0) return;
  Observation big;
  for (int k = 0; k < 3; ++k) big.frames.emplace_back(3 * 4 * 4, 0.5f);
  big.state = {0.f, 0.f, 0.f};
  EXPECT_EQ(error_of([&] { policy.act(big, A, 10, 24); }),
            "policy: the step adds 14 rows (its observation and 1 fed-back action tokens), more than the 10 one step "
            "may add with segments (the capacity)");
}

INSTANTIATE_TEST_SUITE_P(Segments, PolicySegments,
                         ::testing::Values(SegCase{0, 7, 7, false}, SegCase{0, 10, 4, false}, SegCase{0, 8, 3, true},
                                           SegCase{2, 7, 5, false}, SegCase{2, 10, 10, true},
                                           SegCase{0, 8, 3, true, true}, SegCase{2, 7, 5, false, true},
                                           SegCase{2, 7, 5, false, false, 40}, SegCase{2, 10, 10, true, false, 40},
                                           SegCase{2, 7, 5, true, true, 40}),
                         [](const ::testing::TestParamInfo<SegCase>& i) {
                           return (i.param.window == 0 ? std::string("full") : "window" + std::to_string(i.param.window)) +
                                  "_S" + std::to_string(i.param.length) + "_M" + std::to_string(i.param.tail) +
                                  (i.param.retrieval ? "_retrieval" : "") + (i.param.hybrid ? "_hybrid" : "") +
                                  (i.param.ahead ? "_ahead" + std::to_string(i.param.ahead) : "");
                         });

class PolicyFailures : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

// Every failing step between two good ones leaves no trace: the next step's context and logits
// are a policy's that never saw them (with the full history the cache keeps no rows of theirs;
// with a window, the history keeps neither them nor loses the observation they pushed out).
TEST_P(PolicyFailures, AFailedStepLeavesTheHistoryAndTheCacheAsTheyWere) {
  const auto [window, segments, hybrid] = GetParam();
  const ModelConfig cfg = vla_config(hybrid);  // 4 rows a frame, a state row
  Model<double> m(cfg);
  m.init(4);
  SegmentConfig seg;  // segments of 7 rows: every step rolls at least once
  if (segments) seg.length = 7, seg.tail = 5;
  VlaPolicy<CpuExec<double>> policy(m, window, 48, seg), ref(m, window, 48, seg);
  std::mt19937_64 rng(7);
  const std::vector<Observation> good = {random_obs(rng, 2), random_obs(rng, 1), random_obs(rng, 2)};
  policy.reset({5, 6, 7});
  ref.reset({5, 6, 7});
  for (int t = 0; t < 2; ++t) {
    policy.act(good[t], 2, 10, 24);
    ref.act(good[t], 2, 10, 24);
  }
  Observation bad_frame = good[2];
  bad_frame.frames[1].resize(5);
  EXPECT_NE(error_of([&] { policy.act(bad_frame, 2, 10, 24); }).find("a frame of 5 values, expected 3 x 4 x 4"),
            std::string::npos);
  Observation nan_state = good[2];
  nan_state.state[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(error_of([&] { policy.act(nan_state, 2, 10, 24); }).find("non-finite logits for action token 0"),
            std::string::npos);
  const Observation too_big = random_obs(rng, 12);  // 49 rows
  EXPECT_NE(error_of([&] { policy.act(too_big, 2, 10, 24); })
                .find(segments ? "more than the 48 one step may add with segments" : "more than the context of 48 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { policy.act(good[2], 60, 10, 24); }).find("59 fed-back action tokens"), std::string::npos);
  std::vector<double> got, want;
  const std::vector<int32_t> a = policy.act(good[2], 2, 10, 24, &got);
  const std::vector<int32_t> b = ref.act(good[2], 2, 10, 24, &want);
  EXPECT_EQ(a, b);
  EXPECT_LT(rel_diff(got, want), 1e-12);
  const data::PackedBatch c = policy.context(), r = ref.context();
  EXPECT_EQ(c.tokens, r.tokens);
  EXPECT_EQ(c.pixels, r.pixels);
  EXPECT_EQ(c.state, r.state);
}

INSTANTIATE_TEST_SUITE_P(Histories, PolicyFailures,
                         ::testing::Combine(::testing::Values(0, 2), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool, bool>>& i) {
                           const int w = std::get<0>(i.param);
                           return (w == 0 ? std::string("full") : "window" + std::to_string(w)) +
                                  (std::get<1>(i.param) ? "_segments" : "") + (std::get<2>(i.param) ? "_hybrid" : "");
                         });

// A step failing at any of its allocations in turn (the history's, the forward's, the segments'
// rolls, the marks') leaves no trace either: the same step again gives a policy's actions and logits that
// never saw the failure (a window's path, left half updated by a failure after a forward, is
// cleared for the next step to rebuild, not left refusing its marks).
TEST_P(PolicyFailures, AFailedAllocationAnywhereLeavesNoTrace) {
  const auto [window, segments, hybrid] = GetParam();
  const ModelConfig cfg = vla_config(hybrid);
  Model<double> m(cfg);
  m.init(5);
  SegmentConfig seg;
  if (segments) seg.length = 7, seg.tail = 5;
  std::mt19937_64 rng(8);
  const std::vector<Observation> good = {random_obs(rng, 2), random_obs(rng, 1), random_obs(rng, 2)};
  VlaPolicy<CpuExec<double>> ref(m, window, 48, seg);
  ref.reset({5, 6, 7});
  for (int t = 0; t < 2; ++t) ref.act(good[t], 2, 10, 24);
  std::vector<double> want;
  const std::vector<int32_t> want_a = ref.act(good[2], 2, 10, 24, &want);
  int64_t failed = 0;
  for (int64_t n = 0;; ++n) {
    VlaPolicy<CpuExec<double>> policy(m, window, 48, seg);
    policy.reset({5, 6, 7});
    for (int t = 0; t < 2; ++t) policy.act(good[t], 2, 10, 24);
    if (!fail_allocation(n, [&] { policy.act(good[2], 2, 10, 24); }).threw) break;
    ++failed;
    std::vector<double> got;
    const std::vector<int32_t> a = policy.act(good[2], 2, 10, 24, &got);
    ASSERT_EQ(a, want_a) << "allocation " << n;
    ASSERT_EQ(got, want) << "allocation " << n;
  }
  EXPECT_GT(failed, 10);
}

// An instruction the context cannot hold, or with an id outside the vocabulary, is refused up
// front and the episode goes on as it was (its next step is a policy's that never saw the
// refused resets).
TEST(PolicyFailures, ARefusedResetLeavesTheEpisodeAsItWas) {
  const ModelConfig cfg = tt::testing::tiny_vla_config();
  Model<double> m(cfg);
  m.init(4);
  VlaPolicy<CpuExec<double>> policy(m, 0, 32), ref(m, 0, 32);
  std::mt19937_64 rng(9);
  const Observation first = random_obs(rng, 1), second = random_obs(rng, 1);
  EXPECT_NE(error_of([&] { policy.act(first, 1, 10, 24); }).find("act() before reset()"), std::string::npos);
  for (auto* p : {&policy, &ref}) {
    p->reset({5, 6});
    p->act(first, 1, 10, 24);
  }
  EXPECT_NE(error_of([&] { policy.reset(std::vector<int32_t>(32, 5)); })
                .find("policy: an instruction of 32 tokens exceeds the context of 32 rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { policy.reset({5, 24}); }).find("instruction[1] = 24, expected a token id in [0, 24)"),
            std::string::npos);
  std::vector<double> got, want;
  policy.act(second, 1, 10, 24, &got);
  ref.act(second, 1, 10, 24, &want);
  EXPECT_LT(rel_diff(got, want), 1e-12);
  EXPECT_EQ(policy.context().tokens, ref.context().tokens);
}

// A reset in pieces (begin_reset, then reset_piece of 1, 2 and 5 rows in turn, as a server runs
// one between other clients' requests) is one reset: the steps after it act and give the logits
// (fp64, the same sums in other chunks: relative 1e-12) and contexts of a policy reset at once,
// with the full history and a window, with segments whose boundaries the pieces cross, and with
// a hybrid model's recurrent states. Before the last piece act() is refused; a piece that throws
// (an allocation) leaves no episode, and a reset after it is a fresh one's.
class PolicyPieces : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(PolicyPieces, AResetInPiecesIsOneReset) {
  const auto [window, segments, hybrid] = GetParam();
  const ModelConfig cfg = vla_config(hybrid);
  Model<double> m(cfg);
  m.init(6);
  SegmentConfig seg;
  if (segments) seg.length = 7, seg.tail = 5, seg.long_range = {{1}, {0}, 3};
  const int64_t capacity = segments ? 12 : 64;
  std::mt19937_64 rng(11);
  std::vector<int32_t> ins;
  for (int i = 0; i < 17; ++i) ins.push_back(1 + (int32_t)(rng() % 23));
  const std::vector<Observation> obs = {random_obs(rng, 2), random_obs(rng, 2), random_obs(rng, 2)};
  VlaPolicy<CpuExec<double>> ref(m, window, capacity, seg), policy(m, window, capacity, seg);
  ref.reset(ins);
  auto in_pieces = [&](VlaPolicy<CpuExec<double>>& p) {
    p.begin_reset(ins);
    const int64_t sizes[] = {1, 2, 5};
    int pieces = 0;
    while (!p.reset_piece(sizes[pieces % 3])) {
      ++pieces;
      EXPECT_EQ(p.reset_done(), std::min<int64_t>(17, pieces / 3 * 8 + (pieces % 3 > 0) + 2 * (pieces % 3 > 1)));
      EXPECT_NE(error_of([&] { p.act(obs[0], 2, 10, 24); }).find("act() before reset() is done"), std::string::npos);
    }
    EXPECT_EQ(pieces + 1, 7);  // 1 + 2 + 5, 1 + 2 + 5, 1
    EXPECT_EQ(p.reset_done(), 17);
  };
  in_pieces(policy);
  for (size_t t = 0; t < obs.size(); ++t) {
    std::vector<double> got, want;
    EXPECT_EQ(policy.act(obs[t], 2, 10, 24, &got), ref.act(obs[t], 2, 10, 24, &want)) << "step " << t;
    EXPECT_LT(rel_diff(got, want), 1e-12) << "step " << t;
    EXPECT_EQ(policy.context().tokens, ref.context().tokens) << "step " << t;
  }
  // A piece that fails (each allocation in turn) leaves no episode; a reset after it is a fresh one's.
  VlaPolicy<CpuExec<double>> fresh(m, window, capacity, seg);
  fresh.reset(ins);
  std::vector<double> want;
  const std::vector<int32_t> want_a = fresh.act(obs[0], 2, 10, 24, &want);
  for (const int64_t rows : {9, 100}) {  // a middle piece, then the last (it saves the state, takes the episode)
    int failed = 0;
    for (int64_t n = 0;; ++n) {
      policy.begin_reset(ins);
      policy.reset_piece(3);
      if (!fail_allocation(n, [&] { policy.reset_piece(rows); }).threw) break;
      ++failed;
      EXPECT_NE(error_of([&] { policy.act(obs[0], 2, 10, 24); }).find("act() before reset()"), std::string::npos);
      EXPECT_NE(error_of([&] { policy.reset_piece(1); }).find("reset_piece() without begin_reset()"), std::string::npos);
      in_pieces(policy);
      std::vector<double> got;
      ASSERT_EQ(policy.act(obs[0], 2, 10, 24, &got), want_a) << "allocation " << n << " of a piece of " << rows;
      ASSERT_LT(rel_diff(got, want), 1e-12) << "allocation " << n << " of a piece of " << rows;
    }
    EXPECT_GT(failed, 3) << "a piece of " << rows;
  }
  // rows < 1 is refused and the reset goes on.
  policy.begin_reset(ins);
  EXPECT_NE(error_of([&] { policy.reset_piece(0); }).find("a reset piece of 0 rows, expected >= 1"), std::string::npos);
  EXPECT_TRUE(policy.reset_piece(100));
  std::vector<double> got;
  EXPECT_EQ(policy.act(obs[0], 2, 10, 24, &got), want_a);
  EXPECT_LT(rel_diff(got, want), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Histories, PolicyPieces,
                         ::testing::Combine(::testing::Values(0, 2), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool, bool>>& i) {
                           const int w = std::get<0>(i.param);
                           return (w == 0 ? std::string("full") : "window" + std::to_string(w)) +
                                  (std::get<1>(i.param) ? "_segments" : "") + (std::get<2>(i.param) ? "_hybrid" : "");
                         });

// The evaluator's context in the real environment: an expert episode written as training data
// (PNG frames, data/nav_env.h) and read back as its tree, against the policy fed the frames the
// environment renders while the expert drives: token for token, frame for frame (PNG is lossless).
TEST(PolicyVsTree, TheEvaluatorsContextIsTheTrainingTreesInTheNavEnvironment) {
  ModelConfig cfg = tt::testing::tiny_vla_config();
  cfg.vision.image_size = 16;
  cfg.vision.patch_size = 4;
  cfg.vision.state_dim = 0;
  Model<double> m(cfg);
  m.init(6);
  const std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/policy_nav";
  data::NavSpec spec;
  data::write_nav_episodes(spec, 3, 5, 0.0, dir + "/ep.jsonl");
  data::EpisodeTreeSpec ts;
  ts.tokens_per_frame = 16;
  const std::vector<data::Tree> trees = data::read_episode_trees(dir + "/ep.jsonl", cfg.vocab_size, ts, 256, nullptr);
  for (int e = 0; e < 3; ++e) {
    data::NavEnv env(spec, data::nav_layout_seed(5, e));
    VlaPolicy<CpuExec<double>> policy(m, 0);
    policy.reset(env.instruction());
    for (int t = 0; !env.done(); ++t) {
      Observation obs;
      obs.frames.push_back(data::tower_pixels(env.render(), 16, {0.5f, 0.5f, 0.5f}, {0.5f, 0.5f, 0.5f}));
      std::vector<double> logits;
      policy.act(obs, 1, 8, 12, &logits);
      data::PackedBatch path = data::pack_path_range(trees[e], t, t + 1);
      data::FrameSpec fs;
      fs.image_size = 16;
      data::load_frames(path, fs);
      const data::PackedBatch ctx = policy.context();
      ASSERT_EQ(ctx.n_tokens, path.n_tokens - 1) << "episode " << e << " step " << t;
      EXPECT_TRUE(std::equal(ctx.tokens.begin(), ctx.tokens.end(), path.tokens.begin()));
      EXPECT_EQ(ctx.slot_row, path.slot_row);
      EXPECT_EQ(ctx.pixels, path.pixels) << "episode " << e << " step " << t;
      EXPECT_LT(rel_diff(logits, row_logits(m, path, ctx.n_tokens - 1)), 1e-12);
      env.step(env.expert_action());
    }
  }
}

}  // namespace
}  // namespace tt::model
