// The training loop end to end on tiny models: resume exactness, atomic checkpoints, gradient
// accumulation with the step-wide normaliser, partitioned training equal to unpartitioned
// training, and a short run whose loss falls.
#include "trainer/train.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "data/packing.h"
#include "data/reader.h"
#include "data/synthetic.h"
#include "model/safetensors.h"
#include "base/check.h"
#include "base/files.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/checkpoint.h"
#include "trainer/data_checks.h"
#include "trainer/run_dir.h"
#include "tests/trainer/test_util.h"

namespace tt::trainer {
namespace {

namespace fs = std::filesystem;

fs::path test_dir(const std::string& name) { return testing::fresh_dir(name); }

// A tiny qwen3 on synthetic rollouts in dir/data.jsonl; run_dir dir/run (tests/trainer/tiny_run.h).
RunConfig tiny_config(const fs::path& dir) { return testing::tiny_run_config(dir); }

std::vector<double> losses(const std::vector<StepMetrics>& ms) {
  std::vector<double> out;
  for (const StepMetrics& m : ms) out.push_back(m.loss);
  return out;
}

int count_lines(const fs::path& file) {
  std::ifstream in(file);
  int lines = 0;
  for (std::string l; std::getline(in, l);) lines += !l.empty();
  return lines;
}

using testing::error_of;

TEST(TrainTest, ResumeGivesBitwiseTheSameRun) {
  const fs::path dir = test_dir("resume");
  RunConfig a = tiny_config(dir);
  a.train.checkpoint_every = 3;
  Trainer full(a);
  const std::vector<double> want = losses(full.run());
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(count_lines(fs::path(a.run_dir) / "metrics.jsonl"), 6);
  const std::vector<float> want_params = full.backend().params_host();
  EXPECT_TRUE(fs::is_directory(fs::path(a.run_dir) / "checkpoints" / "step_3"));
  EXPECT_TRUE(fs::is_directory(fs::path(a.run_dir) / "checkpoints" / "step_6"));

  // Interrupted after step 3 (the process dies after its checkpoint), then resumed.
  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  b.train.checkpoint_every = 0;
  std::vector<double> got;
  {
    Trainer first(b);
    for (int i = 0; i < 3; ++i) got.push_back(first.train_step().loss);
    first.save_checkpoint();
  }
  b.train.resume = true;
  Trainer resumed(b);
  EXPECT_EQ(resumed.start_step(), 3);
  for (double l : losses(resumed.run())) got.push_back(l);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i + 1;
  EXPECT_EQ(resumed.backend().params_host(), want_params);

  // The first process wrote no metrics (train_step() alone does not); the resumed run wrote 4..6.
  EXPECT_EQ(count_lines(fs::path(b.run_dir) / "metrics.jsonl"), 3);
}

using testing::slurp;

// A resume with other settings than the checkpoint's says which (the data order, the objective,
// the optimizer, the schedule's length); where the run writes and how often, and memory-for-time
// trades (partition.recompute), do not count.
TEST(TrainTest, ResumeNamesTheSettingsThatChanged) {
  const fs::path dir = test_dir("resume_changed");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const std::string ckpt = latest_checkpoint(c.run_dir);
  ASSERT_NE(ckpt, "");
  RunConfig r = c;
  r.train.resume = true;
  r.train.checkpoint_every = 7;
  r.train.log_every = 3;
  r.partition.recompute = true;  // what trains is the same: a run that ran out of memory resumes so
  EXPECT_EQ(settings_changed_since(ckpt, r), "");
  r.data.shuffle = !c.data.shuffle;
  r.optim.lr = c.optim.lr * 2;
  r.train.loss_norm = c.train.loss_norm == "path_mean" ? "token_mean" : "path_mean";
  RunConfig fmt = r;  // the values as config.yaml writes them
  const auto then = c.values(), now = fmt.values();
  std::string want;
  for (size_t k = 0; k < then.size(); ++k)
    if (then[k].first == "optim.lr" || then[k].first == "train.loss_norm" || then[k].first == "data.shuffle")
      want += " " + then[k].first + ": " + then[k].second + " -> " + now[k].second + ";";
  EXPECT_EQ(settings_changed_since(ckpt, r), want);
  EXPECT_NE(want.find("data.shuffle: "), std::string::npos) << want;
}

// The checkpoint records the data's SHA-256: a file of the same size with other bytes is refused
// (the loader position would point elsewhere); a copy of the same bytes elsewhere resumes.
TEST(TrainTest, ResumeRefusesOtherDataOfTheSameSize) {
  {
    const fs::path abc = test_dir("sha256") / "abc";
    std::ofstream(abc) << "abc";
    EXPECT_EQ(file_sha256(abc.string()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    EXPECT_EQ(error_of([&] { file_sha256((abc.parent_path() / "none").string()); }),
              (abc.parent_path() / "none").string() + ": cannot open for reading: No such file or directory");
  }
  const fs::path dir = test_dir("resume_other_data");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const std::string ckpt = latest_checkpoint(c.run_dir);
  ASSERT_NE(ckpt, "");
  const std::string state = ckpt + "/trainer_state.json";
  EXPECT_EQ(read_trainer_state(state).data_sha256, file_sha256(c.data.path));
  // A copy of the same bytes under another name: resumes (a warning names both files).
  const std::string copy = (dir / "copy.jsonl").string();
  fs::copy_file(c.data.path, copy);
  RunConfig r = c;
  r.train.resume = true;
  r.train.max_steps = 2;
  r.data.path = copy;
  EXPECT_EQ(Trainer(r).start_step(), 1);
  // One digit changed: the same size, other content.
  std::string text = read_text(copy, "data");
  const size_t at = text.find_first_of("123456789");
  ASSERT_NE(at, std::string::npos);
  text[at] = text[at] == '9' ? '8' : (char)(text[at] + 1);
  std::ofstream(copy, std::ios::trunc) << text;
  ASSERT_EQ((int64_t)fs::file_size(copy), (int64_t)fs::file_size(c.data.path));
  EXPECT_EQ(error_of([&] { Trainer t(r); }),
            state + ": written for data " + c.data.path + " (sha256 " + file_sha256(c.data.path) + "), but data.path " +
                copy + " holds other content of the same size (sha256 " + file_sha256(copy) +
                "); the loader position would not match");
}

// A config that spells every layer out (layer_types) resumes from a checkpoint whose config.json
// leaves them to the default.
TEST(TrainTest, ResumeAcceptsEitherSpellingOfLayerTypes) {
  const fs::path dir = test_dir("resume_layer_types");
  RunConfig c = testing::tiny_run_config(dir);
  c.train.max_steps = 2;
  Trainer(c).run();
  c.train.max_steps = 3;
  c.train.resume = true;
  c.model.layer_types = {"full_attention", "full_attention"};
  EXPECT_EQ(Trainer(c).run().back().step, 3);
}

TEST(TrainTest, ResumeRewritesMetricsAtomically) {
  // A resumed run drops the metrics after its checkpoint by writing a new file and renaming it
  // over metrics.jsonl: the old file is never truncated in place (a kill there lost history).
  const fs::path dir = test_dir("metrics_atomic");
  RunConfig c = tiny_config(dir);
  c.train.checkpoint_every = 3;
  Trainer(c).run();
  const fs::path run = c.run_dir, metrics = run / "metrics.jsonl";
  ASSERT_EQ(count_lines(metrics), 6);
  fs::remove_all(run / "checkpoints" / "step_6");  // resume from step 3
  fs::create_hard_link(metrics, dir / "metrics.before");
  const std::string before = slurp(metrics);
  c.train.resume = true;
  Trainer resumed(c);
  ASSERT_EQ(resumed.start_step(), 3);
  resumed.run();
  EXPECT_FALSE(fs::equivalent(metrics, dir / "metrics.before"));
  EXPECT_EQ(slurp(dir / "metrics.before"), before);  // the old file, untouched
  EXPECT_EQ(count_lines(metrics), 6);
  std::istringstream kept(before);
  std::string first3;
  for (int i = 0; i < 3; ++i) {
    std::string l;
    std::getline(kept, l);
    first3 += l + "\n";
  }
  EXPECT_EQ(slurp(metrics).substr(0, first3.size()), first3);
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_EQ(e.path().filename().string().find(".metrics.jsonl.tmp-"), std::string::npos) << e.path();
}

TEST(TrainTest, ResumeWithoutCheckpointStartsFresh) {
  const fs::path dir = test_dir("resume_fresh");
  RunConfig c = tiny_config(dir);
  c.train.resume = true;
  c.train.max_steps = 1;
  Trainer t(c);
  EXPECT_EQ(t.start_step(), 0);
  t.run();
  EXPECT_EQ(latest_checkpoint(c.run_dir), (fs::path(c.run_dir) / "checkpoints" / "step_1").string());
}

// The console's text of a run (spdlog's default logger swapped for the call).
std::string run_log(const RunConfig& c) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  try {
    Trainer(c).run();
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  return log.str();
}

// Keys a run ignores (a section that is off) are named at its start: segment keys without
// segments, action bins without episodes.
TEST(TrainTest, IgnoredKeysAreNamedAtTheStart) {
  const fs::path dir = test_dir("ignored_keys");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  c.segments.tail = 4;
  c.data.action_bins = 3;
  const std::string log = run_log(c);
  EXPECT_NE(log.find("segments.tail is set, but segments.length is 0 (segments off), so it is ignored"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("data.action_bins is set, but data.format is 'rollouts' (only episodes' continuous actions are "
                     "binned), so it is ignored"),
            std::string::npos)
      << log;
}

// Off, with no periodic checkpoint before the last step, the run says up front that it writes none.
TEST(TrainTest, FinalCheckpointCanBeTurnedOff) {
  const fs::path dir = test_dir("no_final_checkpoint");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  c.train.final_checkpoint = false;
  const char* kWarning = "this run writes no checkpoint: train.final_checkpoint is false and train.checkpoint_every";
  std::string log = run_log(c);
  EXPECT_EQ(latest_checkpoint(c.run_dir), "");
  EXPECT_TRUE(fs::exists(fs::path(c.run_dir) / "metrics.jsonl"));
  EXPECT_NE(log.find(std::string(kWarning) + " 0 means only at the end (steps 1..2)"), std::string::npos) << log;
  // checkpoint_every past the last step: still none, still said.
  c.run_dir = (dir / "every_3").string();
  c.train.checkpoint_every = 3;
  c.train.max_steps = 3;
  log = run_log(c);
  EXPECT_EQ(latest_checkpoint(c.run_dir), "");
  EXPECT_NE(log.find(std::string(kWarning) + " 3 has no multiple before the last step (steps 1..3)"),
            std::string::npos)
      << log;
  // A periodic checkpoint before the last step: no warning.
  c.run_dir = (dir / "every_2").string();
  c.train.checkpoint_every = 2;
  log = run_log(c);
  EXPECT_EQ(latest_checkpoint(c.run_dir), (fs::path(c.run_dir) / "checkpoints" / "step_2").string());
  EXPECT_EQ(log.find(kWarning), std::string::npos) << log;
}

TEST(TrainTest, FreshStartOverCheckpointsIsAnError) {
  const fs::path dir = test_dir("fresh_over");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("already holds checkpoints"), std::string::npos) << e;
}

// Checkpoint folders that are all invalid (here: config.json gone, the weights intact) still
// stop a fresh start: it would write its own step_N over them. Nothing in them is touched.
TEST(TrainTest, FreshStartOverInvalidCheckpointsIsAnError) {
  const fs::path dir = test_dir("fresh_over_invalid");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  c.train.checkpoint_every = 1;
  Trainer(c).run();
  const fs::path ckpts = fs::path(c.run_dir) / "checkpoints";
  fs::remove(ckpts / "step_1" / "config.json");
  fs::remove(ckpts / "step_2" / "config.json");
  ASSERT_EQ(latest_checkpoint(c.run_dir), "");
  const std::string weights = slurp(ckpts / "step_2" / "model.safetensors");
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("already holds 2 checkpoint folders, none of them valid (newest " + (ckpts / "step_2").string()),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;  // what is wrong with the newest
  EXPECT_NE(e.find("set train.resume: true"), std::string::npos) << e;
  EXPECT_EQ(slurp(ckpts / "step_2" / "model.safetensors"), weights);
  EXPECT_TRUE(fs::exists(ckpts / "step_1" / "model.safetensors"));
}

// Lines a run drops from metrics.jsonl (a fresh start over an earlier run's metrics; a resume
// from a checkpoint older than the last logged step) are kept in metrics.jsonl.dropped-<time>.
TEST(TrainTest, DroppedMetricsLinesAreKeptAside) {
  const fs::path dir = test_dir("metrics_dropped");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 3;
  c.train.final_checkpoint = false;  // no checkpoint: the next run starts fresh
  Trainer(c).run();
  const fs::path run = c.run_dir, metrics = run / "metrics.jsonl";
  const std::string first_run = slurp(metrics);
  ASSERT_EQ(count_lines(metrics), 3);
  c.train.max_steps = 1;
  Trainer(c).run();
  EXPECT_EQ(count_lines(metrics), 1);
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind("metrics.jsonl.dropped-", 0) == 0) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(slurp(aside[0]), first_run);

  // A resume from step 1 after steps 2..3 were logged: those two lines go aside, the first stays.
  c.train.max_steps = 3;
  c.train.checkpoint_every = 1;
  c.run_dir = (dir / "run_b").string();
  Trainer(c).run();
  const fs::path metrics_b = fs::path(c.run_dir) / "metrics.jsonl";
  const std::string lines = slurp(metrics_b);
  fs::remove_all(fs::path(c.run_dir) / "checkpoints" / "step_3");
  fs::remove_all(fs::path(c.run_dir) / "checkpoints" / "step_2");
  c.train.resume = true;
  c.train.max_steps = 1;
  Trainer(c).run();
  EXPECT_EQ(count_lines(metrics_b), 1);
  std::string dropped;
  for (const auto& e : fs::directory_iterator(c.run_dir))
    if (e.path().filename().string().rfind("metrics.jsonl.dropped-", 0) == 0) dropped = slurp(e.path());
  EXPECT_EQ(slurp(metrics_b) + dropped, lines);
}

// One writer per run_dir: a second trainer on a run_dir whose trainer is alive stops before it
// reads or writes anything there, naming the holder; once the first is gone the run_dir is free.
TEST(TrainTest, ASecondTrainerOnALiveRunDirIsAnError) {
  const fs::path dir = test_dir("run_dir_lock");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  {
    Trainer first(c);
    const std::string e = error_of([&] { Trainer second(c); });
    EXPECT_NE(e.find("run_dir " + c.run_dir + " is in use by another treetrain (pid " + std::to_string(::getpid())),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("one run writes a run_dir at a time"), std::string::npos) << e;
    first.run();
  }
  c.train.resume = true;
  c.train.max_steps = 2;
  EXPECT_EQ(Trainer(c).run().back().step, 2);
}

TEST(TrainTest, TornCheckpointsAreIgnoredAndPruningKeepsTheNewest) {
  const fs::path dir = test_dir("torn");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 4;
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 2;
  Trainer(c).run();
  const fs::path ck = fs::path(c.run_dir) / "checkpoints";
  auto all = list_checkpoints(c.run_dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 3);
  EXPECT_EQ(all[1].first, 4);
  // A write that died before its rename, and a step folder missing files, are never picked.
  fs::create_directories(ck / ".step_9.tmp-12345");
  { std::ofstream(ck / ".step_9.tmp-12345" / "trainer_state.json") << "{}"; }
  fs::create_directories(ck / "step_8");
  { std::ofstream(ck / "step_8" / "trainer_state.json") << "{}"; }
  fs::create_directories(ck / "step_x7");
  EXPECT_EQ(latest_checkpoint(c.run_dir), (ck / "step_4").string());
  c.train.resume = true;
  c.train.max_steps = 5;
  Trainer t(c);
  EXPECT_EQ(t.start_step(), 4);
}

TEST(TrainTest, BadRunDirNamesTheKeyAndPath) {
  const fs::path dir = test_dir("bad_run_dir");
  RunConfig c = tiny_config(dir);
  { std::ofstream(dir / "a_file") << "x"; }
  c.run_dir = (dir / "a_file" / "run").string();
  c.origin["run_dir"] = "run.yaml:1";
  EXPECT_EQ(error_of([&] { Trainer t(c); }),
            "run.yaml:1: run_dir '" + c.run_dir + "': cannot create the folder: Not a directory");
  c.run_dir = (dir / "a_file").string();
  EXPECT_EQ(error_of([&] { Trainer t(c); }), "run.yaml:1: run_dir '" + c.run_dir + "' exists and is not a folder");
  // What the trainer writes into run_dir, there as the wrong kind: refused at start, not after the
  // steps whose checkpoint could not be written.
  for (const auto& [name, folder, what] : {std::tuple<std::string, bool, std::string>{"checkpoints", true, "checkpoints"},
                                           {"tb", true, "TensorBoard events"}, {"metrics.jsonl", false, "metrics"}}) {
    const fs::path rd = dir / ("rd_" + std::to_string(folder) + name);
    fs::create_directories(rd);
    if (folder) std::ofstream(rd / name) << "x";
    else fs::create_directories(rd / name);
    c.run_dir = rd.string();
    EXPECT_EQ(error_of([&] { prepare_run_dir(c); }),
              "run.yaml:1: run_dir '" + c.run_dir + "': " + (rd / name).string() + " exists and is not a " +
                  (folder ? "folder" : "file") + " (the trainer writes its " + what + " there): move it away");
  }
}

TEST(TrainTest, DangerousRunDirsAreRefused) {
  const fs::path dir = test_dir("dangerous_run_dir");
  RunConfig c = tiny_config(dir);
  c.origin["run_dir"] = "run.yaml:1";
  const std::string tail =
      "; the trainer writes metrics.jsonl and checkpoints/ into run_dir and prunes them: use a folder of its own, "
      "e.g. runs/<name>";
  for (const std::string root : {"/", "//", "/.", "/tmp/.."}) {
    c.run_dir = root;
    EXPECT_EQ(error_of([&] { prepare_run_dir(c); }),
              "run.yaml:1: run_dir '" + root + "' is the filesystem root" + tail);
  }
  c.run_dir = "/etc/";
  EXPECT_EQ(error_of([&] { prepare_run_dir(c); }), "run.yaml:1: run_dir '/etc/' is the system folder /etc" + tail);
  const char* old_home = std::getenv("HOME");
  const std::string saved = old_home ? old_home : "";
  ::setenv("HOME", (dir / "home").string().c_str(), 1);
  fs::create_directories(dir / "home");
  c.run_dir = (dir / "home").string();
  const std::string home_error = error_of([&] { prepare_run_dir(c); });
  c.run_dir = (dir / "home" / "runs" / "a").string();  // below it is fine
  const std::string below_error = error_of([&] { prepare_run_dir(c); });
  if (old_home)
    ::setenv("HOME", saved.c_str(), 1);
  else
    ::unsetenv("HOME");
  EXPECT_EQ(home_error, "run.yaml:1: run_dir '" + (dir / "home").string() + "' is the home folder itself" + tail);
  EXPECT_EQ(below_error, "");
  EXPECT_TRUE(fs::is_directory(dir / "home" / "runs" / "a"));
}

TEST(TrainTest, PositionsBeyondMaxPositionEmbeddingsAreAnError) {
  const fs::path dir = test_dir("max_positions");
  RunConfig c = tiny_config(dir);
  {
    std::ofstream(dir / "long.jsonl") << R"({"id": "long", "sequences": [{"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}, )"
                                      << R"({"tokens": [1, 2, 3]}]})"
                                      << "\n";
  }
  c.data.path = (dir / "long.jsonl").string();
  c.model.max_position_embeddings = 9;
  c.origin["model.max_position_embeddings"] = "run.yaml:7";
  EXPECT_EQ(error_of([&] { Trainer t(c); }), "run.yaml:7: model.max_position_embeddings is 9, but tree 'long' of " +
                                                 c.data.path + " has a path of 10 tokens (positions 0..9)");
  c.model.max_position_embeddings = 10;
  EXPECT_EQ(error_of([&] { Trainer t(c); }), "");
}

TEST(TrainTest, DataWithoutTargetsWarnsOrFails) {
  const fs::path dir = test_dir("no_targets");
  RunConfig c = tiny_config(dir);
  const std::string masked = R"({"id": "masked", "sequences": [{"tokens": [1, 2, 3], "loss_mask": [0, 0, 0]}, )"
                             R"({"tokens": [1, 4], "loss_mask": [1, 0]}]})";
  { std::ofstream(dir / "masked.jsonl") << masked << "\n"; }
  c.data.path = (dir / "masked.jsonl").string();
  c.origin["data.path"] = "run.yaml:9";
  EXPECT_EQ(error_of([&] { Trainer t(c); }),
            "run.yaml:9: data.path " + c.data.path +
                ": no token is a target (every loss_mask is 0 in all 1 trees): nothing to train");
  {
    std::ofstream(dir / "some.jsonl") << masked << "\n"
                                      << R"({"id": "b", "sequences": [{"tokens": [5, 6, 7]}]})"
                                      << "\n";
  }
  c.data.path = (dir / "some.jsonl").string();
  const std::vector<data::Tree> trees = data::read_trees(c.data.path, data::Format::kRollouts, 32);
  const std::vector<std::string> w = check_training_data(trees, c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "data: 1 of 2 trees (2 of 3 paths) have no target (every loss_mask is 0): they add no loss, but their "
            "paths count in the path_mean normaliser");
  EXPECT_EQ(error_of([&] { Trainer t(c); }), "");

  // token_mean: a step that draws only the untargeted tree (one tree a step, in file order) has
  // no target to average over; its loss and gradient are 0 and the run goes on (it stopped there).
  c.train.loss_norm = "token_mean";
  c.data.shuffle = false;
  c.data.max_tokens_per_batch = 4;
  c.train.grad_accum = 1;
  c.train.max_steps = 2;
  const std::vector<std::string> wt = check_training_data(trees, c);
  ASSERT_EQ(wt.size(), 1u);
  EXPECT_EQ(wt[0], "data: 1 of 2 trees (2 of 3 paths) have no target (every loss_mask is 0): they add no loss (a step "
                   "that draws only such trees has a zero gradient)");
  Trainer t(c);
  const StepMetrics s1 = t.train_step(), s2 = t.train_step();
  EXPECT_EQ(s1.loss, 0.0);
  EXPECT_EQ(s1.grad_norm, 0.0);
  EXPECT_EQ(s1.nll, 0.0);
  EXPECT_GT(s2.loss, 0.0) << "the second step's tree has targets";
  EXPECT_GT(s2.grad_norm, 0.0);
}

// A partitioned tree that cannot fit the memory free for it is an error at the start saying what
// helps: partition.recompute where its figure fits, else a smaller capacity; the backend's
// figures hold less with recompute on a chain.
TEST(TrainTest, PartitionMemoryProblemSaysWhatHelps) {
  std::string tokens;
  for (int i = 0; i < 16; ++i) tokens += (i ? ", " : "") + std::to_string(1 + i % 7);
  const data::Tree chain = data::parse_rollouts_line(R"({"id": "c", "sequences": [{"tokens": [)" + tokens + "]}]}",
                                                     "chain", 32);
  const data::Partition plan = data::plan_partition(data::split_long_nodes(chain, 4), 4);
  ASSERT_EQ(plan.num_pieces(), 4);
  ASSERT_EQ(plan.peak_tokens, 16);
  ASSERT_EQ(plan.max_piece_tokens, 4);
  ASSERT_EQ(plan.kept_peak_tokens, 12);
  const int64_t G = int64_t{1} << 30;
  EXPECT_EQ(partition_memory_problem("c", 16, plan, false, 40 * G, 10 * G, 50 * G, "GPU 0 has"), "");
  EXPECT_EQ(partition_memory_problem("c", 16, plan, false, 400 * G, 10 * G, -1, "GPU 0 has"), "");
  EXPECT_EQ(partition_memory_problem("c", 16, plan, false, 100 * G, 10 * G, 50 * G, "GPU 0 has"),
            "tree 'c' (16 tokens in 4 pieces) would hold about 100 GiB at once besides the training state (the "
            "activations of a chain of pieces, 16 tokens), but GPU 0 has 50 GiB free: set partition.recompute: true "
            "(the activations of one piece at a time, at most 4 tokens, and the K/V rows of 12 tokens: about 10 GiB)");
  EXPECT_EQ(partition_memory_problem("c", 16, plan, false, 100 * G, 60 * G, 50 * G, "GPU 0 has"),
            "tree 'c' (16 tokens in 4 pieces) would hold about 100 GiB at once besides the training state (the "
            "activations of a chain of pieces, 16 tokens), but GPU 0 has 50 GiB free: partition.recompute: true would "
            "still need about 60 GiB; a smaller partition.capacity_tokens (4 now) bounds a piece's activations (the "
            "K/V rows kept grow with the tree)");
  EXPECT_EQ(partition_memory_problem("c", 16, plan, true, 60 * G, 60 * G, 50 * G, "the host has"),
            "tree 'c' (16 tokens in 4 pieces) would hold about 60 GiB at once besides the training state (the "
            "activations of 4 tokens and the K/V rows of 12), but the host has 50 GiB free: a smaller "
            "partition.capacity_tokens (4 now) bounds a piece's activations (the K/V rows kept grow with the tree)");

  // The backend's figures: a chain's activations against one piece's and the others' rows.
  const fs::path dir = test_dir("partition_memory");
  const RunConfig c = tiny_config(dir);
  const std::unique_ptr<Backend> b = make_backend("cpu", c.model);
  EXPECT_GT(b->partition_resident_bytes(16, 0), b->partition_resident_bytes(4, 12));
  EXPECT_GT(b->partition_resident_bytes(4, 12), b->partition_resident_bytes(4, 0)) << "rows cost something";
  EXPECT_GT(b->free_memory_bytes(), 0) << "MemAvailable of /proc/meminfo";
}

// Targets whose weights are all 0, or cancel on every token (+1 and -1 on the same sequence),
// train nothing: an error. One non-zero weight anywhere is enough.
TEST(TrainTest, DataWhoseTargetsAllWeighZeroIsAnError) {
  const fs::path dir = test_dir("zero_weights");
  RunConfig c = tiny_config(dir);
  c.origin["data.path"] = "run.yaml:9";
  auto error_for = [&](const std::string& lines) {
    { std::ofstream(dir / "w.jsonl") << lines; }
    c.data.path = (dir / "w.jsonl").string();
    return error_of([&] { Trainer t(c); });
  };
  const std::string zero = R"({"sequences": [{"tokens": [1, 2, 3], "weight": 0}, {"tokens": [1, 4], "weight": 0.0}]})";
  const std::string cancel = R"({"sequences": [{"tokens": [5, 6], "weight": 1.5}, {"tokens": [5, 6], "weight": -1.5}]})";
  const std::string want = ": every target's weight is 0 in all 2 trees (the weights of the sequences or nodes over "
                           "each target sum to 0): the loss and every gradient would be 0, nothing to train";
  const std::string e = error_for(zero + "\n" + cancel + "\n");
  EXPECT_EQ(e, "run.yaml:9: data.path " + (dir / "w.jsonl").string() + want);
  EXPECT_EQ(error_for(zero + "\n" + R"({"sequences": [{"tokens": [5, 6], "weight": -0.5}]})" + "\n"), "");
}

TEST(TrainTest, TrainerStateErrorsNameTheField) {
  const fs::path dir = test_dir("state_fields");
  const fs::path file = dir / "trainer_state.json";
  auto error_for = [&](const std::string& text) {
    { std::ofstream(file) << text; }
    return error_of([&] { read_trainer_state(file.string()); });
  };
  const std::string good_loader =
      R"("loader": {"epoch": 0, "cursor": 3}, "seed": 7, "data": {"path": "d", "size_bytes": 10})";
  EXPECT_EQ(error_for(R"({"version": 1, "step": "two", )" + good_loader + "}"),
            file.string() + ": field \"step\": expected an integer >= 0, got \"two\"");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, "loader": {"epoch": 0, "cursor": -1}, "seed": 7})"),
            file.string() + ": field \"loader.cursor\": expected an integer >= 0, got -1");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, "loader": {"epoch": 0}, "seed": 7})"),
            file.string() + ": missing field \"loader.cursor\"");
  EXPECT_EQ(
      error_for(
          R"({"version": 1, "step": 2, "loader": {"epoch": 0, "cursor": 3}, "seed": 7, "data": {"path": 5, "size_bytes": 10}})"),
      file.string() + ": field \"data.path\": expected a string, got 5");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, "skipped": {"total": 1}, )" + good_loader + "}"),
            file.string() + ": missing field \"skipped.in_a_row\"");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, "skipped": {"total": 1, "in_a_row": 2}, )" + good_loader + "}"),
            file.string() + ": field \"skipped.in_a_row\": expected at most skipped.total (1), got 2");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, "skipped": {"total": 2, "in_a_row": 1}, )" + good_loader + "}"),
            "");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + good_loader + "}"), "");
  // data.cameras (episode data: images a step, for serve) is optional, 1 to 4096 when given.
  const std::string loader = R"("loader": {"epoch": 0, "cursor": 3}, "seed": 7, )";
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + loader + R"("data": {"path": "d", "size_bytes": 10, "cameras": 0}})"),
            file.string() + ": field \"data.cameras\": expected an integer >= 1, got 0");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + loader +
                      R"("data": {"path": "d", "size_bytes": 10, "cameras": 5000}})"),
            file.string() + ": field \"data.cameras\": expected 1 to 4096 images a step, got 5000");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + loader + R"("data": {"path": "d", "size_bytes": 10, "cameras": 2}})"),
            "");
  EXPECT_EQ(read_trainer_state(file.string()).cameras, 2);
  // data.sha256 is optional (older checkpoints), 64 lowercase hex digits when given.
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + loader + R"("data": {"path": "d", "size_bytes": 10, "sha256": "AB"}})"),
            file.string() + ": field \"data.sha256\": expected 64 lowercase hex digits, got \"AB\"");
  EXPECT_EQ(error_for(R"({"version": 1, "step": 2, )" + loader + R"("data": {"path": "d", "size_bytes": 10, "sha256": ")" +
                      std::string(64, 'e') + R"("}})"),
            "");
  EXPECT_EQ(read_trainer_state(file.string()).data_sha256, std::string(64, 'e'));
}

