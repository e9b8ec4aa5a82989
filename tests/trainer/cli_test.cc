// The treetrain binary: usage errors exit 2 with the usage, tt::Error exits 1 with "error: ...",
// stats prints one JSON object, generate + train run end to end.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/trainer/test_util.h"

namespace {

namespace fs = std::filesystem;

struct Result {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

fs::path tmp(const std::string& name) { return tt::trainer::testing::fresh_dir(name); }

using tt::trainer::testing::slurp;

// Runs the binary (from the test's runfiles) with args, capturing stdout and stderr; `env` goes
// before it (e.g. "env -u OMP_NUM_THREADS").
Result treetrain(const std::string& args, const std::string& env = "") {
  static int n = 0;
  const fs::path dir = tmp("cli_out_" + std::to_string(n++));
  const std::string cmd =
      env + " trainer/treetrain " + args + " >" + (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  return r;
}

TEST(CliTest, HelpPrintsUsage) {
  const Result r = treetrain("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage:"), std::string::npos);
}

TEST(CliTest, UsageErrorsExitTwo) {
  for (const std::string args : {"", "frobnicate", "--config", "train --config x.yaml --bogus 1",
                                 "stats --data x.jsonl", "generate --kind trees --out x", "bench",
                                 "bench matmul", "bench attention --data x.jsonl",
                                 "bench attention --data x.jsonl --format tree --heads",
                                 "bench attention --data x.jsonl --format tree --impl wgmma"}) {
    const Result r = treetrain(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_NE(r.err.find("usage:"), std::string::npos) << args;
  }
  EXPECT_NE(treetrain("frobnicate").err.find("unknown command 'frobnicate'"), std::string::npos);
  EXPECT_NE(treetrain("--config x --bogus 1").err.find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(treetrain("bench matmul").err.find("expected 'bench attention'"), std::string::npos);
  // An empty value is no file name.
  for (const std::string args : {"generate --kind rollouts --out ''", "sample --checkpoint x --prompts y --out ''"}) {
    const Result empty = treetrain(args);
    EXPECT_EQ(empty.code, 2) << args;
    EXPECT_EQ(empty.err.rfind("error: --out: expected a value, got an empty string\n", 0), 0u) << empty.err;
  }
  // The synthetic combs were --kind episodes; that name now means the robot-episode data format.
  EXPECT_NE(treetrain("generate --kind episodes --out x")
                .err.find("error: --kind: 'episodes' names the robot-episode data format, not a synthetic kind; "
                          "the synthetic navigation combs are --kind comb"),
            std::string::npos);
  // One attention kernel set: --impl is no flag of bench attention.
  EXPECT_NE(treetrain("bench attention --data x.jsonl --format tree --impl wgmma")
                .err.find("unknown flag --impl for 'bench attention'"),
            std::string::npos);
}

TEST(CliTest, ErrorsExitOne) {
  const Result r = treetrain("--config /nonexistent/run.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: /nonexistent/run.yaml: cannot open config file\n");
  // An --out whose folder cannot be made names --out, for every kind of data generate writes.
  const fs::path dir = tmp("cli_out_under_a_file");
  { std::ofstream(dir / "afile") << "x"; }
  for (const std::string kind : {"rollouts", "toy-episodes"}) {
    const std::string out = (dir / "afile" / "y.jsonl").string();
    const Result g = treetrain("generate --kind " + kind + " --out " + out);
    EXPECT_EQ(g.code, 1) << kind;
    EXPECT_EQ(g.err.rfind("error: --out " + out + ": cannot create its folder " + (dir / "afile").string() + ": ", 0),
              0u)
        << kind << ": " << g.err;
  }
  // stats names every format it reads.
  const Result st = treetrain("stats --data x.jsonl --format csv");
  EXPECT_EQ(st.code, 2);
  EXPECT_EQ(st.err.rfind("error: --format: expected rollouts, tree, tokens or episodes, got 'csv'", 0), 0u) << st.err;
}

// The values libgomp reports for `name` (OMP_DISPLAY_ENV=verbose), one per process that loaded it,
// in order: the first process, then the re-executed one.
std::vector<std::string> omp_display(const std::string& err, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(err);
  for (std::string l; std::getline(in, l);) {
    const std::string key = "  " + name + " = '";
    if (l.rfind(key, 0) == 0) out.push_back(l.substr(key.size(), l.size() - key.size() - 1));
  }
  return out;
}

int cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

TEST(CliTest, OpenMpWaitsPassivelyUnlessTheUserSaysOtherwise) {
#if defined(__clang__)
  // clang's -fopenmp links LLVM's libomp (the sanitizer build), which reports OMP_DISPLAY_ENV at
  // its first parallel region, not when loaded; the product's gcc build links libgomp.
  GTEST_SKIP() << "libgomp's load-time report is what this test reads; clang builds link libomp";
#endif
  // libgomp reads OMP_* when it is loaded, before main: the binary re-executes itself once with
  // OMP_WAIT_POLICY=passive, and libgomp's own report (GOMP_SPINCOUNT 0: no spinning) shows it.
  const std::string clean =
      "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS -u LOCAL_WORLD_SIZE -u TREETRAIN_OMP_DEFAULTS "
      "OMP_DISPLAY_ENV=verbose";
  Result r = treetrain("--help", clean);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> spin = omp_display(r.err, "GOMP_SPINCOUNT");
  ASSERT_EQ(spin.size(), 2u) << r.err;  // the first process and the re-executed one
  EXPECT_NE(spin[0], "0");
  EXPECT_EQ(spin[1], "0");
  EXPECT_NE(r.out.find("usage:"), std::string::npos);
  // A user's explicit choice is kept, without a re-exec.
  for (const std::string user : {"OMP_WAIT_POLICY=active", "GOMP_SPINCOUNT=1000"}) {
    r = treetrain("--help", clean + " " + user);
    ASSERT_EQ(r.code, 0) << r.err;
    spin = omp_display(r.err, "GOMP_SPINCOUNT");
    ASSERT_EQ(spin.size(), 1u) << user << ": " << r.err;
    EXPECT_NE(spin[0], "0") << user;
  }
  // A rank of a launcher that does not set the threads (torchrun): the host's CPUs divided by the
  // local ranks; the user's OMP_NUM_THREADS is kept.
  r = treetrain("--help", clean + " LOCAL_WORLD_SIZE=2");
  std::vector<std::string> threads = omp_display(r.err, "OMP_NUM_THREADS");
  ASSERT_EQ(threads.size(), 2u) << r.err;
  EXPECT_EQ(threads[1], std::to_string(std::max(1, cpus() / 2)));
  r = treetrain("--help", clean + " LOCAL_WORLD_SIZE=2 OMP_NUM_THREADS=3");
  threads = omp_display(r.err, "OMP_NUM_THREADS");
  ASSERT_EQ(threads.size(), 2u) << r.err;
  EXPECT_EQ(threads[1], "3");
}

TEST(CliTest, AnErrorIsOneLine) {
  // A newline inside the message (here from the path) is written escaped: the error stays one line.
  const Result r = treetrain("--config \"$(printf '/nonexistent/a\\nb.yaml')\"");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: /nonexistent/a\\nb.yaml: cannot open config file\n");
}

TEST(CliTest, BadRunDirNamesTheKeyAndPath) {
  const fs::path dir = tmp("cli_bad_run_dir");
  { std::ofstream(dir / "a_file") << "x"; }
  {
    std::ofstream(dir / "run.yaml") << "run_dir: " << (dir / "a_file" / "run").string() << "\ndata:\n  path: d.jsonl\n";
  }
  const Result r = treetrain("--config " + (dir / "run.yaml").string() + " --set device=cpu");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: " + (dir / "run.yaml").string() + ":1: run_dir '" + (dir / "a_file" / "run").string() +
                       "': cannot create the folder: Not a directory\n");
}

TEST(CliTest, GenerateStatsAndTrain) {
  const fs::path dir = tmp("cli_run");
  const std::string data = (dir / "data.jsonl").string();
  Result r = treetrain("generate --kind rollouts --out " + data +
                       " --num-trees 6 --vocab-size 32 --seed 2 --prompt-len 4 --turns 2 --turn-len 3");
  ASSERT_EQ(r.code, 0) << r.err;

  r = treetrain("stats --data " + data + " --format rollouts --vocab-size 32");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // exactly one JSON object on stdout
  EXPECT_EQ(j.at("trees").get<int>(), 6);
  EXPECT_GT(j.at("por").get<double>(), 0.0);

  {
    std::ofstream(dir / "run.yaml") << "run_dir: " << (dir / "run").string()
                                    << "\nmodel:\n  vocab_size: 32\n  hidden_size: 16\n  intermediate_size: 32\n"
                                       "  num_hidden_layers: 1\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"
                                       "data:\n  path: data.jsonl\n  max_tokens_per_batch: 64\n";
  }
  r = treetrain("train --config " + (dir / "run.yaml").string() + " --set train.max_steps=3 --set device=cpu");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "run" / "checkpoints" / "step_3"));
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  int lines = 0;
  for (std::string l; std::getline(metrics, l);) {
    const nlohmann::json m = nlohmann::json::parse(l);
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "n_tree", "n_flat", "por", "paths",
                          "pieces", "elapsed_s", "step_s", "model_tflops", "mfu"})
      EXPECT_TRUE(m.contains(k)) << k;
    ++lines;
  }
  EXPECT_EQ(lines, 3);

  // sample from the run_dir: a newer step folder that is not a valid checkpoint (a half-written
  // save) is skipped, and said.
  const fs::path ckpts = dir / "run" / "checkpoints";
  fs::create_directories(ckpts / "step_5");
  const std::string prompts = (dir / "prompts.jsonl").string();
  std::ofstream(prompts) << "{\"id\": \"a\", \"tokens\": [1, 2]}\n";
  const std::string sample = "sample --checkpoint " + (dir / "run").string() + " --max-new-tokens 2 --device cpu";
  r = treetrain(sample + " --prompts " + prompts);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("--checkpoint " + (dir / "run").string() + ": skipping " + (ckpts / "step_5").string() +
                       ", newer than " + (ckpts / "step_3").string() + " but not a valid checkpoint: "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("id"), "a");
  // --out naming the prompts file: an error, and the prompts stay.
  r = treetrain(sample + " --prompts " + prompts + " --out " + prompts);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("\nerror: --out " + prompts + ": the --prompts file itself; the completions would replace "
                       "the prompts (write them to another file)\n"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(prompts), "{\"id\": \"a\", \"tokens\": [1, 2]}\n");
  // A key named twice in a prompt: an error naming the line, not the last value silently.
  std::ofstream(prompts) << "{\"tokens\": [1, 2], \"tokens\": [3]}\n";
  r = treetrain(sample + " --prompts " + prompts);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("\nerror: " + prompts + ":1: invalid JSON: duplicate key \"tokens\""), std::string::npos) << r.err;

  // A non-finite update exits with code 3 and writes no checkpoint.
  r = treetrain("train --config " + (dir / "run.yaml").string() + " --set run_dir=" + (dir / "nan").string() +
                " --set train.max_steps=3 --set device=cpu --set optim.lr=1e39");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("error: step 1: the update (lr "), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "nan" / "checkpoints" / "step_1"));

  r = treetrain("--config " + (dir / "run.yaml").string() + " --set train.foo=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("error: --set train.foo=1: unknown key 'train.foo'", 0), 0u) << r.err;
  r = treetrain("--config " + (dir / "run.yaml").string() + " --set device=cuda");
  EXPECT_EQ(r.code, 1);
  // Without a GPU: no device; with one: this model's head dim is one the CUDA attention lacks.
  EXPECT_TRUE(r.err.find("error: device: cuda but no CUDA device is visible (cudaGetDeviceCount: ") != std::string::npos ||
              r.err.find("error: model.head_dim 8 is not supported on cuda") != std::string::npos)
      << r.err;
}

