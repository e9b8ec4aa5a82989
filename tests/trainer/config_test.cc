// Strict config parsing: errors name file:line and the key; --set; validate(); to_yaml round trip.
#include "trainer/config.h"
#include "trainer/yaml_doc.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/check.h"
#include "bench/qwen3_shapes.h"
#include "model/decoder.h"
#include "tests/trainer/test_util.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

const char* const kMinimal = "data:\n  path: data.jsonl\n";

using testing::error_of;

std::string parse_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  return error_of([&] { parse_config_text(text, "run.yaml", sets); });
}

fs::path tmpdir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? fs::path(t) : fs::temp_directory_path();
}

TEST(ConfigTest, DefaultsWithOnlyDataPath) {
  const RunConfig c = parse_config_text(kMinimal, "run.yaml", {});
  EXPECT_EQ(c.data.path, "data.jsonl");
  EXPECT_EQ(c.train.max_steps, 100);
  EXPECT_EQ(c.model.architecture, "qwen3");
  EXPECT_EQ(c.device, "auto");
}

TEST(ConfigTest, ParsesEveryKind) {
  const RunConfig c = parse_config_text(
      "run_dir: out/r1\n"
      "device: cpu\n"
      "model:\n  architecture: llama\n  hidden_size: 64\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
      "  tie_word_embeddings: true\n  rope_theta: 5e5\n"
      "data:\n  path: d.jsonl\n  format: tree\n  packing: per_path\n  shuffle: false\n"
      "train:\n  max_steps: 7\n  seed: 42\n  loss_norm: token_mean\n  grad_accum: 3\n"
      "optim:\n  lr: 3e-4\n  betas: [0.8, 0.99]\n"
      "schedule:\n  warmup_steps: 2\n  decay: linear\n  min_lr_ratio: 0\n",
      "run.yaml", {});
  EXPECT_EQ(c.run_dir, "out/r1");
  EXPECT_EQ(c.model.architecture, "llama");
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.head_dim, 16);  // omitted: hidden_size / num_attention_heads
  EXPECT_TRUE(c.model.tie_word_embeddings);
  EXPECT_EQ(c.model.rope_theta, 5e5);
  EXPECT_EQ(c.data.format, "tree");
  EXPECT_EQ(c.data.packing, "per_path");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.train.max_steps, 7);
  EXPECT_EQ(c.train.seed, 42u);
  EXPECT_EQ(c.train.grad_accum, 3);
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.beta1, 0.8);
  EXPECT_EQ(c.optim.beta2, 0.99);
  EXPECT_EQ(c.schedule.decay, "linear");
  EXPECT_EQ(c.schedule.min_lr_ratio, 0.0);
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndExpectedKeys) {
  const std::string e = parse_error("data:\n  path: x\ntrain:\n  max_steps: 3\n  foo: 1\n");
  EXPECT_NE(e.find("run.yaml:5: unknown key 'train.foo' (expected one of: max_steps, seed,"), std::string::npos) << e;
}

TEST(ConfigTest, UnknownTopLevelKey) {
  const std::string e = parse_error("data:\n  path: x\nmodle:\n  vocab_size: 3\n");
  EXPECT_NE(e.find("run.yaml:3: unknown key 'modle'"), std::string::npos) << e;
}