// step_<digits> names a checkpoint folder only as treetrain writes it: a copy named step_002 is
// not a second step 2 (pruning would remove the user's folder).
TEST(TrainTest, StepFoldersAreTheNamesTreetrainWrites) {
  const fs::path dir = test_dir("step_names");
  for (const char* f : {"step_2", "step_002", "step_0", "step_10", "step_x", "step_"})
    fs::create_directories(dir / "checkpoints" / f);
  std::vector<int64_t> steps;
  for (const auto& [step, path] : step_folders(dir.string())) steps.push_back(step);
  EXPECT_EQ(steps, (std::vector<int64_t>{0, 2, 10}));
}

// The folders of run_dir/checkpoints whose names start with `prefix`.
std::vector<std::string> folders_starting(const RunConfig& c, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(c.run_dir) / "checkpoints"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

void write_json(const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2) << "\n"; }

TEST(TrainTest, CheckpointHoldsAVersionAndAManifest) {
  const fs::path dir = test_dir("manifest");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const fs::path step = fs::path(c.run_dir) / "checkpoints" / "step_1";
  const nlohmann::json st = read_json(step / "trainer_state.json");
  EXPECT_EQ(st.at("version"), 2);
  std::set<std::string> listed;
  for (const auto& [name, entry] : st.at("files").items()) {
    listed.insert(name);
    EXPECT_EQ(entry.at("bytes").get<int64_t>(), (int64_t)fs::file_size(step / name)) << name;
  }
  EXPECT_EQ(listed,
            std::set<std::string>({"config.json", "config.yaml", "model.safetensors", "optimizer.safetensors"}));
  EXPECT_EQ(checkpoint_problem(step.string()), "");
}