// The shipped hybrid config trains on the CPU (device auto) and writes a transformers checkpoint.
TEST(CliTest, TheShippedQwen35ConfigTrains) {
  const fs::path dir = tmp("cli_qwen35");
  const std::string data = (dir / "data.jsonl").string();
  Result r = treetrain("generate --kind rollouts --out " + data + " --num-trees 4 --vocab-size 256 --seed 3");
  ASSERT_EQ(r.code, 0) << r.err;
  r = treetrain("train --config configs/qwen3_5_tiny.yaml --set run_dir=" + (dir / "run").string() +
                " --set data.path=" + data + " --set train.max_steps=2 --set train.checkpoint_every=0");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream cfg(dir / "run" / "checkpoints" / "step_2" / "config.json");
  const nlohmann::json j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j.at("architectures")[0], "Qwen3_5ForCausalLM");
  EXPECT_EQ(j.at("layer_types").size(), 4u);
  EXPECT_EQ(j.at("linear_num_value_heads"), 4);
}

// The shipped VLA config trains on generated episodes (PNG frames) and writes a LLaVA checkpoint
// with its action bins.
TEST(CliTest, TheShippedVlaConfigTrainsOnGeneratedEpisodes) {
  const fs::path dir = tmp("cli_vla");
  const std::string data = (dir / "episodes.jsonl").string();
  Result r = treetrain("generate --kind toy-episodes --out " + data + " --num-episodes 3 --steps 3 --seed 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(dir / "episodes_frames" / "2_2.png"));
  // A second dataset generated into the folder writes its own frames (named after its file).
  const std::string first = slurp(dir / "episodes_frames" / "0_0.png");
  r = treetrain("generate --kind nav-episodes --out " + (dir / "nav.jsonl").string() + " --num-episodes 2 --seed 5");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(dir / "nav_frames" / "0_0.png"));
  EXPECT_EQ(slurp(dir / "episodes_frames" / "0_0.png"), first);
  EXPECT_NE(slurp(dir / "nav.jsonl").find("\"nav_frames/0_0.png\""), std::string::npos);
  r = treetrain("train --config configs/vla_tiny.yaml --set run_dir=" + (dir / "run").string() + " --set data.path=" +
                data + " --set train.max_steps=2 --set train.checkpoint_every=0");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const fs::path ckpt = dir / "run" / "checkpoints" / "step_2";
  std::ifstream cfg(ckpt / "config.json");
  const nlohmann::json j = nlohmann::json::parse(cfg);
  EXPECT_EQ(j.at("architectures")[0], "LlavaForConditionalGeneration");
  EXPECT_EQ(j.at("vision_config").at("image_size"), 16);
  EXPECT_TRUE(fs::is_regular_file(ckpt / "action_bins.json"));
  r = treetrain("generate --kind toy-episodes --out " + data + " --num-trees 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--kind toy-episodes takes --num-episodes, --steps, --image-size and --seed; drop --num-trees"),
            std::string::npos)
      << r.err;
  // Generating again replaces the earlier frames; a frames folder holding a file of the user's is
  // refused whole (nothing deleted, nothing written).
  r = treetrain("generate --kind toy-episodes --out " + data + " --num-episodes 2 --steps 2 --seed 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir / "episodes_frames" / "2_2.png")) << "the earlier dataset's frames are replaced";
  { std::ofstream(dir / "episodes_frames" / "notes.txt") << "precious"; }
  const std::string before = slurp(data);
  r = treetrain("generate --kind toy-episodes --out " + data + " --num-episodes 3 --steps 3 --seed 4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find((dir / "episodes_frames").string() + " holds notes.txt, which is not a frame a generated "
                       "dataset names (<episode>_<step>.png); generating here would replace that folder: move it "
                       "away or choose another --out"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(dir / "episodes_frames" / "notes.txt"), "precious");
  EXPECT_EQ(slurp(data), before);
}