TEST(ConfigTest, WrongTypeNamesKeyAndValue) {
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: abc\n"),
            "run.yaml:4: train.max_steps: expected an integer, got 'abc'");
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: 1.5\n"),
            "run.yaml:4: train.max_steps: expected an integer, got '1.5'");
  EXPECT_EQ(parse_error("data:\n  path: x\noptim:\n  lr: fast\n"), "run.yaml:4: optim.lr: expected a number, got 'fast'");
  EXPECT_EQ(parse_error("data:\n  path: x\n  shuffle: maybe\n"),
            "run.yaml:3: data.shuffle: expected a boolean (true|false), got 'maybe'");
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: [1, 2]\n"),
            "run.yaml:4: train.max_steps: expected an integer, got a list");
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: \"3\"\n"),
            "run.yaml:4: train.max_steps: expected an integer, got the quoted string \"3\"; write it without quotes");
  EXPECT_EQ(parse_error("data:\n  path: x\noptim:\n  lr: '3e-4'\n"),
            "run.yaml:4: optim.lr: expected a number, got the quoted string \"3e-4\"; write it without quotes");
  EXPECT_EQ(parse_error("data:\n  path: x\n  shuffle: \"true\"\n"),
            "run.yaml:3: data.shuffle: expected a boolean (true|false), got the quoted string \"true\"; write it "
            "without quotes");
  EXPECT_EQ(parse_error("data:\n  path: x\n  history: {window: \"4\"}\n"),
            "run.yaml:3: data.history.window: expected an integer >= 1, got the quoted string \"4\"; write it "
            "without quotes");
  EXPECT_EQ(parse_error("data: 3\n"), "run.yaml:1: data: expected a mapping, got '3'");
  // A YAML tag would be dropped by the reader (max_steps: !!str 2 read as 2): an error.
  const std::string tag = ") is not read here; write the value without it (numbers and booleans plain, strings plain "
                          "or in quotes)";
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: !!str 2\n"), "run.yaml:4: a YAML tag (!!str" + tag);
  EXPECT_EQ(parse_error("data:\n  path: x\noptim:\n  lr: !!int 3.0e-3\n"), "run.yaml:4: a YAML tag (!!int" + tag);
  EXPECT_EQ(parse_error("data: !mine\n  path: x\n"), "run.yaml:1: a YAML tag (!mine" + tag);
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps=!!str 2"}), "--set train.max_steps=!!str 2: a YAML tag (!!str" + tag);
  EXPECT_EQ(parse_error("data:\n  path: x\noptim:\n  betas: [0.9]\n"),
            "run.yaml:4: optim.betas: expected a list [beta1, beta2], got a list of 1");
}

TEST(ConfigTest, BadEnumNamesAllowedValues) {
  EXPECT_EQ(parse_error("data:\n  path: x\n  packing: flat\n"),
            "run.yaml:3: data.packing: expected one of tree|per_path, got 'flat'");
  EXPECT_EQ(parse_error("device: tpu\ndata:\n  path: x\n"), "run.yaml:1: device: expected one of auto|cpu|cuda, got 'tpu'");
  EXPECT_EQ(parse_error("data:\n  path: x\nschedule:\n  decay: exp\n"),
            "run.yaml:4: schedule.decay: expected one of cosine|linear|constant, got 'exp'");
}

TEST(ConfigTest, DuplicateKeyIsAnError) {
  EXPECT_EQ(parse_error("data:\n  path: x\n  path: y\n"), "run.yaml:3: duplicate key 'data.path'");
}

TEST(ConfigTest, InvalidYamlNamesLine) {
  const std::string e = parse_error("data:\n  path: [x\n");
  EXPECT_EQ(e.rfind("run.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
}

TEST(ConfigTest, SetOverrides) {
  const RunConfig c = parse_config_text(kMinimal, "run.yaml",
                                        {"train.max_steps=12", "optim.lr=0.01", "optim.betas=[0.5, 0.6]",
                                         "data.shuffle=false", "run_dir=elsewhere", "device=cpu"});
  EXPECT_EQ(c.train.max_steps, 12);
  EXPECT_EQ(c.optim.lr, 0.01);
  EXPECT_EQ(c.optim.beta1, 0.5);
  EXPECT_EQ(c.optim.beta2, 0.6);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.run_dir, "elsewhere");
  EXPECT_EQ(c.device, "cpu");
}

TEST(ConfigTest, SetUnknownKeyNamesTheOverride) {
  const std::string e = parse_error(kMinimal, {"train.foo=1"});
  EXPECT_EQ(e.rfind("--set train.foo=1: unknown key 'train.foo'", 0), 0u) << e;
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps=abc"}),
            "--set train.max_steps=abc: train.max_steps: expected an integer, got 'abc'");
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps"}).rfind("--set train.max_steps: expected KEY=VALUE", 0), 0u);
  EXPECT_EQ(parse_error(kMinimal, {"train=3"}).rfind("--set train=3: unknown key 'train'", 0), 0u);
  EXPECT_EQ(parse_error(kMinimal, {"train.gemm_autotune=maybe"}),
            "--set train.gemm_autotune=maybe: train.gemm_autotune: expected a boolean (true|false), got 'maybe'");
  EXPECT_EQ(parse_error(kMinimal, {"train.gdn_products=fp16"}),
            "--set train.gdn_products=fp16: train.gdn_products: expected one of exact|bf16, got 'fp16'");
}

TEST(ConfigTest, ValidateNamesTheKey) {
  EXPECT_EQ(parse_error("train:\n  max_steps: 3\n"), "run.yaml: data.path must be set to a JSONL file (got '')");
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps=0"}),
            "--set train.max_steps=0: train.max_steps must be > 0 (got 0)");
  EXPECT_EQ(parse_error(kMinimal, {"train.grad_accum=0"}),
            "--set train.grad_accum=0: train.grad_accum must be >= 1 (got 0)");
  EXPECT_EQ(parse_error(kMinimal, {"optim.lr=0"}), "--set optim.lr=0: optim.lr must be > 0 (got 0.0)");
  EXPECT_EQ(parse_error(kMinimal, {"optim.beta1=1"}), "--set optim.beta1=1: optim.beta1 must be in [0, 1) (got 1.0)");
  EXPECT_EQ(parse_error(kMinimal, {"optim.betas=[0.9, -0.1]"}),
            "--set optim.betas=[0.9, -0.1]: optim.beta2 must be in [0, 1) (got -0.1)");
  EXPECT_EQ(parse_error(kMinimal, {"schedule.min_lr_ratio=1.5"}),
            "--set schedule.min_lr_ratio=1.5: schedule.min_lr_ratio must be in [0, 1] (got 1.5)");
  EXPECT_EQ(parse_error(kMinimal, {"data.max_tokens_per_batch=0"}),
            "--set data.max_tokens_per_batch=0: data.max_tokens_per_batch must be in [1, 2147483647] (got 0)");
  // Model keys name where they were set too, with the model's own rule.
  EXPECT_EQ(parse_error(kMinimal, {"model.num_attention_heads=3", "model.num_key_value_heads=2", "model.head_dim=32"}),
            "--set model.num_key_value_heads=2: model.num_key_value_heads must divide num_attention_heads (3) "
            "(got 2)");
}

// A vision key without a tower (vision.num_hidden_layers 0) would size nothing: an error naming it.
TEST(ConfigTest, VisionKeysWithoutATowerAreErrors) {
  EXPECT_EQ(parse_error(kMinimal, {"vision.hidden_size=32"}),
            "--set vision.hidden_size=32: vision.hidden_size = 32 has no effect: vision.num_hidden_layers is 0 (no "
            "vision tower); set it >= 1 for a VLA, or drop the vision keys");
  EXPECT_EQ(parse_error(std::string(kMinimal) + "vision:\n  freeze: true\n"),
            "run.yaml:4: vision.freeze = true has no effect: vision.num_hidden_layers is 0 (no vision tower); set it "
            ">= 1 for a VLA, or drop the vision keys");
  EXPECT_EQ(parse_error(kMinimal, {"vision.num_hidden_layers=0"}), "");
}

