// `treetrain sample` (trainer/sample.h) on the CPU:
//  - K > 1 writes a rollouts line per prompt that the trainer reads as it is, and the sampled
//    group trained with tree packing gives the loss and gradients of per-path packing (fp64,
//    1e-10 relative: the same sums in other orders), for a dense and a hybrid (qwen3_5_text) model;
//  - K = 1 writes tokens, logprobs and the finish reason; a seed reproduces the file;
//  - a run_dir resolves to its newest checkpoint; bad prompts, flags and directories are errors
//    naming the file, line or key.
#include "trainer/sample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/check.h"
#include "data/packing.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/segments.h"
#include "tests/model/model_test_util.h"
#include "tests/trainer/test_util.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

fs::path test_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path d = fs::path(tmp ? tmp : "/tmp") / ("sample_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A dense Qwen3, or (hybrid) a qwen3_5_text whose Gated DeltaNet layers sample with their
// recurrent state and conv window in the cache.
model::ModelConfig tiny(bool hybrid = false) {
  model::ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.initializer_range = 0.2;
  c.max_position_embeddings = 64;
  if (hybrid) model::testing::make_hybrid(c, "qwen3_5_text", /*value_head_dim=*/4);
  return c;
}

// A saved HF directory of a seeded model.
std::string saved_model(const fs::path& dir, bool hybrid = false) {
  model::Model<float> m(tiny(hybrid));
  m.init(9);
  model::save_hf(dir.string(), m, "F32");
  return dir.string();
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

class SampleGroups : public ::testing::TestWithParam<bool> {};

TEST_P(SampleGroups, TrainAsTreesLikePerPath) {
  const bool hybrid = GetParam();
  const fs::path d = test_dir(hybrid ? "groups_hybrid" : "groups");
  SampleCommand c;
  c.checkpoint = saved_model(d / "model", hybrid);
  c.prompts = (d / "prompts.jsonl").string();
  write_file(c.prompts, "{\"id\": \"a\", \"tokens\": [1, 2, 3]}\n\n{\"id\": 7, \"tokens\": [5, 4, 3, 2, 1]}\n");
  c.out = (d / "out.jsonl").string();
  c.device = "cpu";
  c.sampling.num_samples = 4;
  c.sampling.max_new_tokens = 5;
  c.sampling.temperature = 1.5;
  c.sampling.seed = 3;
  EXPECT_EQ(run_sample(c), 2);

  const std::string text = read_file(c.out);
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["id"], "a");
  ASSERT_EQ(j["sequences"].size(), 4u);
  for (const auto& s : j["sequences"]) {
    EXPECT_EQ(s["tokens"].size(), 8u);
    EXPECT_EQ(s["loss_mask"], nlohmann::json({0, 0, 0, 1, 1, 1, 1, 1}));
    EXPECT_EQ(s["weight"], 1.0);
    EXPECT_EQ(s["logprobs"].size(), 5u);
    EXPECT_EQ(s["finish_reason"], "length");
  }

  // The trainer's reader takes the file as it is; tree and per-path packings agree.
  const std::vector<data::Tree> trees = data::read_trees(c.out, data::Format::kRollouts, 40);
  ASSERT_EQ(trees.size(), 2u);
  EXPECT_EQ(trees[0].n_paths(), 4);
  EXPECT_LT(trees[0].n_tree(), trees[0].n_flat()) << "the samples share the prompt";
  std::vector<const data::Tree*> ptrs = {&trees[0], &trees[1]};
  const data::PackedBatch tree = data::pack(ptrs, data::Packing::kTree);
  const data::PackedBatch paths = data::pack(ptrs, data::Packing::kPerPath);
  model::Model<double> m(tiny(hybrid));
  model::load_hf_weights(c.checkpoint, m);
  m.zero_grad();
  const double lt = m.forward(tree, 1.0 / 8);
  m.backward();
  const std::vector<double> gt(m.grads(), m.grads() + m.num_params());
  m.zero_grad();
  const double lp = m.forward(paths, 1.0 / 8);
  m.backward();
  EXPECT_NEAR(lt, lp, 1e-10 * std::fabs(lp));
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < m.num_params(); ++i) {
    diff = std::max(diff, std::fabs(gt[i] - m.grads()[i]));
    scale = std::max(scale, std::fabs(m.grads()[i]));
  }
  EXPECT_LE(diff, 1e-10 * scale);
}

INSTANTIATE_TEST_SUITE_P(Models, SampleGroups, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "hybrid" : "dense"; });