// stats on robot episodes: each episode as its tree, with frame counts (a window of 2 shows
// frame 1 in two observation nodes).
TEST(CliTest, StatsOnEpisodesCountsFrames) {
  const fs::path dir = tmp("cli_episodes");
  fs::create_directories(dir / "frames");
  for (const char* f : {"0.png", "1.png", "2.png"}) std::ofstream(dir / "frames" / f) << "x";
  const std::string data = (dir / "ep.jsonl").string();
  std::ofstream(data) << R"({"id": "e", "instruction": [3, 4], "steps": [)"
                      << R"({"images": ["frames/0.png"], "action": [0.1]}, {"images": ["frames/1.png"], "action": [0.5]},)"
                      << R"({"images": ["frames/2.png"], "action": [0.9]}]})" << "\n";
  Result r = treetrain("stats --data " + dir.string() + " --format episodes --vocab-size 300");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: " + dir.string() + ": is a folder, expected the episodes JSONL file\n");
  r = treetrain("stats --data " + data + " --format episodes --vocab-size 300 --tokens-per-frame 4 --window 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("episodes").get<int>(), 1);
  EXPECT_EQ(j.at("paths").get<int>(), 3);
  EXPECT_EQ(j.at("unique_frames").get<int>(), 3);
  EXPECT_EQ(j.at("frame_occurrences").get<int>(), 4);
  // Flattened: step t's sample is the instruction, its window's frames and its action token.
  EXPECT_EQ(j.at("n_flat").get<int>(), (2 + 4 + 1) + (2 + 8 + 1) + (2 + 8 + 1));
  r = treetrain("stats --data " + data + " --format episodes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--vocab-size: expected the model's vocabulary"), std::string::npos) << r.err;
  r = treetrain("stats --data " + data + " --format tree --window 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tokens-per-frame and --window are for --format episodes"), std::string::npos) << r.err;
}