TEST(ConfigTest, RangeAndCrossFieldErrorsNameFileAndLine) {
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  grad_accum: 0\n"),
            "run.yaml:4: train.grad_accum must be >= 1 (got 0)");
  EXPECT_EQ(parse_error("data:\n  path: x\noptim:\n  betas: [1.5, 0.9]\n"),
            "run.yaml:4: optim.beta1 must be in [0, 1) (got 1.5)");
  EXPECT_EQ(parse_error("model:\n  hidden_size: 64\n  num_attention_heads: 0\ndata:\n  path: x\n"),
            "run.yaml:3: model.num_attention_heads must be in [1, 1024] (got 0)");
  // Cross-field: the key the rule is about, where it was set.
  EXPECT_EQ(parse_error("data:\n  path: x\n  max_tokens_per_batch: 64\npartition:\n  capacity_tokens: 128\n"),
            "run.yaml:5: partition.capacity_tokens must be <= data.max_tokens_per_batch (64): a piece must fit a "
            "micro-batch (got 128)");
  EXPECT_EQ(parse_error("data:\n  path: x\n  packing: per_path\n", {"partition.capacity_tokens=8"}),
            "run.yaml:3: data.packing must be tree when partition.capacity_tokens > 0 (8) (got 'per_path')");
}

TEST(ConfigTest, DeeplyNestedYamlNamesTheLimit) {
  std::string text = "data:\n  path: x\nrun_dir:\n";
  for (int i = 0; i < 600; ++i) text += std::string(2 * i + 2, ' ') + "- \n";
  const std::string e = parse_error(text);
  EXPECT_EQ(e.find("bad file"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("run.yaml:", 0), 0u) << e;
  EXPECT_NE(e.find(": invalid YAML: nested deeper than 500 levels"), std::string::npos) << e;
  // Flow style nests the same way.
  const std::string flow = "data:\n  path: x\nrun_dir: " + std::string(600, '[') + std::string(600, ']') + "\n";
  const std::string f = parse_error(flow);
  EXPECT_EQ(f.rfind("run.yaml:3: invalid YAML: nested deeper than 500 levels", 0), 0u) << f;
}

TEST(ConfigTest, ConfigPathThatIsADirectoryIsAnError) {
  const fs::path dir = tmpdir() / "cfg_is_dir";
  fs::create_directories(dir);
  EXPECT_EQ(error_of([&] { load_config(dir.string(), {}); }),
            dir.string() + ": is a directory, expected a YAML config file");
}

// A stream that never ends stops at the size cap instead of filling memory.
TEST(ConfigTest, AnEndlessConfigStopsAtTheSizeCap) {
  EXPECT_EQ(error_of([&] { load_config("/dev/zero", {}); }),
            "/dev/zero: more than 16777216 bytes, too large for a config file");
}

TEST(ConfigTest, HugeSizesAreErrorsNamingTheKey) {
  // Any positive size used to pass, and the parameter count overflowed when the model was built.
  EXPECT_EQ(parse_error(kMinimal, {"model.vocab_size=9223372036854775807"}),
            "--set model.vocab_size=9223372036854775807: model.vocab_size must be in [1, 16777216] (got "
            "9223372036854775807)");
  const std::vector<std::pair<std::string, int64_t>> bounds = {
      {"vocab_size", model::kMaxVocabSize},           {"hidden_size", model::kMaxHiddenSize},
      {"intermediate_size", model::kMaxIntermediateSize}, {"num_hidden_layers", model::kMaxLayers},
      {"num_attention_heads", model::kMaxHeads},      {"num_key_value_heads", model::kMaxHeads},
      {"head_dim", model::kMaxHeadDim},               {"max_position_embeddings", model::kMaxPositions}};
  for (const auto& [key, bound] : bounds) {
    for (int64_t v : {bound + 1, int64_t{0}, int64_t{-1}}) {
      const std::string e = parse_error(kMinimal, {"model." + key + "=" + std::to_string(v)});
      EXPECT_NE(
          e.find(": model." + key + " must be in [1, " + std::to_string(bound) + "] (got " + std::to_string(v) + ")"),
          std::string::npos)
          << e;
    }
  }
  // Each size within its bound, the product over the parameter limit.
  const std::string big = parse_error(kMinimal, {"model.hidden_size=65536", "model.intermediate_size=262144",
                                                 "model.num_hidden_layers=1024", "model.head_dim=64"});
  EXPECT_NE(big.find("parameters, more than the limit of 2^40 (1099511627776)"), std::string::npos) << big;
  // The trainer's sizes.
  EXPECT_EQ(parse_error(kMinimal, {"data.max_tokens_per_batch=2147483648"}),
            "--set data.max_tokens_per_batch=2147483648: data.max_tokens_per_batch must be in [1, 2147483647] (got "
            "2147483648)");
  EXPECT_EQ(parse_error(kMinimal, {"model.num_attention_heads=1024", "model.num_key_value_heads=1", "model.head_dim=64",
                                   "data.max_tokens_per_batch=4194304"}),
            "--set data.max_tokens_per_batch=4194304: data.max_tokens_per_batch must be <= 2097151 with "
            "model.num_attention_heads 1024 (tokens x "
            "heads must stay below 2^31) (got 4194304)");
  EXPECT_EQ(
      parse_error(kMinimal, {"train.grad_accum=9223372036854775807"}),
      "--set train.grad_accum=9223372036854775807: train.grad_accum must be <= 1048576 (got 9223372036854775807)");
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps=9223372036854775807"}),
            "--set train.max_steps=9223372036854775807: train.max_steps must be <= 2^53 (got 9223372036854775807)");
  EXPECT_EQ(parse_error(kMinimal, {"distributed.timeout_s=1e300"}),
            "--set distributed.timeout_s=1e300: distributed.timeout_s must be in (0, 10000000.0] seconds (got 1e+300)");
}

