// The capability check of segment-level execution (issue 18): a tiny model trained through the
// trainer on a synthetic long-range task must answer with retrieval heads and cannot without them.
//
// The task: a 34-token document of filler tokens (2 filler ids) holds a marker followed by a value
// (one of 8) in its first 6 tokens; a query token ends the fourth segment and opens the fifth, and
// the target is the value, predicted by that second query row (the only loss row). Segments of 8
// tokens with a 2-row tail: the value lies 4 segments before, never in the tail or the query's
// segment. Two layers carry it at most one segment through the tails (a tail row's layer-0 K/V
// are its own token's, so only the layer-1 tail knows its segment, and a layer-1 output goes no
// further), so without retrieval the model stays near chance (1/8). With one long-range head
// (layer 0, KV head 1) retrieving 8 pairs per segment, the fifth segment's retrieval is scored by
// the fourth's end query, the query token itself: learning to attend to the value among the
// retrieved pairs teaches it to retrieve the value (in layer 0 the end query and the reading query
// are the same vector before RoPE). Accuracy is greedy generation through the same segment
// operator (generate_segmented) on 64 held-out documents, for 3 training seeds; the thresholds
// are fixed here (>= 0.9 with retrieval, <= 0.35 without) and every number is printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "model/decoder.h"
#include "model/segments.h"
#include "tests/trainer/test_util.h"
#include "trainer/train.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

constexpr int kMark = 0, kQuery = 1, kValues = 8, kFirstValue = 2, kFirstFiller = 10;
constexpr int kVocab = 12;  // marker, query, 8 values, 2 fillers
constexpr int kLen = 33;  // input tokens; the value to predict is token 33

// Document d of a seed: fillers, the marker and its value at a random place of the first 6
// tokens, the query at depths 31 and 32, then the value (the only target).
std::vector<int32_t> document(uint64_t seed, int d) {
  std::mt19937_64 rng(seed * 1000003 + d);
  std::vector<int32_t> t(kLen + 1);
  for (int i = 0; i < kLen; ++i) t[i] = kFirstFiller + (int)(rng() % (kVocab - kFirstFiller));
  const int at = (int)(rng() % 5);
  const int value = kFirstValue + (int)(rng() % kValues);
  t[at] = kMark;
  t[at + 1] = value;
  t[kLen - 2] = kQuery;
  t[kLen - 1] = kQuery;
  t[kLen] = value;
  return t;
}

void write_documents(const fs::path& file, uint64_t seed, int n) {
  std::ofstream out(file);
  for (int d = 0; d < n; ++d) {
    const std::vector<int32_t> t = document(seed, d);
    out << "{\"id\": " << d << ", \"tokens\": [";
    for (size_t i = 0; i < t.size(); ++i) out << (i ? ", " : "") << t[i];
    out << "], \"loss_mask\": [";
    for (size_t i = 0; i < t.size(); ++i) out << (i ? ", " : "") << (i + 1 == t.size() ? 1 : 0);
    out << "]}\n";
  }
}

RunConfig task_config(const fs::path& dir, uint64_t seed, bool retrieval) {
  RunConfig c;
  c.source = "capability";
  c.run_dir = (dir / "run").string();
  c.device = "cpu";
  c.model.vocab_size = kVocab;
  c.model.hidden_size = 32;
  c.model.intermediate_size = 64;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.head_dim = 16;
  c.model.max_position_embeddings = 64;
  c.data.path = (dir / "docs.jsonl").string();
  c.data.format = "tokens";
  c.data.max_tokens_per_batch = 64;
  c.train.max_steps = 300;
  c.train.seed = seed;
  c.train.grad_accum = 16;
  c.train.log_every = 100;
  c.train.final_checkpoint = false;
  c.train.loss_norm = "token_mean";
  c.optim.lr = 3e-3;
  c.schedule.warmup_steps = 20;
  c.segments.length = 8;
  c.segments.tail = 2;
  c.segments.tbptt = 1;
  if (retrieval) c.segments.long_range = {{0}, {1}, 8};  // layer 0, KV head 1, a segment's worth of pairs
  c.validate();
  return c;
}

// Greedy answers of held-out documents through the segment operator.
double accuracy(const RunConfig& c, const std::vector<float>& params) {
  model::Model<float> m(c.model);
  m.set_params(params.data());
  std::vector<model::Prompt> prompts;
  std::vector<int32_t> answers;
  for (int d = 0; d < 64; ++d) {
    std::vector<int32_t> t = document(999, d);
    answers.push_back(t.back());
    t.pop_back();
    prompts.push_back(model::Prompt{std::to_string(d), t});
  }
  model::SamplingOptions opt;
  opt.max_new_tokens = 1;
  opt.temperature = 0;
  const std::vector<model::Completion> out = model::generate_segmented(m, c.segments, prompts, opt);
  int right = 0;
  for (size_t d = 0; d < out.size(); ++d) right += out[d].samples[0].tokens[0] == answers[d];
  return (double)right / (double)out.size();
}

TEST(SegmentsCapability, RetrievalHeadsReachAKeySegmentsBackAndTheTailAloneCannot) {
  for (uint64_t seed : {1, 2, 3}) {
    double acc[2];
    for (bool retrieval : {true, false}) {
      const fs::path dir = testing::fresh_dir(str("capability_", seed, retrieval ? "_retrieval" : "_tail"));
      write_documents(dir / "docs.jsonl", seed, 512);
      const RunConfig c = task_config(dir, seed, retrieval);
      Trainer t(c);
      const std::vector<StepMetrics> ms = t.run();
      acc[retrieval] = accuracy(c, t.backend().params_host());
      std::printf("capability: seed %d, %s: final loss %.3f, held-out accuracy %.3f (chance %.3f)\n", (int)seed,
                  retrieval ? "retrieval heads" : "tail only", ms.back().loss, acc[retrieval], 1.0 / kValues);
    }
    EXPECT_GE(acc[1], 0.9) << "seed " << seed << ": retrieval heads must find the value";
    EXPECT_LE(acc[0], 0.35) << "seed " << seed << ": the tail alone cannot carry it 4 segments";
  }
}

}  // namespace
}  // namespace tt::trainer