TEST(TrainTest, ResumeMovesInvalidCheckpointsAsideAndTakesTheNewestValid) {
  const fs::path dir = test_dir("invalid_aside");
  RunConfig c = tiny_config(dir);
  c.train.checkpoint_every = 1;
  auto full = std::make_unique<Trainer>(c);
  const std::vector<double> want = losses(full->run());
  ASSERT_EQ(want.size(), 6u);
  const std::vector<float> want_params = full->backend().params_host();
  full.reset();  // it holds the run_dir's lock while it lives
  const fs::path ck = fs::path(c.run_dir) / "checkpoints";
  // Steps 5 and 6 are gone; in their place: a step_5 whose state says step 2, a stray
  // step_999999999999999999 without files, a step_4 whose optimizer state is truncated.
  fs::remove_all(ck / "step_5");
  fs::remove_all(ck / "step_6");
  fs::copy(ck / "step_2", ck / "step_5", fs::copy_options::recursive);
  fs::create_directories(ck / "step_999999999999999999");
  fs::resize_file(ck / "step_4" / "optimizer.safetensors", fs::file_size(ck / "step_4" / "optimizer.safetensors") / 2);
  EXPECT_EQ(checkpoint_problem((ck / "step_5").string()),
            (ck / "step_5" / "trainer_state.json").string() + ": says step 2, but the folder is step_5");
  EXPECT_EQ(checkpoint_problem((ck / "step_999999999999999999").string()),
            (ck / "step_999999999999999999" / "trainer_state.json").string() + ": missing");
  EXPECT_NE(checkpoint_problem((ck / "step_4").string()).find("optimizer.safetensors: "), std::string::npos);
  EXPECT_EQ(latest_checkpoint(c.run_dir), (ck / "step_3").string());
  fs::remove(fs::path(c.run_dir) / "metrics.jsonl");

  c.train.resume = true;
  Trainer resumed(c);
  EXPECT_EQ(resumed.start_step(), 3);
  const std::vector<double> got = losses(resumed.run());
  ASSERT_EQ(got.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[3 + i]) << "step " << 4 + i;  // bitwise
  EXPECT_EQ(resumed.backend().params_host(), want_params);
  const std::vector<std::string> aside = folders_starting(c, "step_");
  ASSERT_EQ(aside.size(), 9u);  // step_1..6 and the three moved aside
  for (const char* name : {"step_4.invalid-", "step_5.invalid-", "step_999999999999999999.invalid-"})
    EXPECT_EQ(folders_starting(c, name).size(), 1u) << name;
}