TEST(ConfigTest, ParameterCountIsTheParamTables) {
  for (const bool tied : {false, true}) {
    for (const std::string arch : {"qwen3", "llama"}) {
      model::ModelConfig m;
      m.architecture = arch;
      m.tie_word_embeddings = tied;
      m.vocab_size = 97;
      m.hidden_size = 24;
      m.intermediate_size = 40;
      m.num_hidden_layers = 3;
      m.num_attention_heads = 6;
      m.num_key_value_heads = 2;
      m.head_dim = 10;
      int64_t n = 0;
      for (const model::ParamInfo& p : model::param_table(m)) n += p.numel;
      EXPECT_EQ(m.parameter_count(), n) << arch << (tied ? " tied" : "");
    }
  }
  model::ModelConfig huge;
  huge.vocab_size = huge.hidden_size = huge.intermediate_size = huge.num_hidden_layers = INT64_MAX;
  huge.num_attention_heads = huge.num_key_value_heads = huge.head_dim = INT64_MAX;
  EXPECT_EQ(huge.parameter_count(), INT64_MAX);
}

TEST(ConfigTest, WarmupLongerThanTheRunIsAWarning) {
  // A short run of a config with warmup (e.g. --set train.max_steps=5) still trains: the schedule
  // is defined (the lr rises linearly and never reaches optim.lr), and warnings() says so.
  const RunConfig c = parse_config_text(kMinimal, "run.yaml", {"train.max_steps=10", "schedule.warmup_steps=11"});
  ASSERT_EQ(c.warnings().size(), 1u);
  EXPECT_EQ(c.warnings()[0],
            "--set schedule.warmup_steps=11: schedule.warmup_steps (11) is longer than train.max_steps (10): the "
            "learning rate rises to 10/11 of optim.lr and does not decay");
  EXPECT_TRUE(parse_config_text(kMinimal, "run.yaml", {"train.max_steps=10", "schedule.warmup_steps=10"})
                  .warnings()
                  .empty());
  EXPECT_EQ(parse_error(kMinimal, {"schedule.warmup_steps=-1"}),
            "--set schedule.warmup_steps=-1: schedule.warmup_steps must be >= 0 (got -1)");
}

TEST(ConfigTest, HeadDimDefaultNeedsDivisibleHiddenSize) {
  // hidden_size / num_attention_heads used to round down silently (33 / 2 -> 16).
  EXPECT_EQ(parse_error("model:\n  hidden_size: 33\n  num_attention_heads: 2\ndata:\n  path: x\n"),
            "run.yaml:2: model.hidden_size (33) is not a multiple of model.num_attention_heads (2), so model.head_dim "
            "cannot default to hidden_size / num_attention_heads: set model.head_dim");
  const RunConfig c = parse_config_text(
      "model:\n  hidden_size: 33\n  num_attention_heads: 2\n  head_dim: 16\ndata:\n  path: x\n", "run.yaml", {});
  EXPECT_EQ(c.model.head_dim, 16);
}

TEST(ConfigTest, ASecondYamlDocumentIsAnError) {
  EXPECT_EQ(parse_error("data:\n  path: x\n---\ntrain:\n  max_steps: 3\n"),
            "run.yaml:3: a second YAML document, expected one config per file");
  EXPECT_EQ(parse_error("---\ndata:\n  path: x\n---\ntrain:\n  max_steps: 3\n"),
            "run.yaml:4: a second YAML document, expected one config per file");
  // One document with its own start marker is fine.
  EXPECT_EQ(parse_config_text("---\ndata:\n  path: x\n", "run.yaml", {}).data.path, "x");
  EXPECT_EQ(parse_config_text("data:\n  path: x\n...\n", "run.yaml", {}).data.path, "x");
}

// Text after a flow collection: yaml-cpp's LoadAll never returns on it (the config fuzzer's
// find), YAML::Load drops it; an error names where it starts.
TEST(ConfigTest, TextAfterTheDocumentIsAnErrorNotAHang) {
  EXPECT_EQ(parse_error("{data: {path: d.jsonl}, train.max_steps: 0}, model}\n"),
            "run.yaml:1:44: invalid YAML: ',' after the end of the document, expected one config per file");
  EXPECT_EQ(parse_error("[a], b]"), "run.yaml:1:4: invalid YAML: ',' after the end of the document, expected one config "
                                    "per file");
  EXPECT_EQ(parse_error(kMinimal, {"train.max_steps=[1], 2"}),
            "--set train.max_steps=[1], 2: value is not valid YAML: ',' at column 4 after the end of the value");
  EXPECT_EQ(parse_error(""), "run.yaml: data.path must be set to a JSONL file (got '')");
}

// A quote not closed on its line: YAML folds the string over the lines after it (to the end of
// the file when it is never closed), which would swallow the rest of the config silently.
TEST(ConfigTest, AnUnclosedQuoteIsAnErrorNotTheRestOfTheFile) {
  EXPECT_EQ(parse_error("data:\n  path: x\nrun_dir: \"rq\ntrain:\n  max_steps: 2\n"),
            "run.yaml:3:10: a quoted string that is not closed on its line (a missing closing quote?): a config value "
            "is one line");
  EXPECT_EQ(parse_error("data:\n  path: 'x\ntrain:\n  max_steps: 2'\n"),
            "run.yaml:2:9: a quoted string that is not closed on its line (a missing closing quote?): a config value "
            "is one line");
  // Quotes closed on their line, escapes and doubled single quotes included, are fine.
  const RunConfig c =
      parse_config_text("data:\n  path: \"a \\\" b\"  # c\"\nrun_dir: 'it''s'\ntrain:\n  max_steps: 2\n", "run.yaml", {});
  EXPECT_EQ(c.data.path, "a \" b");
  EXPECT_EQ(c.run_dir, "it's");
  EXPECT_EQ(c.train.max_steps, 2);
}

