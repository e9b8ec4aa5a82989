// Generation on the CPU backend in fp64 (model/generate.h):
//  - a decode step computes only the new rows, and its logits equal the full forward's logits of
//    the same sequence at every position (1e-10 relative: the same sums in other orders), for one
//    sequence and for K samples sharing a prompt's cache rows;
//  - greedy generation is the argmax of the full forward at every step, with its logprobs;
//  - the K samples of a prompt share one prefill; a seed reproduces a run, another seed changes it;
//  - the sampler's nucleus and temperature; errors name the prompt or option.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "base/check.h"
#include "ops/cpu/sampling.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::chain_batch;
using testing::expect_error;
using testing::tiny_config;

// The dense models, and the hybrids (Gated DeltaNet layers around gated attention: qwen3_5_text
// with split projections, qwen3_next with fused ones, conv window 4).
ModelConfig config(const std::string& arch) {
  const bool hybrid = arch == "qwen3_5_text" || arch == "qwen3_next";
  ModelConfig c = tiny_config(hybrid ? "qwen3" : arch, arch == "llama");
  c.vocab_size = 13;
  if (hybrid) {
    testing::make_hybrid(c, arch);
    c.head_dim = 8;
  }
  return c;
}

const char* const kArchs[] = {"qwen3", "llama", "qwen3_5_text", "qwen3_next"};

void init(Model<double>& m, uint64_t seed) {
  m.init(seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-0.3, 0.3);
  for (const ParamInfo& p : m.params_info())
    if (p.role == ParamRole::kNormWeight)
      for (int64_t i = 0; i < p.numel; ++i) m.params()[p.offset + i] += u(rng);
}

std::vector<double> full_logits(Model<double>& m, const std::vector<int32_t>& tokens) {
  return m.infer(chain_batch(tokens), InferRequest::all_logits()).logits;
}

// Every logprob of sample x (after `prompt`) is the full forward's log-softmax of its token, to
// 1e-10 (`what` names the case in failures).
void expect_full_forward_logprobs(Model<double>& m, const std::vector<int32_t>& prompt, const Sample& x,
                                  const std::string& what) {
  const int V = (int)m.config().vocab_size;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), x.tokens.begin(), x.tokens.end());
  const std::vector<double> ref = full_logits(m, seq);
  for (size_t j = 0; j < x.tokens.size(); ++j) {
    const double* row = ref.data() + (prompt.size() + j - 1) * V;
    double mx = row[0], z = 0;
    for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
    for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    EXPECT_NEAR(x.logprobs[j], row[x.tokens[j]] - mx - std::log(z), 1e-10) << what << " token " << j;
  }
}

double max_rel(const double* a, const double* b, int n) {
  double d = 0, s = 0;
  for (int i = 0; i < n; ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    s = std::max(s, std::fabs(b[i]));
  }
  return d / std::max(s, 1e-300);
}

// One-token trees: row r has token tokens[r] at position pos[r].
data::PackedBatch decode_batch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pos) {
  data::PackedBatch b;
  b.n_tokens = (int)tokens.size();
  b.tokens = tokens;
  b.pos = pos;
  for (int r = 0; r < b.n_tokens; ++r) {
    b.subtree_end.push_back(r + 1);
    b.node_start.push_back(r);
    b.node_len.push_back(1);
    b.node_parent.push_back(-1);
    b.tree_start.push_back(r);
  }
  b.tree_start.push_back(b.n_tokens);
  return b;
}