TEST(CliTest, StatsWithCapacityReportsThePartition) {
  const fs::path dir = tmp("cli_partition");
  const std::string data = (dir / "combs.jsonl").string();
  Result r = treetrain("generate --kind comb --out " + data +
                       " --num-trees 3 --vocab-size 32 --prefix-len 10 --steps 2 --history-len 3 --leaf-len 5");
  ASSERT_EQ(r.code, 0) << r.err;
  r = treetrain("stats --data " + data + " --format tree --capacity 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("partition")) << r.out;
  const nlohmann::json& p = j.at("partition");
  for (const char* k : {"capacity", "trees", "pieces", "n_flat", "n_tree", "tokens_with_gateways", "tokens_naive",
                        "peak_tokens", "max_piece_tokens"})
    EXPECT_TRUE(p.contains(k)) << k;
  EXPECT_EQ(p.at("capacity").get<int64_t>(), 8);
  EXPECT_EQ(p.at("trees").get<int64_t>(), 3);
  EXPECT_EQ(p.at("n_tree").get<int64_t>(), j.at("n_tree").get<int64_t>());
  EXPECT_EQ(p.at("tokens_with_gateways").get<int64_t>(), j.at("n_tree").get<int64_t>());
  EXPECT_GT(p.at("tokens_naive").get<int64_t>(), p.at("tokens_with_gateways").get<int64_t>());
  EXPECT_LE(p.at("max_piece_tokens").get<int64_t>(), 8);

  // Without --capacity there is no partition object; a capacity below 1 is a usage error.
  r = treetrain("stats --data " + data + " --format tree");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(nlohmann::json::parse(r.out).contains("partition"));
  r = treetrain("stats --data " + data + " --format tree --capacity 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--capacity: expected a positive number of tokens"), std::string::npos) << r.err;
  r = treetrain("stats --data " + data + " --format tree --capacity 99999999999999999999");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--capacity: '99999999999999999999' is out of range (a 64-bit integer: at most "
                       "9223372036854775807)"),
            std::string::npos)
      << r.err;
  r = treetrain("stats --data " + data + " --format tree --capacity -99999999999999999999");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("'-99999999999999999999' is out of range (a 64-bit integer: at least -9223372036854775808)"),
            std::string::npos)
      << r.err;
  r = treetrain("stats --data " + data + " --format tree --capacity 1.5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--capacity: expected an integer, got '1.5'"), std::string::npos) << r.err;
}

TEST(CliTest, PublishedExampleTotals) {
  // The totals quoted in docs/PARTITIONING.md and data/synthetic.h.
  const fs::path dir = tmp("cli_published");
  const std::string data = (dir / "published.jsonl").string();
  Result r = treetrain("generate --kind published-example --out " + data);
  ASSERT_EQ(r.code, 0) << r.err;
  r = treetrain("stats --data " + data + " --format tree --capacity 32768");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out).at("partition");
  EXPECT_EQ(p.at("n_flat").get<int64_t>(), 163584);
  EXPECT_EQ(p.at("n_tree").get<int64_t>(), 82688);
  EXPECT_EQ(p.at("tokens_with_gateways").get<int64_t>(), 82688);
  EXPECT_EQ(p.at("tokens_naive").get<int64_t>(), 102144);
  EXPECT_EQ(p.at("pieces").get<int64_t>(), 3);
  EXPECT_EQ(p.at("peak_tokens").get<int64_t>(), 82688);
  // partition.recompute: one piece (32768) at a time; the first two pieces (17152 + 32768) keep
  // their K/V rows and run their forward twice.
  EXPECT_EQ(p.at("recompute").at("peak_tokens").get<int64_t>(), 32768);
  EXPECT_EQ(p.at("recompute").at("kept_peak_tokens").get<int64_t>(), 49920);
  EXPECT_EQ(p.at("recompute").at("tokens_recomputed").get<int64_t>(), 49920);

  r = treetrain("generate --kind published-example --out " + data + " --num-trees 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--kind published-example has a fixed shape; drop --num-trees"), std::string::npos) << r.err;
}