// A segments key set while segments are off (length 0) is ignored: the config reads (a checkpoint's
// config.yaml, `sample --set segments.length=0`, a sweep turning segments off keep their other
// keys), and ignored_key names it for the trainer's warning at start.
TEST(ConfigTest, SegmentKeysWithoutSegmentsAreNamedAsIgnored) {
  const RunConfig c = parse_config_text("data:\n  path: x\nsegments:\n  tail: 4\n", "run.yaml", {});
  EXPECT_EQ(c.segments.ignored_key(), "segments.tail");
  EXPECT_EQ(c.where("segments.tail"), "run.yaml:4");
  EXPECT_EQ(parse_config_text("data:\n  path: x\nsegments:\n  length: 0\n  tbptt: 2\n", "run.yaml", {})
                .segments.ignored_key(),
            "segments.tbptt");
  EXPECT_EQ(parse_config_text("data:\n  path: x\n", "run.yaml", {}).segments.ignored_key(), "");
  EXPECT_EQ(parse_config_text("data:\n  path: x\nsegments:\n  length: 8\n  tail: 4\n", "run.yaml", {})
                .segments.ignored_key(),
            "");
}

// A byte order mark does not shift where a quote is looked for (the sweep reader keeps it).
TEST(ConfigTest, QuotesAfterAByteOrderMarkAreFine) {
  EXPECT_EQ(load_one_document("\xEF\xBB\xBFx: ['a', \"b\"]\n", "sweep.yaml")["x"][1].as<std::string>(), "b");
}

// A long wrong value is quoted by its first 64 characters and its length.
TEST(ConfigTest, ALongWrongValueIsQuotedByItsStart) {
  const std::string v(5000, 'x');
  EXPECT_EQ(parse_error("data:\n  path: x\ntrain:\n  max_steps: " + v + "\n"),
            "run.yaml:4: train.max_steps: expected an integer, got '" + v.substr(0, 64) + "...' (5000 characters)");
}

TEST(ConfigTest, AUtf8ByteOrderMarkIsAccepted) {
  const std::string bom = "\xEF\xBB\xBF";
  const RunConfig c = parse_config_text(bom + "data:\n  path: x\ntrain:\n  max_steps: 3\n", "run.yaml", {});
  EXPECT_EQ(c.data.path, "x");
  EXPECT_EQ(c.train.max_steps, 3);
  // Lines still count from the first.
  EXPECT_EQ(parse_error(bom + "data:\n  path: x\ntrain:\n  max_steps: 0\n"),
            "run.yaml:4: train.max_steps must be > 0 (got 0)");
}

TEST(ConfigTest, PartitionKeys) {
  EXPECT_EQ(parse_config_text(kMinimal, "run.yaml", {}).partition.capacity_tokens, 0);  // off by default
  const RunConfig c = parse_config_text(
      "data:\n  path: x\n  max_tokens_per_batch: 4096\npartition:\n  capacity_tokens: 2048\n", "run.yaml", {});
  EXPECT_EQ(c.partition.capacity_tokens, 2048);
  EXPECT_EQ(parse_config_text(kMinimal, "run.yaml", {"partition.capacity_tokens=4096"}).partition.capacity_tokens,
            4096);  // == the default data.max_tokens_per_batch

  EXPECT_EQ(parse_error("data:\n  path: x\npartition:\n  capacity: 8\n"),
            "run.yaml:4: unknown key 'partition.capacity' (expected one of: capacity_tokens, recompute)");
  EXPECT_EQ(parse_error("data:\n  path: x\npartition:\n  capacity_tokens: lots\n"),
            "run.yaml:4: partition.capacity_tokens: expected an integer, got 'lots'");
  EXPECT_EQ(parse_error(kMinimal, {"partition.capacity=8"}),
            "--set partition.capacity=8: unknown key 'partition.capacity' (expected one of: capacity_tokens, recompute)");
  EXPECT_EQ(parse_error(kMinimal, {"partition.capacity_tokens=-1"}),
            "--set partition.capacity_tokens=-1: partition.capacity_tokens must be >= 0 (0: off) (got -1)");
  EXPECT_EQ(parse_error(kMinimal, {"partition.capacity_tokens=64", "data.packing=per_path"}),
            "--set data.packing=per_path: data.packing must be tree when partition.capacity_tokens > 0 (64) (got "
            "'per_path')");
  EXPECT_EQ(parse_error(kMinimal, {"partition.capacity_tokens=4097"}),
            "--set partition.capacity_tokens=4097: partition.capacity_tokens must be <= data.max_tokens_per_batch "
            "(4096): a piece must fit a "
            "micro-batch (got 4097)");
  // Off: per_path packing and any budget are fine.
  EXPECT_EQ(parse_error(kMinimal, {"partition.capacity_tokens=0", "data.packing=per_path"}), "");

  // recompute: off by default; on only with partitioning.
  EXPECT_FALSE(c.partition.recompute);
  EXPECT_TRUE(parse_config_text("data:\n  path: x\npartition:\n  capacity_tokens: 64\n  recompute: true\n", "run.yaml",
                                {})
                  .partition.recompute);
  EXPECT_EQ(parse_error("data:\n  path: x\npartition:\n  recompute: true\n"),
            "run.yaml:4: partition.recompute must be false while partition.capacity_tokens is 0 (partitioning is "
            "off: no piece to recompute) (got true)");
  // An empty value is named at its key's line (yaml-cpp marks it at the next token).
  EXPECT_EQ(parse_error("data:\n  path: x\npartition:\n  capacity_tokens: 8\n  recompute:\n\ntrain:\n  max_steps: 2\n"),
            "run.yaml:5: partition.recompute: expected a boolean (true|false), got null");
  EXPECT_EQ(parse_error("data:\n  path: x\n  shuffle:\ntrain:\n  max_steps: 2\n"),
            "run.yaml:3: data.shuffle: expected a boolean (true|false), got null");
  EXPECT_EQ(parse_error(kMinimal, {"partition.recompute=yes"}),
            "--set partition.recompute=yes: partition.recompute: expected a boolean (true|false), got 'yes'");
}