// A checkpoint file whose bytes changed in place after it was written (same size: bit rot, an
// overwrite) fails its CRC-32 when a run resumes from it: moved aside, and the run takes the
// checkpoint before it. Listing and pruning check sizes only (no file is read).
TEST(TrainTest, ResumeChecksTheFilesCrc) {
  const fs::path dir = test_dir("crc_resume");
  RunConfig c = tiny_config(dir);
  c.train.checkpoint_every = 1;
  c.train.max_steps = 4;
  auto full = std::make_unique<Trainer>(c);
  const std::vector<double> want = losses(full->run());
  full.reset();
  const fs::path ck = fs::path(c.run_dir) / "checkpoints";
  const fs::path model = ck / "step_4" / "model.safetensors";
  const uintmax_t size = fs::file_size(model);
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((std::streamoff)(size - 8));
    const char zeros[8] = {};
    f.write(zeros, 8);  // the last weights' bytes
  }
  EXPECT_EQ(fs::file_size(model), size);
  EXPECT_EQ(checkpoint_problem((ck / "step_4").string()), "") << "sizes alone see nothing";
  const std::string state = slurp(ck / "step_4" / "trainer_state.json");
  EXPECT_NE(state.find("\"crc32\": \""), std::string::npos) << state;
  c.train.resume = true;
  c.train.max_steps = 4;
  Trainer resumed(c);
  EXPECT_EQ(resumed.start_step(), 3);
  ASSERT_EQ(folders_starting(c, "step_4.invalid-").size(), 1u);
  const std::vector<double> got = losses(resumed.run());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], want[3]);
}

// A tree that runs partitioned is planned when the trainer starts: a plan whose gateways would list
// more ancestor ranges than data::kMaxGatewayRanges stops the run before its first step, naming
// where the capacity was set and the data file.
TEST(TrainTest, PartitionPlansAreCheckedAtTheStart) {
  const fs::path dir = test_dir("partition_upfront");
  RunConfig c = tiny_config(dir);
  {
    std::ofstream out(dir / "chain.jsonl");
    out << "{\"id\": \"chain\", \"sequences\": [{\"tokens\": [";
    for (int i = 0; i < 6000; ++i) out << (i ? ", " : "") << (i * 7) % 32;
    out << "]}]}\n";
  }
  c.data.path = (dir / "chain.jsonl").string();
  c.model.max_position_embeddings = 8192;
  c.partition.capacity_tokens = 1;
  c.origin["partition.capacity_tokens"] = "run.yaml:9";
  const std::string too_many =
      "run.yaml:9: data.path " + c.data.path +
      ": tree 'chain': capacity 1 cuts its 6000 tokens into 6000 pieces whose gateways would list 17997000 "
      "ancestor row ranges in all (5999 for one piece), expected at most 16777216; use a larger capacity "
      "(partition.capacity_tokens)";
  EXPECT_EQ(error_of([&] { Trainer t(c); }), too_many);
  EXPECT_FALSE(fs::exists(fs::path(c.run_dir) / "metrics.jsonl")) << "no step ran";
  // The same chain within the budget: over the capacity it runs partitioned when alone in a
  // micro-batch (here, the only tree), so it is planned at the start too.
  RunConfig within = c;
  within.data.max_tokens_per_batch = 8192;
  EXPECT_EQ(error_of([&] { Trainer t(within); }), too_many) << "within the budget";
  EXPECT_FALSE(fs::exists(fs::path(c.run_dir) / "metrics.jsonl")) << "no step ran";
  // Segments of one token on the same chain: the same bound, named at segments.length.
  c.partition.capacity_tokens = 0;
  c.segments.length = 1;
  c.origin["segments.length"] = "run.yaml:12";
  EXPECT_EQ(error_of([&] { Trainer t(c); }),
            "run.yaml:12: data.path " + c.data.path +
                ": tree 'chain': segment length 1 cuts its 6000 tokens into 6000 pieces whose gateways would list "
                "17997000 ancestor row ranges in all (5999 for one piece), expected at most 16777216; use a longer "
                "segment (segments.length)");
}

// A header whose dtype is not a string (the same byte count): a problem of the checkpoint, named,
// not a JSON library exception escaping the check.
TEST(TrainTest, ANonStringDtypeIsACheckpointProblem) {
  const fs::path dir = test_dir("dtype_number");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const fs::path step = fs::path(c.run_dir) / "checkpoints" / "step_1";
  const fs::path optim = step / "optimizer.safetensors";
  std::string bytes = read_text(optim.string(), "optimizer");
  const size_t at = bytes.find("\"dtype\":\"F32\"");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 13, "\"dtype\":5    ");
  std::ofstream(optim, std::ios::binary | std::ios::trunc) << bytes;
  testing::rehash_manifest(optim);
  const std::vector<model::ParamInfo> table = model::param_table(c.model);
  const std::string problem = checkpoint_problem(step.string(), &c.model, &table);
  EXPECT_NE(problem.find(optim.string() + ": tensor '"), std::string::npos) << problem;
  EXPECT_NE(problem.find("' is not an F32 entry with shape and data_offsets"), std::string::npos) << problem;
  // Resume moves it aside (the only one: a fresh start) instead of stopping with the exception.
  c.train.resume = true;
  EXPECT_EQ(Trainer(c).start_step(), 0);
  EXPECT_EQ(folders_starting(c, "step_1.invalid-").size(), 1u);
}

TEST(TrainTest, KeepCheckpointsCountsValidOnes) {
  const fs::path dir = test_dir("keep_valid");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 2;
  Trainer(c).run();
  const fs::path ck = fs::path(c.run_dir) / "checkpoints";
  // A complete-looking stray folder of a high step, whose state says another step.
  fs::copy(ck / "step_1", ck / "step_99", fs::copy_options::recursive);
  c.train.resume = true;
  c.train.max_steps = 4;
  Trainer t(c);
  EXPECT_EQ(t.start_step(), 2);
  t.run();
  const auto valid = list_checkpoints(c.run_dir);
  ASSERT_EQ(valid.size(), 2u);
  EXPECT_EQ(valid[0].first, 3);
  EXPECT_EQ(valid[1].first, 4);
}