// Prefill a prompt into the cache, then two samples decode different continuations one token a
// step, each reading the shared prompt rows and its own rows (and, in a hybrid, starting from
// the prompt's recurrent state and conv tail, then from its own): every decode row's logits
// equal the full forward of that sample's sequence. Prompts of 1, 2 and 5 tokens: shorter than
// the conv window, a decode row's window reaches into the zeros before the prompt.
TEST(Decode, LogitsEqualTheFullForwardAtEveryPosition) {
  for (const std::string arch : kArchs)
    for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{1, 7, 2, 9, 4}, {6}, {10, 3}}) {
    Model<double> m(config(arch));
    init(m, 3);
    const int V = (int)m.config().vocab_size, L = m.architecture().num_layers();
    const std::vector<std::vector<int32_t>> cont = {{3, 3, 8, 0, 12}, {5, 1, 1, 6, 2}};
    const int P = (int)prompt.size(), T = (int)cont[0].size();
    KVCache<CpuExec<double>> cache(m, P + 2 * T, 3);
    EXPECT_EQ(cache.recurrent(), arch == "qwen3_5_text" || arch == "qwen3_next") << arch;
    const int32_t prompt_slot = (int32_t)cache.reserve_slots(1);
    const int32_t own[2] = {(int32_t)cache.reserve_slots(1), (int32_t)cache.reserve_slots(1)};
    const int64_t span = cache.reserve(P);
    std::vector<int32_t> rows(P);
    for (int i = 0; i < P; ++i) rows[i] = (int32_t)(span + i);
    const CacheWrite<CpuExec<double>> w0 = cache.write(rows, {prompt_slot});
    const InferResult pre = m.infer(chain_batch(prompt), InferRequest::all_logits(), nullptr, &w0);
    const std::vector<double> ref0 = full_logits(m, prompt);
    EXPECT_LE(max_rel(pre.logits.data(), ref0.data(), P * V), 1e-12) << arch << ": prefill";
    const int64_t gen[2] = {cache.reserve(T), cache.reserve(T)};
    for (int j = 0; j < T; ++j) {
      Carry<CpuExec<double>> carry(L);
      cache.read(carry, span, P, 0, 2);
      for (int s = 0; s < 2; ++s) cache.read(carry, gen[s], j, s, s + 1);
      cache.read_state(carry, j == 0 ? std::vector<int32_t>{prompt_slot, prompt_slot} : std::vector<int32_t>{own[0], own[1]});
      const CacheWrite<CpuExec<double>> w =
          cache.write({(int32_t)(gen[0] + j), (int32_t)(gen[1] + j)}, {own[0], own[1]});
      const InferResult step =
          m.infer(decode_batch({cont[0][j], cont[1][j]}, {P + j, P + j}), InferRequest::all_logits(), &carry, &w);
      for (int s = 0; s < 2; ++s) {
        std::vector<int32_t> seq = prompt;
        seq.insert(seq.end(), cont[s].begin(), cont[s].begin() + j + 1);
        const std::vector<double> ref = full_logits(m, seq);
        EXPECT_LE(max_rel(step.logits.data() + (size_t)s * V, ref.data() + (size_t)(P + j) * V, V), 1e-10)
            << arch << " prompt of " << P << ", sample " << s << " step " << j;
      }
    }
  }
}

// A recurrent layer refuses what it cannot do yet: a state in a training forward (no gradient
// through it), and storing the state of a tree with several nodes (whose end state is ambiguous).
TEST(Decode, RecurrentCarryErrors) {
  Model<double> m(config("qwen3_5_text"));
  init(m, 4);
  const int L = m.architecture().num_layers();
  KVCache<CpuExec<double>> cache(m, 16, 2);
  const int32_t slot = (int32_t)cache.reserve_slots(1);
  Carry<CpuExec<double>> carry(L);
  cache.read_state(carry, {slot});
  try {
    Activations<CpuExec<double>> acts;
    m.forward(chain_batch({1, 2, 3}), 1.0, acts, &carry);
    ADD_FAILURE() << "a training forward read a recurrent state with nowhere to send its gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is linear_attention: a training forward reads state slot 0 without d_state "
                                         "/ d_conv accumulators"),
              std::string::npos)
        << e.what();
  }
  data::PackedBatch two = chain_batch({1, 2, 3, 4});
  two.node_start = {0, 2};
  two.node_len = {2, 2};
  two.node_parent = {-1, 0};
  cache.reserve(4);
  const CacheWrite<CpuExec<double>> w = cache.write({0, 1, 2, 3}, {slot});
  try {
    m.infer(two, InferRequest::all_logits(), nullptr, &w);
    ADD_FAILURE() << "stored the state of a two-node tree";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one-node trees"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cache.read_state(carry, {5}), Error);  // a slot never reserved
}