// segments: flat keys and the long_range subsection, in the file and through --set; the errors
// of the section name the key and where it was set; the resolved config writes it back nested.
TEST(ConfigTest, SegmentKeys) {
  const RunConfig off = parse_config_text(kMinimal, "run.yaml", {});
  EXPECT_FALSE(off.segments.enabled());
  const std::string text =
      "data:\n  path: x\nmodel:\n  num_attention_heads: 4\n  num_key_value_heads: 2\n  hidden_size: 64\n"
      "segments:\n  length: 64\n  tail: 16\n  tbptt: 2\n  long_range:\n    layers: [1, 0]\n    heads: [1]\n"
      "    retrieve: 32\n";
  const RunConfig c = parse_config_text(text, "run.yaml", {});
  EXPECT_EQ(c.segments.length, 64);
  EXPECT_EQ(c.segments.tail, 16);
  EXPECT_EQ(c.segments.tbptt, 2);
  EXPECT_EQ(c.segments.long_range.layers, (std::vector<int>{1, 0}));
  EXPECT_EQ(c.segments.long_range.heads, (std::vector<int>{1}));
  EXPECT_EQ(c.segments.long_range.retrieve, 32);
  EXPECT_NE(c.to_yaml().find("segments:\n  length: 64\n  tail: 16\n  tbptt: 2\n  long_range:\n    layers: [1, 0]\n"
                             "    heads: [1]\n    retrieve: 32\n"),
            std::string::npos)
      << c.to_yaml();
  const RunConfig back = parse_config_text(c.to_yaml(), "resolved.yaml", {});
  EXPECT_EQ(back.to_yaml(), c.to_yaml());
  const RunConfig set = parse_config_text(text, "run.yaml", {"segments.long_range.heads=[0, 1]", "segments.tail=0"});
  EXPECT_EQ(set.segments.long_range.heads, (std::vector<int>{0, 1}));
  EXPECT_EQ(set.segments.tail, 0);

  EXPECT_EQ(parse_error(text + "    window: 3\n"),
            "run.yaml:15: unknown key 'segments.long_range.window' (expected one of: layers, heads, retrieve)");
  EXPECT_EQ(parse_error(text, {"segments.long_range.layers=[1, x]"}),
            "--set segments.long_range.layers=[1, x]: segments.long_range.layers[1]: expected an integer, got 'x'");
  EXPECT_EQ(parse_error(text, {"segments.tail=65"}),
            "--set segments.tail=65: segments.tail: 65, expected 0 <= tail <= segments.length (64): the tail is the "
            "previous segment's last rows");
  EXPECT_EQ(parse_error(text, {"segments.long_range.heads=[2]"}),
            "--set segments.long_range.heads=[2]: segments.long_range.heads: KV head 2, expected an index in [0, 2) "
            "(num_key_value_heads)");
  // Layers that read nothing: no long-range heads, or no pairs retrieved.
  EXPECT_EQ(parse_error(text, {"segments.long_range.heads=[]", "segments.long_range.retrieve=0"}),
            "run.yaml:12: segments.long_range.layers: 2 layers listed, but long_range.heads is empty (no head reads "
            "retrieved pairs); expected long_range.heads and retrieve > 0 with them, or layers: []");
  EXPECT_EQ(parse_error(text, {"segments.long_range.retrieve=0"}),
            "run.yaml:12: segments.long_range.layers: 2 layers listed, but long_range.retrieve is 0 (no pairs are "
            "retrieved); expected long_range.heads and retrieve > 0 with them, or layers: []");
  EXPECT_EQ(parse_error(text, {"device=cuda"}), "");  // segments train on both backends
  EXPECT_EQ(parse_error(text, {"partition.capacity_tokens=64"}),
            "--set partition.capacity_tokens=64: partition.capacity_tokens must be 0 with segments (segment pieces "
            "already bound a micro-batch: segments.length 64) (got 64)");
}

void expect_same(const RunConfig& a, const RunConfig& b) {
  EXPECT_EQ(a.to_yaml(), b.to_yaml());
  EXPECT_EQ(a.model.to_hf_json(), b.model.to_hf_json());
  EXPECT_EQ(a.run_dir, b.run_dir);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.init_from, b.init_from);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.beta2, b.optim.beta2);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.grad_clip, b.train.grad_clip);
  EXPECT_EQ(a.schedule.min_lr_ratio, b.schedule.min_lr_ratio);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.partition.capacity_tokens, b.partition.capacity_tokens);
  EXPECT_EQ(a.train.gemm_autotune, b.train.gemm_autotune);
  EXPECT_EQ(a.train.gdn_products, b.train.gdn_products);
}

TEST(ConfigTest, ToYamlRoundTrip) {
  const RunConfig a = parse_config_text(kMinimal, "run.yaml",
                                        {"optim.lr=0.1", "optim.eps=1e-12", "model.rms_norm_eps=1e-5",
                                         "schedule.min_lr_ratio=0.3333333333333333", "train.seed=18446744073709551615",
                                         "run_dir='runs/with: colon'", "data.path=null", "data.path='true'",
                                         "train.grad_clip=0", "model.rope_theta=1000000",
                                         "partition.capacity_tokens=1024", "train.gemm_autotune=true",
                                         "train.gdn_products=bf16"});
  EXPECT_EQ(fs::path(a.data.path), fs::current_path() / "true");  // a string (a path, from --set: absolute)
  EXPECT_TRUE(a.train.gemm_autotune);
  EXPECT_EQ(a.train.gdn_products, "bf16");
  EXPECT_EQ(parse_config_text(kMinimal, "run.yaml", {}).train.gdn_products, "exact");  // the default
  EXPECT_NE(a.to_yaml().find("partition:\n  capacity_tokens: 1024\n"), std::string::npos) << a.to_yaml();
  const RunConfig b = parse_config_text(a.to_yaml(), "resolved.yaml", {});
  expect_same(a, b);
}