TEST(TrainTest, OlderFormatVersionsAreReadAndNewerOnesRefused) {
  const fs::path dir = test_dir("versions");
  RunConfig a = tiny_config(dir);
  a.train.checkpoint_every = 3;
  auto full = std::make_unique<Trainer>(a);
  const std::vector<double> want = losses(full->run());
  const std::vector<model::ParamInfo> info = full->backend().params_info();
  full.reset();  // it holds the run_dir's lock while it lives
  for (const std::string variant : {"version 1", "no version"}) {
    RunConfig b = a;
    b.run_dir = (dir / ("run_" + std::string(variant == "version 1" ? "v1" : "v0"))).string();
    {
      Trainer first(b);
      for (int i = 0; i < 3; ++i) first.train_step();
      first.save_checkpoint();
    }
    // The layout of the current main: no manifest, "version": 1 (or none at all).
    const fs::path state = fs::path(b.run_dir) / "checkpoints" / "step_3" / "trainer_state.json";
    nlohmann::json j = read_json(state);
    j.erase("files");
    if (variant == "version 1")
      j["version"] = 1;
    else
      j.erase("version");
    write_json(state, j);
    b.train.resume = true;
    Trainer resumed(b);
    EXPECT_EQ(resumed.start_step(), 3) << variant;
    const std::vector<double> got = losses(resumed.run());
    ASSERT_EQ(got.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], want[3 + i]) << variant << " step " << 4 + i;
  }
  // Version 1 has no manifest; a truncated file still shows in the safetensors header check.
  const fs::path v1 = fs::path(a.run_dir) / "checkpoints" / "step_6";
  nlohmann::json j = read_json(v1 / "trainer_state.json");
  j.erase("files");
  j["version"] = 1;
  write_json(v1 / "trainer_state.json", j);
  EXPECT_EQ(checkpoint_problem(v1.string()), "");
  fs::resize_file(v1 / "model.safetensors", fs::file_size(v1 / "model.safetensors") - 4);
  EXPECT_NE(checkpoint_problem(v1.string(), &a.model, &info).find("model.safetensors: tensor '"), std::string::npos);
  // A newer version is refused, and left where it is.
  const fs::path v3 = fs::path(a.run_dir) / "checkpoints" / "step_3";
  j = read_json(v3 / "trainer_state.json");
  j["version"] = 3;
  write_json(v3 / "trainer_state.json", j);
  fs::remove_all(v1);
  a.train.resume = true;
  EXPECT_EQ(error_of([&] { Trainer t(a); }),
            (v3 / "trainer_state.json").string() +
                ": checkpoint format version 3 is newer than this treetrain reads (1 to 2); resume it with the "
                "treetrain that wrote it, or a newer one");
  EXPECT_TRUE(fs::is_directory(v3));
}

// A pid no process has: a child that has exited and been reaped.
int64_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST(TrainTest, CrashLeftoversAreCleanedAtStartAndKeepHolds) {
  const fs::path dir = test_dir("leftovers");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 3;
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 0;
  Trainer(c).run();
  const fs::path run = c.run_dir, ck = run / "checkpoints";
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  // A write of step_3 killed between its two renames: the old step_3 aside, the new one complete.
  fs::rename(ck / "step_3", ck / (".step_3.old-" + dead));
  fs::copy(ck / (".step_3.old-" + dead), ck / (".step_3.tmp-" + dead), fs::copy_options::recursive);
  // A write killed before its rename, an interrupted removal, one in progress (a live process),
  // a checkpoint half deleted by an older treetrain, an interrupted metrics rewrite.
  fs::create_directories(ck / (".step_4.tmp-" + dead));
  { std::ofstream(ck / (".step_4.tmp-" + dead) / "model.safetensors") << "partial"; }
  fs::copy(ck / "step_1", ck / (".step_1.deleting-" + dead), fs::copy_options::recursive);
  fs::create_directories(ck / (".step_5.tmp-" + live));
  fs::create_directories(ck / "step_0");
  { std::ofstream(ck / "step_0" / "config.yaml") << "x"; }
  { std::ofstream(run / (".metrics.jsonl.tmp-" + dead)) << "{}\n"; }
  // Atomic writes into the run folder killed before their rename (base/files.h names them), one
  // of a live process, and files of the user's that only look alike.
  { std::ofstream(atomic_temp_path((run / "gemm_tuning.json").string(), std::stol(dead))) << "{"; }
  { std::ofstream(atomic_temp_path((run / "metrics.jsonl.dropped-x").string(), std::stol(dead))) << "{"; }
  { std::ofstream(atomic_temp_path((run / "gemm_tuning.json").string(), std::stol(live))) << "{"; }
  { std::ofstream(run / ("notes.tmp-" + dead)) << "mine"; }
  { std::ofstream(run / (".notes.tmp-" + dead + "x")) << "mine"; }
  { std::ofstream(atomic_temp_path((run / "samples.jsonl").string(), std::stol(dead))) << "another tool's"; }

  c.train.resume = true;
  c.train.keep_checkpoints = 2;
  c.train.max_steps = 4;
  Trainer t(c);
  EXPECT_EQ(t.start_step(), 3);  // the restored step_3
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // keep_checkpoints holds at start already (step_1 went), only the live leftover stays.
  EXPECT_EQ(names, std::vector<std::string>({".step_5.tmp-" + live, "step_2", "step_3"}));
  EXPECT_FALSE(fs::exists(run / (".metrics.jsonl.tmp-" + dead)));
  EXPECT_FALSE(fs::exists(run / (".gemm_tuning.json.tmp-" + dead)));
  EXPECT_FALSE(fs::exists(run / (".metrics.jsonl.dropped-x.tmp-" + dead)));
  EXPECT_TRUE(fs::exists(run / (".gemm_tuning.json.tmp-" + live)));
  EXPECT_TRUE(fs::exists(run / ("notes.tmp-" + dead)));
  EXPECT_TRUE(fs::exists(run / (".notes.tmp-" + dead + "x")));
  EXPECT_TRUE(fs::exists(run / (".samples.jsonl.tmp-" + dead))) << "not a name treetrain's run writes";
  t.run();
  const auto valid = list_checkpoints(c.run_dir);
  ASSERT_EQ(valid.size(), 2u);
  EXPECT_EQ(valid[0].first, 3);
  EXPECT_EQ(valid[1].first, 4);
  for (const auto& e : fs::directory_iterator(ck))
    EXPECT_EQ(e.path().filename().string().find(".deleting-"), std::string::npos) << e.path();
}

TEST(TrainTest, ACorruptOnlyCheckpointIsMovedAsideAndTheRunStartsFresh) {
  const fs::path dir = test_dir("corrupt");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const fs::path file = fs::path(c.run_dir) / "checkpoints" / "step_1" / "optimizer.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);
  EXPECT_EQ(checkpoint_problem(file.parent_path().string()),
            file.string() + ": " + std::to_string(fs::file_size(file)) + " bytes, the manifest says " +
                std::to_string(2 * fs::file_size(file)));
  c.train.resume = true;
  Trainer t(c);
  EXPECT_EQ(t.start_step(), 0);
  EXPECT_EQ(folders_starting(c, "step_1.invalid-").size(), 1u);
}

TEST(TrainTest, CheckpointOfAnotherModelIsAnError) {
  const fs::path dir = test_dir("other_model");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  c.train.resume = true;
  c.model.intermediate_size = 48;
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("config.json: the checkpoint's model differs"), std::string::npos) << e;
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
}

TEST(TrainTest, CheckpointHoldsHfWeightsOptimizerStateAndConfig) {
  const fs::path dir = test_dir("layout");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  Trainer t(c);
  t.run();
  const fs::path step = fs::path(c.run_dir) / "checkpoints" / "step_2";
  const auto opt = model::read_safetensors((step / "optimizer.safetensors").string());
  EXPECT_EQ(opt.size(), 2 * t.backend().params_info().size());
  EXPECT_TRUE(opt.count("m.model.embed_tokens.weight"));
  EXPECT_TRUE(opt.count("v.model.embed_tokens.weight"));
  const auto w = model::read_safetensors((step / "model.safetensors").string());
  const std::vector<float> p = t.backend().params_host();
  for (const model::ParamInfo& info : t.backend().params_info()) {
    ASSERT_TRUE(w.count(info.name)) << info.name;
    for (int64_t i = 0; i < info.numel; ++i) ASSERT_EQ((float)w.at(info.name).values[i], p[info.offset + i]);
  }
  const RunConfig saved = load_config((step / "config.yaml").string(), {});
  EXPECT_EQ(saved.to_yaml(), c.to_yaml());
}

TEST(TrainTest, InitFromLoadsHfWeights) {
  const fs::path dir = test_dir("init_from");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  Trainer first(c);
  first.run();
  RunConfig d = c;
  d.run_dir = (dir / "run_d").string();
  d.init_from = (fs::path(c.run_dir) / "checkpoints" / "step_2").string();  // an HF layout folder
  Trainer second(d);
  EXPECT_EQ(second.backend().params_host(), first.backend().params_host());
}

// Two trees of 10 unique tokens each, so the batching is exact: budget 10 puts one tree in each
// micro-batch, budget 20 both in one. Tree "a" branches after 4 tokens; "b" is one sequence with
// a masked prompt and a half-weight.
void write_two_trees(const fs::path& path) {
  std::ofstream out(path);
  out << R"({"id": "a", "sequences": [{"tokens": [1, 2, 3, 4, 5, 6, 7]}, {"tokens": [1, 2, 3, 4, 8, 9, 10], "weight": 2.0}]})"
      << "\n"
      << R"({"id": "b", "sequences": [{"tokens": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20], "loss_mask": [0, 0, 0, 1, 1, 1, 1, 1, 1, 1], "weight": 0.5}]})"
      << "\n";
}

TEST(TrainTest, GradAccumUsesTheStepWideNormaliser) {
  for (const std::string norm : {"path_mean", "token_mean"}) {
    const fs::path dir = test_dir("accum_" + norm);
    write_two_trees(dir / "two.jsonl");
    RunConfig c = tiny_config(dir);
    c.data.path = (dir / "two.jsonl").string();
    c.data.format = "rollouts";
    c.data.shuffle = false;
    c.train.loss_norm = norm;
    c.train.max_steps = 1;
    c.train.grad_clip = 0.5;  // active: the clip factor depends on the step's whole gradient
    c.schedule.warmup_steps = 0;
    // eps well above fp32 noise keeps AdamW's first update m / (sqrt(v) + eps) Lipschitz in the
    // gradient, so fp32 summation-order differences stay fp32-sized in the parameters.
    c.optim.eps = 1e-3;

    RunConfig one = c;
    one.run_dir = (dir / "one").string();
    one.train.grad_accum = 1;
    one.data.max_tokens_per_batch = 20;
    RunConfig two = c;
    two.run_dir = (dir / "two").string();
    two.train.grad_accum = 2;
    two.data.max_tokens_per_batch = 10;

    Trainer t1(one), t2(two);
    const std::vector<float> p0 = t1.backend().params_host();
    ASSERT_EQ(p0, t2.backend().params_host());
    const StepMetrics m1 = t1.train_step();
    const StepMetrics m2 = t2.train_step();
    EXPECT_EQ(m1.n_tree, 20);
    EXPECT_EQ(m2.n_tree, 20);
    EXPECT_EQ(m1.paths, m2.paths);
    // fp32 forward and backward in another order: relative 1e-4 (fp32 against fp32).
    EXPECT_NEAR(m1.loss, m2.loss, 1e-4 * m1.loss) << norm;
    EXPECT_NEAR(m1.grad_norm, m2.grad_norm, 1e-4 * m1.grad_norm) << norm;
    const std::vector<float> g1 = t1.backend().grads_host(), g2 = t2.backend().grads_host();
    double gmax = 0;
    for (float g : g1) gmax = std::max(gmax, (double)std::abs(g));
    for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g1[i], g2[i], 1e-4 * gmax) << norm << " grad " << i;
    testing::expect_params_match(t2.backend().params_host(), t1.backend().params_host(), p0, norm);
  }
}