TEST(Generate, GreedyIsTheArgmaxOfTheFullForward) {
  for (const std::string arch : kArchs) {
    Model<double> m(config(arch));
    init(m, 5);
    const int V = (int)m.config().vocab_size;
    SamplingOptions o;
    o.temperature = 0;
    o.max_new_tokens = 8;
    const std::vector<Prompt> prompts = {{"a", {2, 4, 6}}, {"b", {11, 0, 5, 5, 1, 9}}};
    const std::vector<Completion> out = generate(m, prompts, o);
    ASSERT_EQ(out.size(), 2u);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(out[i].id, prompts[i].id);
      ASSERT_EQ(out[i].samples.size(), 1u);
      const Sample& s = out[i].samples[0];
      ASSERT_EQ((int)s.tokens.size(), o.max_new_tokens);
      EXPECT_EQ(s.finish, "length");
      std::vector<int32_t> seq = prompts[i].tokens;
      seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
      const std::vector<double> ref = full_logits(m, seq);
      for (size_t j = 0; j < s.tokens.size(); ++j) {
        const double* row = ref.data() + (prompts[i].tokens.size() + j - 1) * V;
        int best = 0;
        double z = 0;
        for (int v = 0; v < V; ++v) best = row[v] > row[best] ? v : best;
        for (int v = 0; v < V; ++v) z += std::exp(row[v] - row[best]);
        EXPECT_EQ(s.tokens[j], best) << arch << " prompt " << i << " token " << j;
        EXPECT_NEAR(s.logprobs[j], -std::log(z), 1e-10) << arch << " prompt " << i << " token " << j;
      }
    }
  }
}

// K samples of a prompt share its prefill; sampling is reproducible per seed; a stop id ends a
// sample and is kept; every sample's logprobs are the full forward's.
TEST(Generate, SamplesShareThePrefillAndFollowTheSeed) {
  Model<double> m(config("qwen3"));
  init(m, 7);
  SamplingOptions o;
  o.temperature = 1.3;
  o.top_p = 0.9;
  o.num_samples = 5;
  o.max_new_tokens = 6;
  o.seed = 42;
  o.stop = {3};
  const std::vector<Prompt> prompts = {{"p0", {1, 2, 3, 4}}, {"p1", {9, 8, 7}}};
  GenerateStats st;
  const std::vector<Completion> a = generate(m, prompts, o, &st);
  EXPECT_EQ(st.prefill_rows, 7) << "each prompt is prefilled once, not once per sample";
  const std::vector<Completion> b = generate(m, prompts, o);
  o.seed = 43;
  const std::vector<Completion> c = generate(m, prompts, o);
  bool differs = false;
  std::map<std::vector<int32_t>, int> distinct;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int s = 0; s < 5; ++s) {
      const Sample& x = a[i].samples[s];
      EXPECT_EQ(x.tokens, b[i].samples[s].tokens) << "same seed, same samples";
      EXPECT_EQ(x.logprobs, b[i].samples[s].logprobs);
      differs |= x.tokens != c[i].samples[s].tokens;
      distinct[x.tokens]++;
      for (size_t j = 0; j + 1 < x.tokens.size(); ++j) EXPECT_NE(x.tokens[j], 3) << "a stop id ends the sample";
      if (x.finish == "stop") {
        EXPECT_EQ(x.tokens.back(), 3);
      }
      if (x.finish == "length") {
        EXPECT_EQ((int)x.tokens.size(), o.max_new_tokens);
      }
      expect_full_forward_logprobs(m, prompts[i].tokens, x, "prompt " + std::to_string(i));
    }
  }
  EXPECT_TRUE(differs) << "another seed draws other samples";
  EXPECT_GT(distinct.size(), 2u) << "samples of a prompt differ";
}