// model.layer_types: a list of strings, one entry per layer; the model says what an entry may be.
TEST(ConfigTest, LayerTypes) {
  // Every layer full_attention is the default, spelt [] (as from_hf_json returns it), however written:
  // a run resumed under the other spelling compares equal.
  const RunConfig a = parse_config_text(
      "data:\n  path: d.jsonl\nmodel:\n  num_hidden_layers: 2\n  layer_types: [full_attention, full_attention]\n",
      "run.yaml", {});
  EXPECT_TRUE(a.model.layer_types.empty());
  EXPECT_EQ(a.model.to_hf_json(), parse_config_text(kMinimal, "run.yaml", {}).model.to_hf_json());
  EXPECT_NE(a.to_yaml().find("  layer_types: []\n"), std::string::npos) << a.to_yaml();
  expect_same(a, parse_config_text(a.to_yaml(), "resolved.yaml", {}));
  EXPECT_TRUE(parse_config_text(kMinimal, "run.yaml", {"model.layer_types=[full_attention, full_attention]"})
                  .model.layer_types.empty());
  EXPECT_TRUE(parse_config_text(kMinimal, "run.yaml", {"model.layer_types=[]"}).model.layer_types.empty());
  EXPECT_TRUE(parse_config_text(kMinimal, "run.yaml", {"model.layer_types=null"}).model.layer_types.empty());
  // Errors name where the value was written and what was expected.
  EXPECT_EQ(parse_error("data:\n  path: d.jsonl\nmodel:\n  layer_types: full_attention\n"),
            "run.yaml:4: model.layer_types: expected a list of strings, got 'full_attention'");
  EXPECT_EQ(parse_error("data:\n  path: d.jsonl\nmodel:\n  layer_types: [full_attention, {a: 1}]\n"),
            "run.yaml:4: model.layer_types[1]: expected a string, got a mapping");
  EXPECT_EQ(parse_error(kMinimal, {"model.layer_types=[full_attention]"}),
            "--set model.layer_types=[full_attention]: model.layer_types has 1 entries, expected one per layer "
            "(num_hidden_layers = 2)");
  const std::string e = parse_error(kMinimal, {"model.layer_types=[full_attention, mamba]"});
  EXPECT_EQ(e.rfind("--set model.layer_types=[full_attention, mamba]: model.layer_types entry 1 is \"mamba\"", 0), 0u)
      << e;
  // A linear_attention (Gated DeltaNet) layer needs its sizes: the first missing one is named.
  const std::string l = parse_error(kMinimal, {"model.architecture=qwen3_5_text", "model.head_dim=8",
                                               "model.layer_types=[full_attention, linear_attention]"});
  EXPECT_NE(l.find("model.linear_num_key_heads must be in [1, 1024] (got 0) (a linear_attention layer needs it)"),
            std::string::npos)
      << l;
  RunConfig ok = parse_config_text(kMinimal, "run.yaml",
                                   {"model.architecture=qwen3_5_text", "model.head_dim=8",
                                    "model.layer_types=[full_attention, linear_attention]", "model.linear_num_key_heads=1",
                                    "model.linear_num_value_heads=2", "model.linear_key_head_dim=8",
                                    "model.linear_value_head_dim=8", "model.linear_conv_kernel_dim=4"});
  EXPECT_EQ(ok.model.linear_num_value_heads, 2);
  EXPECT_NE(ok.to_yaml().find("linear_conv_kernel_dim: 4"), std::string::npos) << ok.to_yaml();
  // Hybrids partition: the gateways carry the recurrent state and conv tail.
  const RunConfig part = parse_config_text(
      kMinimal, "run.yaml",
      {"model.architecture=qwen3_5_text", "model.head_dim=8", "model.layer_types=[full_attention, linear_attention]",
       "model.linear_num_key_heads=1", "model.linear_num_value_heads=2", "model.linear_key_head_dim=8",
       "model.linear_value_head_dim=8", "model.linear_conv_kernel_dim=4", "partition.capacity_tokens=64"});
  EXPECT_EQ(part.partition.capacity_tokens, 64);
}

TEST(ConfigTest, RelativePathsResolveAgainstTheConfigFolder) {
  const fs::path dir = tmpdir() / "cfg_paths";
  fs::create_directories(dir / "sub");
  {
    std::ofstream(dir / "sub" / "run.yaml") << "run_dir: runs/x\ndata:\n  path: ../d.jsonl\n";
  }
  const RunConfig c = load_config((dir / "sub" / "run.yaml").string(), {});
  EXPECT_EQ(fs::path(c.data.path), (fs::absolute(dir) / "d.jsonl").lexically_normal());
  EXPECT_EQ(c.run_dir, "runs/x");  // relative to the working directory, kept as written
  // From --set: relative to the working directory, made absolute, so a config.yaml written from it
  // (a checkpoint's, a sweep's run) still names that file when read from its own folder.
  const RunConfig d = load_config((dir / "sub" / "run.yaml").string(), {"data.path=e.jsonl"});
  EXPECT_EQ(fs::path(d.data.path), (fs::current_path() / "e.jsonl").lexically_normal());
  {
    std::ofstream(dir / "sub" / "saved.yaml") << d.to_yaml();
  }
  EXPECT_EQ(load_config((dir / "sub" / "saved.yaml").string(), {}).data.path, d.data.path);
  // A resolved config loads back to the same config.
  expect_same(c, parse_config_text(c.to_yaml(), "resolved.yaml", {}));
}

TEST(ConfigTest, MissingFileIsAnError) {
  const std::string e = error_of([] { load_config("/nonexistent/run.yaml", {}); });
  EXPECT_EQ(e, "/nonexistent/run.yaml: cannot open config file");
}