// A value that does not fit the flag's field is a usage error naming the flag and its range, never
// a truncated value (4294967297 was once window 1); a trailing unknown flag is an unknown flag.
TEST(CliTest, OutOfRangeIntegersNameTheFlagAndTheRange) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"serve --checkpoint x --window 4294967297",
       "error: --window: expected an integer in [-1, 2147483647] (0: the full history; -1 or absent: the "
       "checkpoint's), got '4294967297'"},
      {"eval --env nav --checkpoint x --window 4294967296",
       "error: --window: expected an integer in [-1, 2147483647] (0: the full history; -1 or absent: the "
       "checkpoint's), got '4294967296'"},
      {"eval --env nav --checkpoint x --window -2",
       "error: --window: expected an integer in [-1, 2147483647] (0: the full history; -1 or absent: the "
       "checkpoint's), got '-2'"},
      {"serve --checkpoint x --max-sessions 4294967297",
       "error: --max-sessions: expected an integer in [1, 2147483647], got '4294967297'"},
      {"serve --checkpoint x --max-buffered-bytes 100",
       "error: --max-buffered-bytes: expected an integer in [1024, 9223372036854775807] (absent: 16 x "
       "--max-message-bytes), got '100'"},
      {"serve --checkpoint x --session-idle-s -1",
       "error: --session-idle-s: expected seconds in [0, 1e9] (0: sessions never close for going unused), got '-1'"},
      {"serve --checkpoint x --session-idle-s 1e10",
       "error: --session-idle-s: expected seconds in [0, 1e9] (0: sessions never close for going unused), got "
       "'1e10'"},
      {"serve --checkpoint x --session-idle-s soon", "error: --session-idle-s: expected a number, got 'soon'"},
      {"serve --checkpoint x --action-tokens 4294967297",
       "error: --action-tokens: expected an integer in [1, 2147483647], got '4294967297'"},
      {"stats --data x --format episodes --vocab-size 64 --window 4294967296",
       "error: --window: expected an integer in [0, 2147483647] (0: the full history), got '4294967296'"},
      {"stats --data x --format episodes --vocab-size 64 --tokens-per-frame 4294967297",
       "error: --tokens-per-frame: expected an integer in [1, 65536] (rows an image takes), got '4294967297'"},
      {"bench attention --data x --format tree --heads 4294967297",
       "error: --heads: expected an integer in [1, 65536], got '4294967297'"},
      {"bench attention --data x --format tree --iters 4294967297",
       "error: --iters: expected an integer in [1, 1048576], got '4294967297'"},
      {"bench attention --data x --format tree --warmup -1",
       "error: --warmup: expected an integer in [0, 1048576], got '-1'"},
      {"sweep --config x --nproc 4294967297",
       "error: --nproc: expected an integer in [1, 1024] (ranks per run), got '4294967297'"},
      {"launch --nproc 4294967297 -- train", "error: launch: --nproc N (1..1024) is required"},
      {"sample --checkpoint x --prompts y --num-samples 4294967297",
       "error: --num-samples: expected an integer in [1, 65536], got '4294967297'"},
      {"sample --checkpoint x --prompts y --max-new-tokens ' 12'",
       "error: --max-new-tokens: expected an integer in [1, 16777216], got ' 12'"},
      {"generate --kind rollouts --out x --turn-len 4294967297",
       "error: --turn-len: expected an integer in [1, 1073741824], got '4294967297'"},
      {"generate --kind rollouts --out x --num-trees 0",
       "error: --num-trees: expected an integer in [1, 1073741824], got '0'"},
      // stats --vocab-size: absent leaves ids unchecked; given, it must be a vocabulary.
      {"stats --data x --format tree --vocab-size -1",
       "error: --vocab-size: expected an integer in [1, 2147483648] (absent: token ids unchecked), got '-1'"},
      {"stats --data x --format rollouts --vocab-size 0",
       "error: --vocab-size: expected an integer in [1, 2147483648] (absent: token ids unchecked), got '0'"},
      {"stats --data x --format episodes --vocab-size 1",
       "error: --vocab-size: expected an integer in [2, 2147483648] (the model's vocabulary), got '1'"},
      {"stats --data x --format tree --bogus", "error: unknown flag --bogus for 'stats'"},
      {"serve --checkpoint x --bogus", "error: unknown flag --bogus for 'serve'"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = treetrain(args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err.rfind(want + "\n", 0), 0u) << args << ": " << r.err;
  }
}

// --action-ids FIRST:END: both fields whole digits, 0 <= FIRST < END <= 2^31 - 1.
TEST(CliTest, ActionIdsParseStrictly) {
  for (const std::string v : {"8x:12", ":12", "8:", "8:4294967308", "4294967304:4294967308", "-1:4", "8:12:3", "8: 12",
                              "+8:12", "12:8", "8:8", "8"}) {
    const Result r = treetrain("serve --checkpoint x --action-ids '" + v + "'");
    EXPECT_EQ(r.code, 2) << v;
    EXPECT_EQ(r.err.rfind("error: --action-ids: expected FIRST:END (ids FIRST .. END - 1, 0 <= FIRST < END <= "
                          "2147483647), e.g. 8:12, got '" + v + "'\n", 0),
              0u)
        << v << ": " << r.err;
  }
  // A well-formed range passes the flags and fails on the checkpoint.
  const Result r = treetrain("serve --checkpoint /nonexistent/ckpt --action-ids 8:12");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.find("--action-ids"), std::string::npos) << r.err;
}