// With the draws on the backend, each decode step is enqueued before the draws of the step before
// come back, its tokens those draws (InferRequest::tokens_from_draws): the samples are the ones
// of one step at a time, token for token and logprob for logprob (fp64: the same sums), also when
// a stop id ends some samples while the next step is in flight (their rows computed, dropped), and
// for the hybrids, whose recurrent state slots follow each sample.
TEST(Generate, OverlappedStepsDrawWhatOneStepAtATimeDraws) {
  int64_t dropped = 0;
  for (const std::string arch : kArchs) {
    Model<double> m(config(arch));
    init(m, 11);
    SamplingOptions o;
    o.temperature = 1.5;
    o.num_samples = 3;
    o.max_new_tokens = 9;
    o.seed = 5;
    o.stop = {2, 7};
    const std::vector<Prompt> prompts = {{"p0", {1, 2, 3, 4}}, {"p1", {9, 8}}, {"p2", {5}}};
    GenerateStats on, off;
    const std::vector<Completion> a = generate(m, prompts, o, &on);
    o.overlap = false;
    const std::vector<Completion> b = generate(m, prompts, o, &off);
    EXPECT_GT(on.overlapped_steps, 0) << arch;
    EXPECT_EQ(off.overlapped_steps, 0) << arch;
    EXPECT_EQ(off.dropped_rows, 0) << arch;
    EXPECT_EQ(on.decode_rows - on.dropped_rows, off.decode_rows) << arch << ": every row taken is one the plain loop runs";
    dropped += on.dropped_rows;
    for (size_t i = 0; i < prompts.size(); ++i) {
      for (int s = 0; s < o.num_samples; ++s) {
        const Sample &x = a[i].samples[s], &y = b[i].samples[s];
        EXPECT_EQ(x.tokens, y.tokens) << arch << " prompt " << i << " sample " << s;
        EXPECT_EQ(x.logprobs, y.logprobs) << arch << " prompt " << i << " sample " << s;
        EXPECT_EQ(x.finish, y.finish) << arch << " prompt " << i << " sample " << s;
        expect_full_forward_logprobs(m, prompts[i].tokens, x, arch);
      }
    }
  }
  EXPECT_GT(dropped, 0) << "a stop id ended some sample with the next step in flight";
}