TEST(Sample, OneSampleLinesAndSeeds) {
  const fs::path d = test_dir("one");
  SampleCommand c;
  c.checkpoint = saved_model(d / "model");
  c.prompts = (d / "prompts.jsonl").string();
  write_file(c.prompts, "{\"tokens\": [1, 2]}\n");
  c.out = (d / "a.jsonl").string();
  c.device = "cpu";
  c.sampling.max_new_tokens = 6;
  c.sampling.seed = 11;
  run_sample(c);
  const nlohmann::json j = nlohmann::json::parse(read_file(c.out));
  EXPECT_EQ(j["id"], c.prompts + ":1");
  EXPECT_EQ(j["tokens"].size(), 6u);
  EXPECT_EQ(j["logprobs"].size(), 6u);
  EXPECT_EQ(j["finish_reason"], "length");
  c.out = (d / "b.jsonl").string();
  run_sample(c);
  EXPECT_EQ(read_file(d / "a.jsonl"), read_file(d / "b.jsonl")) << "the seed reproduces the run";
  // A stop id at the first greedy token ends every sample there.
  c.sampling.temperature = 0;
  c.out = (d / "g.jsonl").string();
  run_sample(c);
  const int first = nlohmann::json::parse(read_file(c.out))["tokens"][0];
  c.sampling.stop = {first};
  run_sample(c);
  const nlohmann::json s = nlohmann::json::parse(read_file(c.out));
  EXPECT_EQ(s["tokens"], nlohmann::json({first}));
  EXPECT_EQ(s["finish_reason"], "stop");
  // --set model.eos_token_id does the same as eos.
  c.sampling.stop = {};
  c.sets = {"model.eos_token_id=" + std::to_string(first)};
  run_sample(c);
  EXPECT_EQ(nlohmann::json::parse(read_file(c.out))["finish_reason"], "eos");
  // A list, as config.json writes it.
  c.sets = {"model.eos_token_id=[" + std::to_string((first + 1) % 40) + ", " + std::to_string(first) + "]"};
  run_sample(c);
  EXPECT_EQ(nlohmann::json::parse(read_file(c.out))["finish_reason"], "eos");
}

// A prompts file of one 70-token prompt "long" (tokens (i a + b) % 40, past the tiny models'
// 64 positions); returns its tokens.
std::vector<int32_t> long_prompt(const std::string& path, int a, int b) {
  std::string line = "{\"id\": \"long\", \"tokens\": [";
  std::vector<int32_t> toks;
  for (int i = 0; i < 70; ++i) {
    toks.push_back((i * a + b) % 40);
    line += (i ? ", " : "") + std::to_string(toks.back());
  }
  write_file(path, line + "]}\n");
  return toks;
}

// Segments: --set turns them on; a prompt longer than max_position_embeddings then generates
// (positions stay below segments.length + tail); the file equals generate_segmented on the same
// weights; a checkpoint whose run trained with segments (its config.yaml) generates with them;
// --device cuda takes them to the GPU's backend, which this model (head dim 8) or this machine (no
// GPU in CI) refuses with the device error.
TEST(Sample, SegmentsFromSetAndFromTheRunsConfig) {
  const fs::path d = test_dir("segments");
  SampleCommand c;
  c.checkpoint = saved_model(d / "model");
  c.prompts = (d / "prompts.jsonl").string();
  const std::vector<int32_t> toks = long_prompt(c.prompts, 5, 1);
  c.device = "cpu";
  c.out = (d / "seg.jsonl").string();
  c.sampling.max_new_tokens = 9;
  c.sampling.temperature = 0;
  c.sets = {"segments.length=16", "segments.tail=8", "segments.long_range.layers=[1]", "segments.long_range.heads=0",
            "segments.long_range.retrieve=8"};
  run_sample(c);
  const nlohmann::json j = nlohmann::json::parse(read_file(c.out));
  ASSERT_EQ(j["tokens"].size(), 9u);

  model::SegmentConfig seg;
  seg.length = 16;
  seg.tail = 8;
  seg.long_range = {{1}, {0}, 8};
  model::Model<float> m(tiny());
  m.init(9);
  model::SamplingOptions opt = c.sampling;
  const std::vector<model::Completion> want = model::generate_segmented(m, seg, {model::Prompt{"long", toks}}, opt);
  EXPECT_EQ(j["tokens"], nlohmann::json(want[0].samples[0].tokens));

  // The run's config.yaml beside the checkpoint carries the segments section.
  write_file(fs::path(c.checkpoint) / "config.yaml",
             "data:\n  path: x\nmodel:\n  vocab_size: 40\n  hidden_size: 16\n  intermediate_size: 32\n"
             "  num_hidden_layers: 2\n  num_attention_heads: 2\n  num_key_value_heads: 1\n  head_dim: 8\n"
             "  max_position_embeddings: 64\nsegments:\n  length: 16\n  tail: 8\n  long_range:\n    layers: [1]\n"
             "    heads: [0]\n    retrieve: 8\n");
  c.sets = {};
  c.out = (d / "from_run.jsonl").string();
  run_sample(c);
  EXPECT_EQ(read_file(d / "from_run.jsonl"), read_file(d / "seg.jsonl"));
  c.device = "cuda";
  try {
    run_sample(c);
    ADD_FAILURE() << "head dim 8 on cuda must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device: cuda but"), std::string::npos) << e.what();
  }
}