// Two rollout groups with negative, zero and positive weights and a partial mask: tree 'a' has
// paths of 7, 7 and 4 tokens, tree 'b' of 5 and 3.
void write_signed_trees(const fs::path& file) {
  std::ofstream out(file);
  out << R"({"id": "a", "sequences": [{"tokens": [1, 2, 3, 4, 5, 6, 7], "weight": -1.172}, )"
      << R"({"tokens": [1, 2, 3, 4, 8, 9, 10], "weight": 2.0}, {"tokens": [1, 2, 3, 11], "weight": 0}]})"
      << "\n"
      << R"({"id": "b", "sequences": [{"tokens": [11, 12, 13, 14, 15], "loss_mask": [0, 0, 1, 1, 1], )"
      << R"("weight": -0.5}, {"tokens": [11, 12, 16]}]})"
      << "\n";
}

TEST(TrainTest, SignedWeightsTrainLikeThePerPathBaseline) {
  // RL advantages: negative and zero weights train, with the same normalisers; one step of tree
  // packing equals one step of the per-path baseline.
  for (const std::string norm : {"path_mean", "token_mean"}) {
    const fs::path dir = test_dir("signed_" + norm);
    write_signed_trees(dir / "signed.jsonl");
    RunConfig c = tiny_config(dir);
    c.data.path = (dir / "signed.jsonl").string();
    c.data.shuffle = false;
    c.data.max_tokens_per_batch = 64;
    c.train.grad_accum = 1;
    c.train.loss_norm = norm;
    c.train.max_steps = 1;
    c.schedule.warmup_steps = 0;
    c.optim.eps = 1e-3;  // as in GradAccumUsesTheStepWideNormaliser: fp32-sized differences stay fp32-sized
    RunConfig tree = c, path = c;
    tree.run_dir = (dir / "tree").string();
    path.run_dir = (dir / "path").string();
    path.data.packing = "per_path";
    Trainer tt(tree), tp(path);
    ASSERT_EQ(tt.backend().params_host(), tp.backend().params_host());
    const StepMetrics mt = tt.train_step(), mp = tp.train_step();
    EXPECT_EQ(mt.paths, 5);
    // fp32 against fp32 in another summation order: relative 1e-4 (the loss is a sum of O(1)
    // terms of both signs, so its scale is the sum of their magnitudes, at least 1 here).
    EXPECT_NEAR(mt.loss, mp.loss, 1e-4 * std::max(1.0, std::abs(mp.loss))) << norm;
    EXPECT_NEAR(mt.grad_norm, mp.grad_norm, 1e-4 * mp.grad_norm) << norm;
    const std::vector<float> gt = tt.backend().grads_host(), gp = tp.backend().grads_host();
    double gmax = 0;
    for (float g : gp) gmax = std::max(gmax, (double)std::abs(g));
    ASSERT_GT(gmax, 0.0);
    for (size_t i = 0; i < gt.size(); ++i) ASSERT_NEAR(gt[i], gp[i], 1e-4 * gmax) << norm << " grad " << i;
    // The unweighted mean token NLL does not see the weights: the same in both packings, and
    // positive where the weighted objective is not.
    EXPECT_NEAR(mt.nll, mp.nll, 1e-5 * mp.nll) << norm;
    EXPECT_GT(mt.nll, 1.0) << norm;
  }
}

// A learning rate that overflows fp32 makes the first update non-finite: the run stops with a
// NonFiniteError naming the step and the tensor, before any checkpoint exists.
// A metrics line that cannot be written (a full disk) is reported at its step; training goes on,
// the final checkpoint is written, and then the run ends with the error naming the file and the
// steps whose metrics are missing.
TEST(TrainTest, AFailedMetricsWriteKeepsTheCheckpoint) {
  const fs::path dir = test_dir("metrics_write_fails");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 5;
  c.train.checkpoint_every = 0;  // only the final one
  Trainer t(c);
  testing::metrics_write_fails_at = 3;
  const std::string err = error_of([&] { t.run(); });
  testing::metrics_write_fails_at = -1;
  const std::string mpath = (fs::path(c.run_dir) / "metrics.jsonl").string();
  EXPECT_EQ(err, mpath + ": write failed at step 3: the metrics of steps 3..5 are missing (the checkpoint of step 5 "
                         "is written)");
  const auto ck = list_checkpoints(c.run_dir);
  ASSERT_EQ(ck.size(), 1u);
  EXPECT_EQ(ck[0].first, 5);
  std::ifstream in(mpath);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 3) << "steps 1, 2 and the one whose write failed (injected after it was written)";
}

// The ranks' agreement check names the first line that differs, and an extra line at one end.
TEST(TrainTest, FirstDifferentLinesOfTwoConfigs) {
  EXPECT_EQ(first_different_lines("a\nb\nc\n", "a\nx\nc\n"), std::make_pair(std::string("b"), std::string("x")));
  EXPECT_EQ(first_different_lines("a\nb\n", "a\nb\nnew:\n  key: 1\n"),
            std::make_pair(std::string("(the end of its config)"), std::string("new:")));
  EXPECT_EQ(first_different_lines("a\nb\nc", "a\nb"), std::make_pair(std::string("c"), std::string("(the end of its config)")));
  EXPECT_EQ(first_different_lines("a\n", "a\n"), std::make_pair(std::string(""), std::string("")));
}

TEST(TrainTest, ANonFiniteUpdateStopsBeforeAnyCheckpoint) {
  const fs::path dir = test_dir("nonfinite_update");
  RunConfig c = tiny_config(dir);
  c.optim.lr = 1e39;
  c.schedule.warmup_steps = 0;
  c.train.checkpoint_every = 1;
  Trainer t(c);
  try {
    t.run();
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 1: the update (lr "), std::string::npos) << msg;
    EXPECT_NE(msg.find(") left model.embed_tokens.weight (weights) non-finite"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nothing of this step is written (no checkpoint has been written yet)"), std::string::npos)
        << msg;
  }
  EXPECT_TRUE(list_checkpoints(c.run_dir).empty()) << "nothing non-finite is written";
}

// Logits that overflow (weights of size 1e30) make the loss non-finite: skip_step skips the update
// and counts it, up to train.max_skipped_steps in a row; stop (the default) stops at once.
TEST(TrainTest, NonFiniteStepsAreSkippedUpToTheCap) {
  const fs::path dir = test_dir("nonfinite_skip");
  RunConfig c = tiny_config(dir);
  c.model.initializer_range = 1e30;
  c.train.max_steps = 4;
  c.train.on_nonfinite = "skip_step";
  c.train.max_skipped_steps = 2;
  {
    Trainer t(c);
    const std::vector<float> w0 = t.backend().params_host();
    const StepMetrics a = t.train_step(), b = t.train_step();
    EXPECT_TRUE(a.skipped && b.skipped);
    EXPECT_EQ(b.skipped_steps, 2);
    EXPECT_EQ(t.step(), 2);
    EXPECT_EQ(t.backend().params_host(), w0) << "a skipped step updates nothing";
    try {
      t.train_step();
      FAIL() << "expected NonFiniteError";
    } catch (const NonFiniteError& e) {
      EXPECT_NE(std::string(e.what()).find("step 3: loss"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("more than train.max_skipped_steps (2) in a row"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("first non-finite gradient: "), std::string::npos) << e.what();
    }
  }
  c.train.on_nonfinite = "stop";
  c.run_dir = (dir / "stop").string();
  Trainer s(c);
  try {
    s.train_step();
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("(train.on_nonfinite: stop; skip_step skips such steps)"), std::string::npos)
        << e.what();
    // At a fresh model's first step the wide initialisation is named.
    EXPECT_NE(std::string(e.what()).find(" [initial weights drawn with model.initializer_range 1e+30 ("),
              std::string::npos)
        << e.what();
  }
}

// The skip counts are part of the run's state: a resumed run goes on counting (metrics and the
// in-a-row cap) where the checkpoint left off, so a kill never resets the cap.
TEST(TrainTest, SkippedStepCountsSurviveAResume) {
  const fs::path dir = test_dir("nonfinite_skip_resume");
  RunConfig c = tiny_config(dir);
  c.model.initializer_range = 1e30;
  c.train.max_steps = 2;
  c.train.on_nonfinite = "skip_step";
  c.train.max_skipped_steps = 3;
  const std::vector<StepMetrics> first = Trainer(c).run();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first.back().skipped_steps, 2);
  const TrainerState st =
      read_trainer_state((fs::path(c.run_dir) / "checkpoints" / "step_2" / "trainer_state.json").string());
  EXPECT_EQ(st.skipped_steps, 2);
  EXPECT_EQ(st.consecutive_skips, 2);
  c.train.resume = true;
  c.train.max_steps = 4;
  Trainer t(c);
  const StepMetrics third = t.train_step();
  EXPECT_TRUE(third.skipped);
  EXPECT_EQ(third.skipped_steps, 3);
  try {
    t.train_step();
    FAIL() << "expected NonFiniteError: the fourth skip in a row, two of them before the resume";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("more than train.max_skipped_steps (3) in a row"), std::string::npos)
        << e.what();
  }
  // metrics.jsonl carries the counts on every line, whatever train.on_nonfinite says.
  std::ifstream in(fs::path(c.run_dir) / "metrics.jsonl");
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    ++n;
    EXPECT_EQ(j.at("skipped_steps").get<int64_t>(), n);
    EXPECT_TRUE(j.at("skipped").get<bool>());
  }
  EXPECT_EQ(n, 2);
}

using testing::poke_f32;

// A negative AdamW second moment in a checkpoint (a damaged file, finite) is an error naming the
// file, the tensor and the element at resume, not a NaN update a step later.
TEST(TrainTest, NegativeSecondMomentsAreRefusedAtResume) {
  const fs::path dir = test_dir("negative_v");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 1;
  Trainer(c).run();
  const fs::path file = fs::path(c.run_dir) / "checkpoints" / "step_1" / "optimizer.safetensors";
  poke_f32(file, "v.model.norm.weight", 5, -0.25f);
  c.train.resume = true;
  c.train.max_steps = 2;
  EXPECT_EQ(error_of([&] { Trainer t(c); }),
            file.string() + ": tensor 'v.model.norm.weight' element 5 is -0.25, expected >= 0 (a second moment is an "
                            "average of squared gradients)");
}

// Non-finite values read from disk are errors naming the file and the tensor: an init_from model
// and a checkpoint's optimizer state (which a resumed run would otherwise carry on).
TEST(TrainTest, NonFiniteInitFromAndResumeAreRefused) {
  const fs::path dir = test_dir("nonfinite_load");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 2;
  c.train.checkpoint_every = 1;
  c.train.keep_checkpoints = 1;
  Trainer(c).run();
  const fs::path ckpt = fs::path(c.run_dir) / "checkpoints" / "step_2";
  // A NaN in the optimizer state of the newest checkpoint, patched in place (the file keeps its
  // size: the checkpoint stays valid by its manifest).
  auto poke_nan = [](const fs::path& file, const std::string& tensor, int64_t index) {
    poke_f32(file, tensor, index, NAN);
  };
  poke_nan(ckpt / "optimizer.safetensors", "v.model.norm.weight", 3);
  RunConfig r = c;
  r.train.resume = true;
  r.train.max_steps = 3;
  try {
    Trainer t(r);
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find(ckpt.string() + ": model.norm.weight (AdamW v) holds non-finite values"),
              std::string::npos)
        << e.what();
  }
  // The same checkpoint's weights with a NaN, as an init_from model.
  poke_nan(ckpt / "model.safetensors", "model.layers.1.mlp.up_proj.weight", 0);
  RunConfig f = c;
  f.run_dir = (dir / "fresh").string();
  f.init_from = ckpt.string();
  try {
    Trainer t(f);
    FAIL() << "expected NonFiniteError";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find(ckpt.string() +
                                         ": model.layers.1.mlp.up_proj.weight (weights) holds non-finite values "
                                         "(model.init_from)"),
              std::string::npos)
        << e.what();
  }
}