// stats --format episodes on continuous actions: --action-bins (data.action_bins's default 256)
// must fit --vocab-size, said in terms of the flags; --capacity partitions episode trees into pieces
// of whole frames.
TEST(CliTest, StatsOnContinuousEpisodesTakesActionBins) {
  const fs::path dir = tmp("cli_action_bins");
  const std::string data = (dir / "ep.jsonl").string();
  Result r = treetrain("generate --kind toy-episodes --out " + data + " --num-episodes 2 --steps 3 --seed 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string stats = "stats --data " + data + " --format episodes --vocab-size 64 --tokens-per-frame 4";
  r = treetrain(stats);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: " + data + ": action bins: 256 bins (data.action_bins; stats --action-bins) for a "
                   "vocabulary of 64 ids (model.vocab_size; --vocab-size): the bins are the vocabulary's last ids, "
                   "expected 2 <= bins <= 64\n");
  r = treetrain(stats + " --action-bins 32");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("episodes").get<int>(), 2);
  EXPECT_EQ(j.at("paths").get<int>(), 6);
  r = treetrain(stats + " --action-bins 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: --action-bins: expected an integer in [2, 1048576], got '1'\n", 0), 0u) << r.err;
  // --capacity partitions the episode trees; a piece holds whole frames.
  r = treetrain(stats + " --action-bins 32 --capacity 3");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: --capacity: expected at least --tokens-per-frame (4) tokens: a piece holds whole "
                        "frames; got '3'\n", 0),
            0u)
      << r.err;
  r = treetrain(stats + " --action-bins 32 --capacity 8");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json p = nlohmann::json::parse(r.out);
  EXPECT_EQ(p.at("partition").at("capacity").get<int>(), 8);
  EXPECT_EQ(p.at("partition").at("n_tree").get<int64_t>(), p.at("n_tree").get<int64_t>());
  EXPECT_GT(p.at("partition").at("pieces").get<int>(), 2 * 2) << r.out;  // several pieces an episode
  EXPECT_LE(p.at("partition").at("max_piece_tokens").get<int>(), 8) << r.out;
  EXPECT_EQ(p.at("partition").at("frames").at("unique"), p.at("unique_frames")) << r.out;
  EXPECT_GE(p.at("partition").at("frames").at("tower_runs").get<int>(), p.at("unique_frames").get<int>()) << r.out;
  r = treetrain("stats --data " + data + " --format tree --action-bins 32");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: --action-bins is for --format episodes\n", 0), 0u) << r.err;
}