// The two halves of infer(): misuse is an error naming the call, before anything is enqueued.
TEST(Generate, InferEnqueueErrors) {
  Model<double> m(config("qwen3"));
  m.init(3);
  InferRequest draw;
  draw.loss = false;
  draw.rows = InferRequest::Rows::kList;
  draw.list = {0, 1};
  draw.sample = true;
  draw.keys = {1, 2};
  const data::PackedBatch two = decode_batch({1, 2}, {0, 0}), three = decode_batch({1, 2, 3}, {0, 0, 0});
  expect_error([&] { m.infer_collect(); }, {"model: infer_collect() with no forward in flight"});
  InferRequest fed = draw;
  fed.tokens_from_draws = true;
  expect_error([&] { m.infer_enqueue(two, fed); }, {"model: tokens_from_draws needs the forward before to have drawn "
                                                      "one token per row of this batch"});
  m.infer_enqueue(two, draw);
  m.infer_enqueue(two, fed);
  EXPECT_EQ(m.in_flight(), 2);
  expect_error([&] { m.infer_enqueue(two, fed); }, {"model: 2 forwards in flight; infer_collect() one first"});
  expect_error([&] { m.infer(two, InferRequest::all_logits()); }, {"model: infer() with 2 forwards in flight"});
  const InferResult first = m.infer_collect(), second = m.infer_collect();
  // The fed forward's tokens are the first one's draws: the same as a forward of those tokens.
  const InferResult direct = m.infer(decode_batch(first.tokens, {0, 0}), draw);
  EXPECT_EQ(second.tokens, direct.tokens);
  EXPECT_EQ(second.logprobs, direct.logprobs);
  // A batch of another shape cannot take the last forward's draws.
  InferRequest fed3 = fed;
  fed3.list = {0, 1, 2};
  fed3.keys = {1, 2, 3};
  expect_error([&] { m.infer_enqueue(three, fed3); }, {"(3 rows; it drew 2)"});
  EXPECT_EQ(m.in_flight(), 0);
  // A forward that draws nothing leaves nothing to take.
  m.infer(two, InferRequest::all_logits());
  expect_error([&] { m.infer_enqueue(two, fed); }, {"(2 rows; it drew 0)"});
  // A forward of another layout (every row's draw without a row list: no logit-row table) cannot
  // take the draws, though it has as many rows; and the draws are spent by the failed attempt.
  m.infer_enqueue(two, draw);
  InferRequest fed_all = fed;
  fed_all.rows = InferRequest::Rows::kAll;
  fed_all.list.clear();
  expect_error([&] { m.infer_enqueue(two, fed_all); }, {"but into the layout of a batch of another shape"});
  expect_error([&] { m.infer_enqueue(two, fed); }, {"(2 rows; it drew 0)"});
  m.infer_collect();
  // After an error with a forward in flight, infer_abandon() makes the model usable again.
  m.infer_enqueue(two, draw);
  expect_error([&] { m.infer_enqueue(three, fed3); }, {"(3 rows; it drew 2)"});
  EXPECT_EQ(m.in_flight(), 1);
  expect_error([&] { m.infer(two, draw); }, {"model: infer() with 1 forwards in flight"});
  m.infer_abandon();
  EXPECT_EQ(m.in_flight(), 0);
  expect_error([&] { m.infer_enqueue(two, fed); }, {"(2 rows; it drew 0)"});
  const InferResult again = m.infer(decode_batch(first.tokens, {0, 0}), draw);
  EXPECT_EQ(again.tokens, direct.tokens) << "the same forward as before the error";
  EXPECT_EQ(again.logprobs, direct.logprobs);
}

TEST(Sampler, NucleusAndTemperature) {
  // p = (0.1, 0.2, 0.3, 0.4): top_p 0.5 keeps {3, 2}; the draw follows the kept mass in order.
  const double x[4] = {std::log(0.1), std::log(0.2), std::log(0.3), std::log(0.4)};
  EXPECT_EQ(sample_token(x, 4, 1.0, 0.5, 0.0).token, 3);
  EXPECT_EQ(sample_token(x, 4, 1.0, 0.5, 0.56).token, 3);   // 0.4 / 0.7 = 0.571
  EXPECT_EQ(sample_token(x, 4, 1.0, 0.5, 0.58).token, 2);
  EXPECT_EQ(sample_token(x, 4, 1.0, 1.0, 0.05).token, 0);   // all kept, id order
  EXPECT_EQ(sample_token(x, 4, 1.0, 1.0, 0.95).token, 3);
  EXPECT_EQ(sample_token(x, 4, 0.0, 1.0, 0.99).token, 3);   // greedy ignores u
  EXPECT_NEAR(sample_token(x, 4, 0.5, 1.0, 0.3).logprob, std::log(sample_token(x, 4, 0.5, 1.0, 0.3).token + 1) -
                                                              std::log(10.0), 1e-12);  // logprob at T = 1
  // Frequencies over a fine grid of u: exactly the tempered probabilities.
  int count[4] = {0, 0, 0, 0};
  for (int i = 0; i < 10000; ++i) count[sample_token(x, 4, 2.0, 1.0, (i + 0.5) / 10000).token]++;
  double z = 0;
  for (double p : {0.1, 0.2, 0.3, 0.4}) z += std::sqrt(p);
  EXPECT_NEAR(count[0] / 10000.0, std::sqrt(0.1) / z, 2e-4);
  EXPECT_NEAR(count[3] / 10000.0, std::sqrt(0.4) / z, 2e-4);
}