// A model that cannot fit is an error naming the keys before anything is allocated: 69 billion
// parameters need about a terabyte of weights, gradients and AdamW state.
TEST(TrainTest, AModelThatCannotFitIsAnErrorBeforeAllocating) {
  const fs::path dir = test_dir("too_big");
  RunConfig c = tiny_config(dir);
  c.model.hidden_size = 8192;
  c.model.intermediate_size = 32768;
  c.model.num_hidden_layers = 64;
  c.model.num_attention_heads = 64;
  c.model.num_key_value_heads = 8;
  c.model.head_dim = 128;
  const std::string err = error_of([&] { Trainer t(c); });
  EXPECT_NE(err.find(" parameters from model.hidden_size, model.intermediate_size, model.num_hidden_layers, "
                     "model.vocab_size) and data.max_tokens_per_batch = 40 need about "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("on cpu (weights "), std::string::npos) << err;
  EXPECT_NE(err.find("but the host has "), std::string::npos) << err;
}

// With every weight 1 and loss_norm token_mean the loss is the mean token NLL; metrics.jsonl
// records both.
TEST(TrainTest, NllIsTheLossForUnitWeightsAndTokenMean) {
  const fs::path dir = test_dir("nll");
  RunConfig c = tiny_config(dir);
  c.train.loss_norm = "token_mean";
  c.train.max_steps = 3;
  Trainer t(c);
  const std::vector<StepMetrics> ms = t.run();
  ASSERT_EQ(ms.size(), 3u);
  for (const StepMetrics& m : ms) EXPECT_NEAR(m.nll, m.loss, 1e-5 * m.loss) << "step " << m.step;
  std::ifstream in(fs::path(c.run_dir) / "metrics.jsonl");
  std::string line;
  std::getline(in, line);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_NEAR(j.at("nll").get<double>(), ms[0].nll, 1e-12 * ms[0].nll);
}

// Four episode combs of 42 unique tokens each (tiny_run.h use_combs).
constexpr int64_t kCombTokens = testing::kTinyCombTokens;
RunConfig comb_config(const fs::path& dir) {
  RunConfig c = tiny_config(dir);
  testing::use_combs(c, dir);
  c.train.max_steps = 4;  // two epochs of 2 x 2 micro-batches: plans are reused
  c.train.grad_accum = 2;
  c.train.grad_clip = 0.5;
  // As in GradAccumUsesTheStepWideNormaliser: eps well above fp32 noise keeps AdamW's update
  // Lipschitz in the gradient, so fp32 summation-order differences stay fp32-sized.
  c.optim.eps = 1e-3;
  return c;
}

TEST(TrainTest, PartitionedTrainingEqualsUnpartitioned) {
  for (const std::string norm : {"path_mean", "token_mean", "hybrid"}) {
    const fs::path dir = test_dir("partition_" + norm);
    RunConfig c = comb_config(dir);
    c.train.loss_norm = norm == "hybrid" ? "path_mean" : norm;
    if (norm == "hybrid") {  // Qwen3.5's Gated DeltaNet state and conv window cross every cut
      c.model.architecture = "qwen3_5_text";
      c.model.partial_rotary_factor = 0.5;
      c.model.num_hidden_layers = 3;
      c.model.layer_types = {"linear_attention", "full_attention", "linear_attention"};
      c.model.linear_num_key_heads = 1;
      c.model.linear_num_value_heads = 2;
      c.model.linear_key_head_dim = 4;
      c.model.linear_value_head_dim = 4;
      c.model.linear_conv_kernel_dim = 4;
    }
    // Reference: a budget of exactly one comb, so every micro-batch is one whole tree. The loader
    // order depends only on (seed, epoch), so every run below sees the same trees in each batch.
    RunConfig whole = c;
    whole.run_dir = (dir / "whole").string();
    whole.data.max_tokens_per_batch = kCombTokens;
    // Trees larger than the budget (each a micro-batch of its own), pieces of 8 tokens: the
    // 12-token prefix is split, and every step and leaf is cut off behind a gateway.
    RunConfig oversize = c;
    oversize.run_dir = (dir / "oversize").string();
    oversize.data.max_tokens_per_batch = 16;
    oversize.partition.capacity_tokens = 8;
    // Trees that fit the budget but exceed the capacity: a lone tree is partitioned too.
    RunConfig fits = c;
    fits.run_dir = (dir / "fits").string();
    fits.data.max_tokens_per_batch = kCombTokens;
    fits.partition.capacity_tokens = 20;
    // partition.recompute: the pieces with child pieces keep only their K/V rows (and offered
    // states) and run their forward again before their backward.
    RunConfig recompute = oversize;
    recompute.run_dir = (dir / "recompute").string();
    recompute.partition.recompute = true;

    Trainer ref(whole);
    const std::vector<float> p0 = ref.backend().params_host();
    std::vector<StepMetrics> want;
    for (int s = 0; s < 4; ++s) want.push_back(ref.train_step());
    const std::vector<float> want_params = ref.backend().params_host();

    std::vector<StepMetrics> oversize_steps;
    std::vector<float> oversize_params;
    for (const RunConfig* run : {&oversize, &fits, &recompute}) {
      Trainer t(*run);
      ASSERT_EQ(t.backend().params_host(), p0);
      for (int s = 0; s < 4; ++s) {
        const StepMetrics m = t.train_step();
        if (run == &oversize) oversize_steps.push_back(m);
        if (run == &recompute) {  // the same operations on the same inputs: the same bits
          EXPECT_EQ(m.loss, oversize_steps[s].loss) << "step " << s + 1;
          EXPECT_EQ(m.grad_norm, oversize_steps[s].grad_norm) << "step " << s + 1;
          EXPECT_EQ(m.pieces, oversize_steps[s].pieces) << "step " << s + 1;
          // executed_flops adds the extra forwards: more, by at most a third (a forward of the
          // blocks is a third of their training FLOPs; the LM head does not run twice).
          EXPECT_GT(m.executed_flops, oversize_steps[s].executed_flops) << "step " << s + 1;
          EXPECT_LT(m.executed_flops, 4.0 / 3.0 * oversize_steps[s].executed_flops) << "step " << s + 1;
        }
        EXPECT_EQ(want[s].pieces, 0);
        EXPECT_GT(m.pieces, 2) << run->run_dir << " step " << s + 1;  // two trees, >= 2 pieces each
        EXPECT_EQ(m.n_tree, want[s].n_tree);
        EXPECT_EQ(m.n_tree, 2 * kCombTokens);
        EXPECT_EQ(m.paths, want[s].paths);
        // fp32 against fp32 in another summation order (pieces, gateway keys, relayed K/V
        // gradients): relative 1e-5 on the loss and the gradient norm.
        EXPECT_NEAR(m.loss, want[s].loss, 1e-5 * want[s].loss) << run->run_dir << " step " << s + 1;
        EXPECT_NEAR(m.grad_norm, want[s].grad_norm, 1e-5 * want[s].grad_norm) << run->run_dir << " step " << s + 1;
      }
      // Parameters after four updates: the rule of GradAccumUsesTheStepWideNormaliser (1e-4 of the
      // largest update, plus 1e-6 of the parameter for fp32 rounding of p itself).
      testing::expect_params_match(t.backend().params_host(), want_params, p0, run->run_dir);
      // The setting reached the executor: pieces ran keeping only their rows (and only then).
      if (run == &recompute) {
        EXPECT_GT(t.backend().pieces_recomputed(), 0) << norm;
      } else {
        EXPECT_EQ(t.backend().pieces_recomputed(), 0) << norm;
      }
      if (run == &oversize) oversize_params = t.backend().params_host();
      if (run == &recompute) {
        EXPECT_EQ(t.backend().params_host(), oversize_params) << norm;
      }
    }
  }
}

TEST(TrainTest, PartitionedResumeGivesBitwiseTheSameRun) {
  const fs::path dir = test_dir("partition_resume");
  RunConfig a = comb_config(dir);
  a.data.max_tokens_per_batch = 16;
  a.partition.capacity_tokens = 8;
  a.train.grad_accum = 1;
  a.train.max_steps = 6;
  std::vector<double> want;
  std::vector<float> want_params;
  {
    Trainer full(a);
    want = losses(full.run());
    want_params = full.backend().params_host();
  }
  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  std::vector<double> got;
  {
    Trainer first(b);
    for (int i = 0; i < 3; ++i) got.push_back(first.train_step().loss);
    first.save_checkpoint();
  }
  b.train.resume = true;
  Trainer resumed(b);
  for (double l : losses(resumed.run())) got.push_back(l);
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed.backend().params_host(), want_params);
}