TEST(ConfigTest, InitFromReadsModelAndChecksAgreement) {
  const fs::path dir = tmpdir() / "cfg_init_from";
  fs::create_directories(dir / "hf");
  model::ModelConfig m;
  m.hidden_size = 64;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 32;
  m.intermediate_size = 96;
  { std::ofstream(dir / "hf" / "config.json") << m.to_hf_json().dump(2); }
  {
    std::ofstream(dir / "run.yaml") << "data:\n  path: d.jsonl\nmodel:\n  init_from: hf\n  hidden_size: 64\n";
  }
  const RunConfig c = load_config((dir / "run.yaml").string(), {});
  EXPECT_EQ(c.model.hidden_size, 64);
  EXPECT_EQ(c.model.intermediate_size, 96);
  EXPECT_EQ(c.model.num_attention_heads, 2);
  EXPECT_EQ(fs::path(c.init_from), (fs::absolute(dir) / "hf").lexically_normal());
  expect_same(c, parse_config_text(c.to_yaml(), "resolved.yaml", {}));

  const std::string e = error_of([&] { load_config((dir / "run.yaml").string(), {"model.vocab_size=100"}); });
  EXPECT_EQ(e.rfind("--set model.vocab_size=100: model.vocab_size = 100 does not match 256 in ", 0), 0u) << e;
  // layer_types written out in full agrees with a config.json that leaves it to the default.
  EXPECT_EQ(load_config((dir / "run.yaml").string(), {"model.layer_types=[full_attention, full_attention]"})
                .model.layer_types.size(),
            0u);
  const std::string lt = error_of([&] { load_config((dir / "run.yaml").string(), {"model.layer_types=[x]"}); });
  EXPECT_EQ(lt.rfind("--set model.layer_types=[x]: model.layer_types = [\"x\"] does not match "
                     "[\"full_attention\", \"full_attention\"] in ",
                     0),
            0u)
      << lt;
}

// vision.freeze and vision.vision_feature_layer are choices of the run, not of the weights: written
// over model.init_from they override its config.json (the tower's other keys must still agree),
// and the override is range-checked against the checkpoint's tower, naming the run's line.
TEST(ConfigTest, InitFromTakesTheRunsVisionFeatureLayer) {
  const fs::path dir = tmpdir() / "cfg_init_from_vision";
  fs::create_directories(dir / "hf");
  model::ModelConfig m = load_config("configs/vla_tiny.yaml", {}).model;
  m.vision.vision_feature_layer = -2;  // LLaVA-1.5's, as the checkpoint says
  { std::ofstream(dir / "hf" / "config.json") << m.to_hf_json().dump(2); }
  const std::string run = (dir / "run.yaml").string();
  { std::ofstream(run) << "data:\n  path: d.jsonl\nmodel:\n  init_from: hf\n"; }
  EXPECT_EQ(load_config(run, {}).model.vision.vision_feature_layer, -2);
  EXPECT_EQ(load_config(run, {}).model.vision.hidden_size, 32);
  {
    std::ofstream(run) << "data:\n  path: d.jsonl\nmodel:\n  init_from: hf\nvision:\n  vision_feature_layer: -1\n"
                          "  freeze: true\n";
  }
  const RunConfig c = load_config(run, {});
  EXPECT_EQ(c.model.vision.vision_feature_layer, -1);
  EXPECT_TRUE(c.model.vision.freeze);
  EXPECT_EQ(c.model.vision.hidden_size, 32);  // the rest from config.json
  EXPECT_EQ(c.where("vision.vision_feature_layer"), run + ":6");
  EXPECT_EQ(load_config(run, {"vision.vision_feature_layer=0"}).model.vision.vision_feature_layer, 0);
  // Out of the checkpoint's tower (2 layers: -3 .. 2): the run's key is named.
  const std::string range = error_of([&] { load_config(run, {"vision.vision_feature_layer=3"}); });
  EXPECT_NE(range.find("--set vision.vision_feature_layer=3"), std::string::npos) << range;
  EXPECT_NE(range.find("vision_feature_layer"), std::string::npos) << range;
  // The tower's shape still has to agree.
  const std::string shape = error_of([&] { load_config(run, {"vision.hidden_size=48"}); });
  EXPECT_EQ(shape.rfind("--set vision.hidden_size=48: vision.hidden_size = 48 does not match 32 in ", 0), 0u) << shape;
}

// num_experts (transformers' key) is taken as written in HF configs when 0; a mixture of experts is
// an error naming the line and the key, not a silently dense model.
TEST(ConfigTest, NumExpertsZeroOnly) {
  EXPECT_EQ(parse_config_text("data:\n  path: d.jsonl\nmodel:\n  architecture: qwen3_next\n  num_experts: 0\n",
                              "run.yaml", {})
                .num_experts,
            0);
  EXPECT_EQ(parse_error("data:\n  path: d.jsonl\nmodel:\n  architecture: qwen3_next\n  num_experts: 512\n"),
            "run.yaml:5: model.num_experts must be 0 (dense MLPs: mixture-of-experts layers are not supported) "
            "(got 512)");
  EXPECT_EQ(parse_error(kMinimal, {"model.num_experts=-1"}),
            "--set model.num_experts=-1: model.num_experts must be 0 (dense MLPs: mixture-of-experts layers are not "
            "supported) (got -1)");
}

// The shipped ~2B hybrid (configs/qwen3_next_2b.yaml) is the model bench/train_bench --model
// hybrid_2b trains (its config.json, every field, the same), with Qwen3-Next's attention head dim.
TEST(ConfigTest, TheShippedQwen3Next2bIsTheBenchmarkedHybrid) {
  const RunConfig c = load_config("configs/qwen3_next_2b.yaml", {});
  const model::ModelConfig bench = bench::hybrid_2b();
  EXPECT_EQ(c.model.to_hf_json().dump(1), bench.to_hf_json().dump(1));
  EXPECT_EQ(c.model.head_dim, 256);
  EXPECT_EQ(c.model.layer_types.size(), 24u);
}

}  // namespace
}  // namespace tt::trainer