// generate: a flag of another kind is an error naming it; an oversize tree or file is an error
// naming the flags before anything is written; --out a folder leaves nothing behind.
// A generator that fails leaves an earlier dataset at its --out whole (file and frames), and names
// the flags to change; the SLURM script never replaces one of the sweep's inputs; bench attention
// without a GPU says so.
TEST(CliTest, FailedGenerationAndSweepScriptsKeepWhatIsThere) {
  const fs::path dir = tmp("cli_keep");
  const std::string data = (dir / "ep.jsonl").string();
  Result r = treetrain("generate --kind nav-episodes --out " + data + " --num-episodes 3 --seed 4");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string jsonl = slurp(data), frame = slurp(dir / "ep_frames" / "0_0.png");
  r = treetrain("generate --kind nav-episodes --out " + data + " --num-episodes 2 --size 64 --walls 1024");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find(" walls and 3 landmarks; use fewer walls (--walls) or a larger room (--size)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(slurp(data), jsonl);
  EXPECT_EQ(slurp(dir / "ep_frames" / "0_0.png"), frame);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path() << " left behind";

  r = treetrain("generate --kind rollouts --out " + (dir / "d.jsonl").string() + " --num-trees 2 --vocab-size 32");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(dir / "base.yaml") << "run_dir: " << (dir / "runs").string() << "\ndevice: cpu\ndata:\n  path: d.jsonl\n";
  const std::string sweep = (dir / "sw.yaml").string();
  std::ofstream(sweep) << "base: base.yaml\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n";
  const std::string sweep_text = slurp(sweep), base_text = slurp(dir / "base.yaml");
  for (const std::string& out : {sweep, (dir / "base.yaml").string(), (dir / "d.jsonl").string()}) {
    r = treetrain("sweep --config " + sweep + " --mode slurm --out " + out);
    EXPECT_EQ(r.code, 1) << out;
    EXPECT_NE(r.err.find("error: --out " + out + ": "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the SLURM script would replace it (write it to another file)"), std::string::npos) << r.err;
  }
  EXPECT_EQ(slurp(sweep), sweep_text);
  EXPECT_EQ(slurp(dir / "base.yaml"), base_text);
  r = treetrain("sweep --config " + sweep + " --mode slurm --nproc 8 --out " + (dir / "sw.sbatch").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: --nproc is for --mode local; a SLURM job runs slurm.gpus_per_node ranks a node", 0), 0u)
      << r.err;
  r = treetrain("sweep --config " + sweep + " --mode slurm --out " + (dir / "sw.sbatch").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(dir / "sw.sbatch").rfind("#!/bin/bash\n", 0), 0u);
  // A run's config.yaml that is not written yet (the runs removed): refused too, nothing written.
  const std::string first_config = r.out.substr(0, r.out.find('\n'));
  ASSERT_EQ(fs::path(first_config).filename(), "config.yaml") << r.out;
  fs::remove_all(dir / "runs");
  r = treetrain("sweep --config " + sweep + " --mode slurm --out " + first_config);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: --out " + first_config + ": a run's config"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(first_config));

  r = treetrain("bench attention --data " + (dir / "d.jsonl").string() + " --format rollouts --vocab-size 32");
  if (r.code == 0) return;  // a GPU: it timed
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.rfind("error: bench attention times the CUDA kernels, but no CUDA device is visible "
                        "(cudaGetDeviceCount: ", 0),
            0u)
      << r.err;
}

// What generate writes replaces a regular file only: through a symbolic link the file it leads
// to (the link kept), never a FIFO or folder (refused, nothing made), never a file of the user's
// beside it (the temporary file is hidden and per process); a flag where a value belongs is an
// error; a failed write to standard output is exit 1, not a silent 0.
TEST(CliTest, OutputsReplaceOnlyRegularFiles) {
  const fs::path dir = tmp("cli_outputs");
  fs::create_directories(dir / "real");
  std::ofstream(dir / "real" / "t.jsonl") << "old";
  fs::create_symlink("real/t.jsonl", dir / "link.jsonl");
  Result r = treetrain("generate --kind comb --num-trees 1 --out " + (dir / "link.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir / "link.jsonl"));
  EXPECT_EQ(slurp(dir / "real" / "t.jsonl").rfind("{\"id\":\"comb-000000\"", 0), 0u);
  // Episodes' frames are named relative to the file's folder: a link is refused there.
  r = treetrain("generate --kind toy-episodes --num-episodes 1 --out " + (dir / "link.jsonl").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: --out " + (dir / "link.jsonl").string() +
                       ": is a symbolic link, expected a regular file or a new name\n");
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  r = treetrain("generate --kind rollouts --out " + (dir / "fifo").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: --out " + (dir / "fifo").string() + ": is a FIFO, expected a regular file or a new name\n");
  EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  for (const std::string kind : {"comb", "toy-episodes"}) {
    const std::string out = (dir / ("new_" + kind)).string() + "/";
    r = treetrain("generate --kind " + kind + " --out " + out);
    EXPECT_EQ(r.code, 1) << kind;
    EXPECT_EQ(r.err, "error: --out " + out + ": ends in '/', expected a file path\n") << kind;
    EXPECT_FALSE(fs::exists(out)) << kind << ": nothing made";
  }
  std::ofstream(dir / "d.jsonl.tmp") << "the user's";
  r = treetrain("generate --kind comb --num-trees 1 --out " + (dir / "d.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(slurp(dir / "d.jsonl.tmp"), "the user's");
  r = treetrain("generate --kind comb --out --num-trees 1");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: --out needs a value, got the flag --num-trees (a value starting with -- goes as "
                        "--out=VALUE)\n",
                        0),
            0u)
      << r.err;
  EXPECT_FALSE(fs::exists("--num-trees"));
  // stats' JSON to a full disk.
  const std::string cmd = "trainer/treetrain stats --format tree --data " + (dir / "d.jsonl").string() +
                          " >/dev/full 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1);
  EXPECT_EQ(slurp(dir / "err"),
            "error: standard output: a write failed (a full disk?); what this command printed is incomplete\n");
}

// A local sweep's table shows each run's own figures: a run that fails before its first step (a
// fresh start over an earlier run's checkpoints) shows "-", not the metrics.jsonl left there.
TEST(CliTest, LocalSweepTableShowsOnlyThisRunsMetrics) {
  const fs::path dir = tmp("cli_sweep_local");
  Result r = treetrain("generate --kind rollouts --out " + (dir / "d.jsonl").string() +
                       " --num-trees 4 --vocab-size 32 --seed 2 --prompt-len 4 --turns 2 --turn-len 3");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ofstream(dir / "base.yaml") << "run_dir: " << (dir / "runs").string()
                                   << "\ndevice: cpu\nmodel:\n  vocab_size: 32\n  hidden_size: 16\n"
                                      "  intermediate_size: 32\n  num_hidden_layers: 1\n  num_attention_heads: 2\n"
                                      "  num_key_value_heads: 1\ndata:\n  path: d.jsonl\n  max_tokens_per_batch: 64\n"
                                      "train:\n  max_steps: 2\n";
  std::ofstream(dir / "sw.yaml") << "base: base.yaml\ngrid:\n  optim.lr: [1.0e-3, 3.0e-3]\n";
  const fs::path stale = dir / "runs" / "0_lr-1.0e-3";
  fs::create_directories(stale / "checkpoints" / "step_7");
  std::ofstream(stale / "metrics.jsonl") << R"({"step": 7, "loss": 1.5, "tokens_per_s": 99.0})" << "\n";
  r = treetrain("sweep --config " + (dir / "sw.yaml").string());
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("0_lr-1.0e-3  failed (exit 1)         -           -             -\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1_lr-3.0e-3  ok                      2  "), std::string::npos) << r.out;
}

TEST(CliTest, GenerateRejectsOtherKindsFlagsAndOversizeData) {
  const fs::path dir = tmp("cli_generate_checks");
  const std::string out = (dir / "d.jsonl").string();
  const std::vector<std::pair<std::string, std::string>> usage = {
      {"--kind published-example --noise 3", "error: --kind published-example has a fixed shape; drop --noise"},
      {"--kind toy-episodes --noise 0.5",
       "error: --kind toy-episodes takes --num-episodes, --steps, --image-size and --seed; drop --noise"},
      {"--kind rollouts --steps 3",
       "error: --kind rollouts takes --num-trees, --vocab-size, --seed, --prompt-len, --turns, --turn-len, --branches "
       "and --branch-turns; drop --steps"},
      {"--kind comb --turns 3",
       "error: --kind comb takes --num-trees, --vocab-size, --seed, --prefix-len, --steps, --history-len and "
       "--leaf-len; drop --turns"},
      {"--kind nav-episodes --num-trees 3",
       "error: --kind nav-episodes takes --num-episodes, --seed, --noise, --image-size, --size, --landmarks, --walls "
       "and --max-steps; drop --num-trees"},
  };
  for (const auto& [args, want] : usage) {
    const Result r = treetrain("generate --out " + out + " " + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_EQ(r.err.rfind(want + "\n", 0), 0u) << args << ": " << r.err;
  }
  Result r = treetrain("generate --kind rollouts --out " + out + " --num-trees 1 --turn-len 1073741824");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "error: synthetic: a tree of branches^branch_turns x (prompt_len + turns x turn_len) = 2^2 x (32 + 3 "
                   "x 1073741824) (--branches, --branch-turns, --prompt-len, --turns, --turn-len) is 12884902016 "
                   "tokens, expected at most 2^28 = 268435456\n");
  r = treetrain("generate --kind comb --out " + out + " --num-trees 1048576 --steps 64 --leaf-len 64");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("error: synthetic: num_trees x tokens a tree = 1048576 x 4640 = 4865392640 tokens (--num-trees; "
                       "a tree of prefix_len + steps x (history_len + leaf_len)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  fs::create_directories(dir / "folder");
  r = treetrain("generate --kind rollouts --out " + (dir / "folder").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "error: --out " + (dir / "folder").string() + ": is a folder, expected a regular file or a new name\n");
  EXPECT_FALSE(fs::exists((dir / "folder").string() + ".tmp"));
}

// nav-env: each field an integer in its range, named; a line of invalid UTF-8, two requests in one
// line, an unknown key or nesting past kMaxJsonDepth gets an error line and the loop goes on.
TEST(CliTest, NavEnvFieldsAreIntegersInRangeAndBadBytesGetAnErrorLine) {
  const fs::path dir = tmp("cli_nav_env");
  {
    std::ofstream in(dir / "in", std::ios::binary);
    in << "{\"reset\": {\"seed\": 1, \"episode\": 0}}\n"
       << "{\"step\": 1.7}\n{\"step\": 4294967297}\n{\"step\": -1}\n"
       << "{\"reset\": {\"seed\": -1, \"episode\": 0}}\n{\"reset\": {\"seed\": 1e30, \"episode\": 0}}\n"
       << "{\"reset\": {\"seed\": 1, \"episode\": 1.5}}\n"
       << "\xff\n{\"step\": \"\xff\"}\n"
       << "{\"step\": 1}\n"
       // Two requests in one line, an unknown key, nesting past 256 levels: errors, the loop goes on.
       << "{\"reset\": {\"seed\": 1, \"episode\": 0}, \"step\": 1}\n{\"reset\": {\"seed\": 1, \"episode\": 0, \"x\": 2}}\n"
       << "{\"step\": " << std::string(100000, '[') << std::string(100000, ']') << "}\n"
       << "{\"step\": 2}\n";
  }
  const Result r = treetrain("nav-env < " + (dir / "in").string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<nlohmann::json> lines;
  std::istringstream out(r.out);
  for (std::string l; std::getline(out, l);) lines.push_back(nlohmann::json::parse(l));
  ASSERT_EQ(lines.size(), 14u) << r.out;
  EXPECT_FALSE(lines[0].contains("error")) << lines[0].dump();
  const std::vector<std::string> want = {
      "\"step\": 1.7, expected an integer in [0, 3]",
      "\"step\": 4294967297, expected an integer in [0, 3]",
      "\"step\": -1, expected an integer in [0, 3]",
      "\"seed\": -1, expected an integer in [0, 18446744073709551615]",
      "\"seed\": 1e+30, expected an integer in [0, 18446744073709551615]",
      "\"episode\": 1.5, expected an integer in [0, 9223372036854775807]",
  };
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(lines[i + 1].value("error", ""), want[i]) << i;
  EXPECT_NE(lines[7].value("error", "").find("parse error"), std::string::npos) << lines[7].dump();
  EXPECT_NE(lines[8].value("error", "").find("parse error"), std::string::npos) << lines[8].dump();
  EXPECT_FALSE(lines[9].contains("error")) << lines[9].dump();
  EXPECT_EQ(lines[9].at("steps"), 1);
  EXPECT_EQ(lines[10].value("error", ""), "expected {\"reset\": {...}} or {\"step\": action}, one of them alone");
  EXPECT_EQ(lines[11].value("error", ""), "reset: unknown key \"x\" (expected seed and episode)");
  EXPECT_EQ(lines[12].value("error", ""), "arrays and objects nested deeper than 256 levels");
  EXPECT_EQ(lines[13].at("steps"), 2) << lines[13].dump();
}

}  // namespace