// A hybrid checkpoint samples with segments too (--set): its Gated DeltaNet states continue
// across the boundaries of a prompt longer than max_position_embeddings; the file equals
// generate_segmented on the same weights, 4 samples each from its own copy of the prompt's state.
TEST(Sample, AHybridSamplesWithSegments) {
  const fs::path d = test_dir("segments_hybrid");
  SampleCommand c;
  c.checkpoint = saved_model(d / "model", /*hybrid=*/true);
  c.prompts = (d / "prompts.jsonl").string();
  const std::vector<int32_t> toks = long_prompt(c.prompts, 7, 3);
  c.device = "cpu";
  c.out = (d / "seg.jsonl").string();
  c.sampling.max_new_tokens = 20;
  c.sampling.num_samples = 4;
  c.sampling.temperature = 1.0;
  c.sampling.seed = 11;
  c.sets = {"segments.length=16", "segments.tail=8"};
  run_sample(c);
  model::SegmentConfig seg;
  seg.length = 16;
  seg.tail = 8;
  model::Model<float> m(tiny(/*hybrid=*/true));
  m.init(9);
  const std::vector<model::Completion> want =
      model::generate_segmented(m, seg, {model::Prompt{"long", toks}}, c.sampling);
  const nlohmann::json j = nlohmann::json::parse(read_file(c.out));
  ASSERT_EQ(j["sequences"].size(), 4u);
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> gen;
    for (size_t t = toks.size(); t < j["sequences"][s]["tokens"].size(); ++t) gen.push_back(j["sequences"][s]["tokens"][t]);
    EXPECT_EQ(gen, want[0].samples[s].tokens) << "sample " << s;
  }
}