// per_path accepts a tree whose paths do not fit one micro-batch: they spread over micro-batches
// of the step, under the step's normaliser, so the step equals one that holds the whole tree in a
// single micro-batch (the signed data of SignedWeightsTrainLikeThePerPathBaseline: tree 'a' has
// paths of 7, 7 and 4 tokens, 18 in all, and an 8-token budget runs it as three micro-batches).
TEST(TrainTest, PerPathSpreadsATreesPathsOverMicroBatches) {
  for (const std::string norm : {"path_mean", "token_mean"}) {
    const fs::path dir = test_dir("spread_" + norm);
    write_signed_trees(dir / "signed.jsonl");
    RunConfig c = tiny_config(dir);
    c.data.path = (dir / "signed.jsonl").string();
    c.data.packing = "per_path";
    c.data.shuffle = false;
    c.train.loss_norm = norm;
    c.train.max_steps = 1;
    c.train.grad_clip = 0.5;  // active: the clip factor depends on the step's whole gradient
    c.schedule.warmup_steps = 0;
    c.optim.eps = 1e-3;  // as in GradAccumUsesTheStepWideNormaliser: fp32-sized differences stay fp32-sized
    RunConfig whole = c, spread = c;
    whole.run_dir = (dir / "whole").string();
    whole.data.max_tokens_per_batch = 64;
    whole.train.grad_accum = 1;
    spread.run_dir = (dir / "spread").string();
    spread.data.max_tokens_per_batch = 8;
    spread.train.grad_accum = 2;  // tree 'a' (three micro-batches), then tree 'b' (8 tokens)
    Trainer tw(whole), ts(spread);
    const std::vector<float> p0 = tw.backend().params_host();
    ASSERT_EQ(p0, ts.backend().params_host());
    const StepMetrics mw = tw.train_step(), ms = ts.train_step();
    EXPECT_EQ(ms.paths, 5);
    EXPECT_EQ(ms.n_flat, mw.n_flat);
    EXPECT_EQ(ms.n_tree, mw.n_tree);
    EXPECT_EQ(ms.executed_flops, mw.executed_flops) << "the same rows, visible pairs and targets";
    // fp32 against fp32 in another summation order: relative 1e-4 (scale: at least 1, see above).
    EXPECT_NEAR(ms.loss, mw.loss, 1e-4 * std::max(1.0, std::abs(mw.loss))) << norm;
    EXPECT_NEAR(ms.nll, mw.nll, 1e-5 * mw.nll) << norm;
    EXPECT_NEAR(ms.grad_norm, mw.grad_norm, 1e-4 * mw.grad_norm) << norm;
    testing::expect_params_match(ts.backend().params_host(), tw.backend().params_host(), p0, norm);
  }
  // A path longer than the budget cannot be spread: the error names the tree and the path.
  const fs::path dir = test_dir("spread_too_long");
  RunConfig c = tiny_config(dir);
  testing::use_combs(c, dir);  // combs whose longest path has 30 tokens
  c.data.packing = "per_path";
  c.data.max_tokens_per_batch = 29;
  EXPECT_NE(error_of([&] { Trainer t(c); }).find("': path 2 has 30 tokens, which exceeds data.max_tokens_per_batch = "
                                                   "29; expected every path to fit one micro-batch under per_path"),
            std::string::npos);
}

// Spread trees keep the loader's position per tree: a resumed run is bitwise the uninterrupted one.
TEST(TrainTest, PerPathSpreadTreesResumeBitwise) {
  const fs::path dir = test_dir("spread_resume");
  RunConfig a = tiny_config(dir);
  testing::use_combs(a, dir);  // per_path: 22 + 26 + 30 tokens a comb, over a 32-token budget
  a.data.packing = "per_path";
  a.data.max_tokens_per_batch = 32;
  a.train.max_steps = 4;
  a.train.grad_accum = 1;
  a.train.final_checkpoint = false;
  std::vector<double> want;
  std::vector<float> want_params;
  {
    Trainer full(a);
    const std::vector<StepMetrics> ms = full.run();
    for (const StepMetrics& m : ms) {
      EXPECT_EQ(m.paths, 3) << "one comb a step, its three paths in three micro-batches";
      want.push_back(m.loss);
    }
    want_params = full.backend().params_host();
  }
  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  std::vector<double> got;
  {
    Trainer first(b);
    for (int i = 0; i < 2; ++i) got.push_back(first.train_step().loss);
    first.save_checkpoint();
  }
  b.train.resume = true;
  Trainer resumed(b);
  for (double l : losses(resumed.run())) got.push_back(l);
  EXPECT_EQ(got, want);
  EXPECT_EQ(resumed.backend().params_host(), want_params);
}

TEST(TrainTest, OversizeTreeWithoutPartitioningIsAnError) {
  const fs::path dir = test_dir("oversize_off");
  RunConfig c = comb_config(dir);
  c.data.max_tokens_per_batch = 16;
  const std::string e = error_of([&] { Trainer t(c); });
  EXPECT_NE(e.find("has 42 tokens under tree packing, which exceeds data.max_tokens_per_batch = 16"), std::string::npos)
      << e;
  EXPECT_EQ(e.rfind(c.where("data.max_tokens_per_batch") + ": data.path " + c.data.path + ": tree '", 0), 0u) << e;
  EXPECT_NE(e.find("; expected every tree to fit one micro-batch (or set partition.capacity_tokens to cut larger trees "
                   "into pieces)"),
            std::string::npos)
      << e;
}

TEST(TrainTest, LossFallsOnSyntheticData) {
  const fs::path dir = test_dir("falls");
  RunConfig c = tiny_config(dir);
  c.train.max_steps = 40;
  c.train.grad_accum = 1;
  c.data.max_tokens_per_batch = 80;
  c.optim.lr = 2e-2;
  c.optim.weight_decay = 0;
  const std::vector<double> l = losses(Trainer(c).run());
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += l[i] / 5;
    last += l[l.size() - 1 - i] / 5;
  }
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
}

TEST(TrainTest, DeviceChoice) {
  model::ModelConfig m;
  m.head_dim = 64;  // the CUDA attention takes head dims 64 and 128
  EXPECT_EQ(error_of([&] { make_backend("tpu", m); }), "device: expected one of auto|cpu|cuda, got 'tpu'");
  EXPECT_EQ(make_backend("cpu", m)->name(), "cpu");
  const std::string picked = make_backend("auto", m)->name();
  if (picked == "cpu") {  // no CUDA device visible: asking for one names the key and the reason
    EXPECT_EQ(error_of([&] { make_backend("cuda", m); }).rfind("device: cuda but no CUDA device is visible (cudaGetDeviceCount: ", 0),
              0u);
  } else {
    EXPECT_EQ(picked, "cuda");
    EXPECT_EQ(make_backend("cuda", m)->name(), "cuda");
  }
}

TEST(TrainTest, NotifyDefaultReportsEveryParameterOnceAfterBackward) {
  // The data-parallel overlap hook on a backend that cannot report early (the CPU reference):
  // every parameter once, when the gradients are complete; loss and gradients are
  // forward_backward's, bit for bit.
  const fs::path dir = test_dir("notify_default");
  const RunConfig c = tiny_config(dir);
  const std::vector<data::Tree> trees = data::read_trees(c.data.path, data::Format::kRollouts, c.model.vocab_size);
  const data::PackedBatch batch = data::pack({&trees[0], &trees[1]}, data::Packing::kTree);
  std::unique_ptr<Backend> be = make_backend("cpu", c.model);
  be->init(3);
  be->zero_grad();
  const double want_loss = be->forward_backward(batch, 0.25);
  const std::vector<float> want_grads = be->grads_host();
  be->zero_grad();
  std::vector<int> times(be->params_info().size(), 0);
  std::vector<float> at_report;
  const double loss = be->forward_backward_notify(batch, 0.25, [&](int begin, int end) {
    for (int p = begin; p < end; ++p) ++times[p];
    at_report = be->grads_host();
  });
  EXPECT_EQ(loss, want_loss);
  EXPECT_EQ(times, std::vector<int>(times.size(), 1));
  EXPECT_EQ(at_report, want_grads);
  EXPECT_EQ(be->grads_host(), want_grads);
}

// Micro-batches enqueued without reading their losses (the trainer's step): pending_losses() gives
// forward_backward's losses in call order, bit for bit, the NLL sums join nll_sum() in call order
// once read (not before), the gradients are the same, and zero_grad() drops losses left unread.
TEST(TrainTest, EnqueuedMicroBatchesGiveTheirLossesOnceAStep) {
  const fs::path dir = test_dir("enqueue");
  const RunConfig c = tiny_config(dir);
  const std::vector<data::Tree> trees = data::read_trees(c.data.path, data::Format::kRollouts, c.model.vocab_size);
  const data::PackedBatch a = data::pack({&trees[0], &trees[1]}, data::Packing::kTree);
  const data::PackedBatch b = data::pack({&trees[2]}, data::Packing::kTree);
  std::unique_ptr<Backend> be = make_backend("cpu", c.model);
  be->init(3);
  be->zero_grad();
  double want = be->forward_backward(a, 0.25);
  want += be->forward_backward(b, 0.5);
  const double want_nll = be->nll_sum();
  const std::vector<float> want_grads = be->grads_host();
  be->zero_grad();
  be->enqueue_forward_backward(a, 0.25, nullptr);
  be->enqueue_forward_backward(b, 0.5, nullptr);
  EXPECT_THROW(be->nll_sum(), Error) << "read with the losses";
  const std::vector<double> got = be->pending_losses();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0] + got[1], want);
  EXPECT_EQ(be->nll_sum(), want_nll);
  EXPECT_EQ(be->grads_host(), want_grads);
  EXPECT_TRUE(be->pending_losses().empty()) << "each loss is read once";
  be->enqueue_forward_backward(a, 0.25, nullptr);
  be->zero_grad();
  EXPECT_TRUE(be->pending_losses().empty()) << "zero_grad drops unread losses";
  EXPECT_EQ(be->nll_sum(), 0.0);
}

}  // namespace
}  // namespace tt::trainer