// The backend's sampler (ops/cpu/sampling.h): the Gumbel-max draw follows softmax(x / T); greedy
// takes the first maximum; logprobs are at temperature 1. 40000 independent keys: each frequency
// within 5 standard deviations (sqrt(p (1 - p) / n) <= 2.5e-3) of its probability.
TEST(Sampler, GumbelMaxDrawsTheTemperedSoftmax) {
  const int R = 40000, V = 4;
  const double p[V] = {0.1, 0.2, 0.3, 0.4};
  std::vector<double> x((size_t)R * V);
  std::vector<uint64_t> keys(R);
  for (int r = 0; r < R; ++r) {
    keys[r] = 1000003ull * r + 17;
    for (int v = 0; v < V; ++v) x[(size_t)r * V + v] = std::log(p[v]);
  }
  std::vector<int32_t> tok(R);
  std::vector<double> lp(R);
  cpu::sample_rows(tok.data(), lp.data(), x.data(), R, V, 2.0, keys.data());
  int count[V] = {0, 0, 0, 0};
  for (int r = 0; r < R; ++r) {
    count[tok[r]]++;
    ASSERT_NEAR(lp[r], std::log(p[tok[r]]), 1e-12);
  }
  double z = 0;
  for (double q : p) z += std::sqrt(q);
  for (int v = 0; v < V; ++v) EXPECT_NEAR(count[v] / (double)R, std::sqrt(p[v]) / z, 5 * 2.5e-3) << "token " << v;
  const double tie[3] = {1.0, 3.0, 3.0};
  int32_t t = -1;
  double l = 0;
  cpu::sample_rows(tok.data(), &l, tie, 1, 3, 0.0, keys.data());
  t = tok[0];
  EXPECT_EQ(t, 1);
  // The same key draws the same token; a generation at T > 0 with top_p = 1 repeats per seed.
  Model<double> m(config("llama"));
  init(m, 13);
  SamplingOptions o;
  o.temperature = 0.8;
  o.num_samples = 3;
  o.max_new_tokens = 5;
  o.seed = 9;
  const std::vector<Completion> a = generate(m, {{"x", {1, 2, 3}}}, o), b = generate(m, {{"x", {1, 2, 3}}}, o);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(a[0].samples[s].tokens, b[0].samples[s].tokens);
  EXPECT_NE(a[0].samples[0].tokens, a[0].samples[1].tokens) << "samples draw independently";
}

TEST(Generate, ErrorsNameThePromptOrOption) {
  Model<double> m(config("qwen3"));
  m.init(1);
  SamplingOptions o;
  o.max_new_tokens = 60;
  try {
    generate(m, {{"long", {1, 2, 3, 4, 5}}}, o);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1 ('long'): 5 tokens + --max-new-tokens 60 exceed "
                                         "model.max_position_embeddings 64"),
              std::string::npos)
        << e.what();
  }
  o.max_new_tokens = 4;
  try {
    generate(m, {{"ok", {1}}, {"bad", {1, 13}}}, o);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 2 ('bad'): token 13 outside vocab_size 13"), std::string::npos)
        << e.what();
  }
  o.top_p = 0;
  EXPECT_THROW(generate(m, {{"ok", {1}}}, o), Error);
}

// An inference-only model holds the weights and nothing else: training calls are errors.
TEST(Inference, ModelHasNoGradients) {
  DecoderOptions io;
  io.inference = true;
  Model<double> m(config("qwen3"), io);
  m.init(2);
  Model<double> t(config("qwen3"));
  t.init(2);
  const data::PackedBatch b = chain_batch({1, 2, 3, 4});
  EXPECT_EQ(m.infer(b, InferRequest::all_logits()).logits, t.infer(b, InferRequest::all_logits()).logits);
  try {
    m.forward(b, 1.0);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a training forward on an inference-only model"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.zero_grad(), Error);
}

}  // namespace
}  // namespace tt::model