TEST(Sample, ErrorsNameTheFileLineOrKey) {
  const fs::path d = test_dir("errors");
  SampleCommand c;
  c.checkpoint = saved_model(d / "model");
  c.prompts = (d / "prompts.jsonl").string();
  c.device = "cpu";
  c.out = (d / "out.jsonl").string();
  auto expect_error = [&](const std::string& want) {
    try {
      run_sample(c);
      ADD_FAILURE() << "expected tt::Error containing: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  write_file(c.prompts, "{\"tokens\": [1]}\n{\"tokens\": [1, \"x\"]}\n");
  expect_error(c.prompts + ":2: tokens: \"x\" is not a token id");
  write_file(c.prompts, "{\"tokens\": []}\n");
  expect_error(c.prompts + ":1: tokens: expected a non-empty list of token ids");
  write_file(c.prompts, "{\"tokens\": [1]}\n\n{\"tokens\": [1, 99]}\n");
  expect_error(c.prompts + ":3: tokens: 99 is outside the model's vocab_size 40 (expected ids in [0, 40))");
  write_file(c.prompts, "{\"tokens\": [1]}\n");
  c.sets = {"train.lr=1"};
  expect_error("--set train.lr: unknown key for 'sample'");
  c.sets = {};
  // Stop and eos ids must be token ids of the model, as config.json's eos_token_id must.
  c.sampling.stop = {999};
  expect_error("--stop 999: outside vocab_size 40 of " + c.checkpoint + " (expected ids in [0, 40))");
  c.sampling.stop = {};
  {  // A NaN weight: an error naming the tensor, not NaN logits and arbitrary tokens.
    const fs::path nan_model = d / "nan_model";
    SampleCommand n = c;
    n.checkpoint = saved_model(nan_model);
    trainer::testing::poke_f32(nan_model / "model.safetensors", "lm_head.weight", 7, NAN);
    try {
      run_sample(n);
      ADD_FAILURE() << "expected tt::Error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), n.checkpoint + ": weight lm_head.weight element 7 is nan, expected finite weights");
    }
  }
  {  // Finite weights whose forward overflows: an error, not NaN log-probabilities and token 0.
    const fs::path big = d / "big_model";
    model::Model<float> m(tiny());
    m.init(9);
    float* head = m.param("lm_head.weight");
    for (int64_t i = 0; i < 40 * 16; ++i) head[i] = i % 2 ? 3e38f : -3e38f;
    model::save_hf(big.string(), m, "F32");
    SampleCommand n = c;
    n.checkpoint = big.string();
    n.sampling.max_new_tokens = 4;
    try {
      run_sample(n);
      ADD_FAILURE() << "expected tt::Error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("prompt 1, sample 1, new token 1: the model's logits are not finite", 0), 0u)
          << e.what();
    }
  }
  c.sets = {"model.eos_token_id=999"};
  expect_error("--set model.eos_token_id=999: eos_token_id 999 outside vocab_size 40 (expected ids in [0, 40))");
  c.sets = {"model.eos_token_id=3,-4"};
  expect_error("--set model.eos_token_id=3,-4: eos_token_id -4 outside vocab_size 40 (expected ids in [0, 40))");
  c.sets = {"segments.long_range.layers=4294967297"};
  expect_error("--set segments.long_range.layers=4294967297: 4294967297 is out of range [0, 2147483647]");
  c.sets = {};
  // Folders: --prompts says so; --out is checked before any generation.
  const std::string prompts = c.prompts;
  c.prompts = d.string();
  expect_error(d.string() + ": is a folder, expected a JSONL file of prompts (--prompts)");
  c.prompts = prompts;
  c.out = d.string();
  expect_error("--out " + d.string() + ": is a folder, expected a regular file or a new name");
  // Nor into the checkpoint being read (its weights would be replaced by completions).
  c.out = c.checkpoint + "/model.safetensors";
  expect_error("--out " + c.out + ": a file of the checkpoint folder " + c.checkpoint +
               " being read (the completions would replace it); write them to a new file");
  fs::create_symlink("model/config.json", d / "link.jsonl");  // through a link too
  c.out = (d / "link.jsonl").string();
  expect_error("--out " + c.out + ": a file of the checkpoint folder " + c.checkpoint);
  c.out = (d / "out.jsonl").string();
  // A value that fails the model's or the sampler's rules names the --set that gave it.
  c.sets = {"model.max_position_embeddings=99999999999"};
  expect_error("--set model.max_position_embeddings=99999999999: model config: max_position_embeddings must be in");
  c.sets = {"sample.max_batch_tokens=0"};
  expect_error("--set sample.max_batch_tokens=0: max_batch_tokens: 0, expected >= 1");
  c.sets = {"model.eos_token_id=1,,2"};
  expect_error("--set model.eos_token_id=1,,2: an empty entry, expected integers separated by commas");
  c.sets = {};
  // A KV cache larger than the machine: an error naming the flags, before the model loads.
  c.sampling.num_samples = 1 << 16;
  c.sampling.max_new_tokens = 1 << 24;
  c.sets = {"model.max_position_embeddings=33554432"};
  expect_error("sample: the KV cache of 1099511627777 rows (a prompt's tokens + --num-samples 65536 x "
               "--max-new-tokens 16777216) needs ");
  expect_error("; lower --num-samples or --max-new-tokens");
  c.sampling = model::SamplingOptions{};
  c.sets = {};
  c.checkpoint = (d / "nothing").string();
  expect_error("--checkpoint " + c.checkpoint + ": expected a checkpoint or Hugging Face directory");
  // A run_dir whose only checkpoint folder is invalid: named, not called empty.
  const fs::path run = d / "run";
  fs::create_directories(run / "checkpoints" / "step_3");
  c.checkpoint = run.string();
  expect_error("--checkpoint " + c.checkpoint + ": a run_dir with 1 checkpoint folder, none of them valid (newest " +
               (run / "checkpoints" / "step_3").string() + ": " +
               (run / "checkpoints" / "step_3" / "trainer_state.json").string() + ": missing)");
  EXPECT_FALSE(fs::exists(c.out)) << "nothing is written on an error";
}

}  // namespace
}  // namespace tt::trainer
