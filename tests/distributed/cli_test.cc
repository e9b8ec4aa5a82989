// The treetrain binary's distributed commands: `launch --nproc 2 -- train` takes the update of
// one process (rank 0 alone writes; output prefixed by rank; losses and gradient norms by the
// rule of data_parallel_test.cc), a failing rank stops the others and
// is named, usage errors exit 2, and `sweep` runs its runs and prints their table or writes the
// SLURM array script.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "tests/distributed/test_util.h"
#include "tests/trainer/test_util.h"

namespace {

namespace fs = std::filesystem;
using tt::distributed::testing::test_dir;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
  double seconds = 0;
};

using tt::trainer::testing::slurp;

// `env` goes before the binary (e.g. "env -u OMP_NUM_THREADS ").
Result treetrain_env(const std::string& env, const std::string& args) {
  static int n = 0;
  const fs::path dir = test_dir("dist_cli_out_" + std::to_string(n++));
  const std::string cmd =
      env + "trainer/treetrain " + args + " >" + (dir / "out").string() + " 2>" + (dir / "err").string();
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(dir / "out");
  r.err = slurp(dir / "err");
  return r;
}

Result treetrain(const std::string& args) { return treetrain_env("", args); }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Generated rollouts and a tiny run config (run_dir dir/run) in dir.
fs::path write_run(const fs::path& dir) {
  const Result g = treetrain("generate --kind rollouts --out " + (dir / "data.jsonl").string() +
                             " --num-trees 12 --vocab-size 32 --seed 3 --prompt-len 6 --turns 2 --turn-len 4");
  EXPECT_EQ(g.code, 0) << g.err;
  std::ofstream(dir / "run.yaml") << "run_dir: " << (dir / "run").string() << "\n"
                                  << "device: cpu\n"
                                  << "model:\n  vocab_size: 32\n  hidden_size: 16\n  intermediate_size: 32\n"
                                     "  num_hidden_layers: 2\n  num_attention_heads: 2\n  num_key_value_heads: 1\n"
                                     "  max_position_embeddings: 128\n"
                                  << "data:\n  path: data.jsonl\n  max_tokens_per_batch: 40\n"
                                  << "train:\n  max_steps: 3\n  seed: 7\n  grad_accum: 2\n  grad_clip: 0.5\n"
                                  << "optim:\n  lr: 1.0e-2\n  eps: 1.0e-3\n  weight_decay: 0.1\n"
                                  << "distributed:\n  timeout_s: 5\n  collective_timeout_s: 10\n";
  return dir / "run.yaml";
}

std::vector<nlohmann::json> metrics(const fs::path& run_dir) { return tt::trainer::testing::read_metrics(run_dir); }

TEST(DistributedCliTest, LaunchTwoRanksTakesTheUpdateOfOneProcess) {
  const fs::path dir = test_dir("dist_cli_equal");
  const fs::path cfg = write_run(dir);
  Result one = treetrain("train --config " + cfg.string() + " --set run_dir=" + (dir / "one").string());
  ASSERT_EQ(one.code, 0) << one.err;
  Result two = treetrain("launch --nproc 2 -- train --config " + cfg.string() + " --set run_dir=" + (dir / "two").string());
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  // Output comes prefixed by rank; rank 1 logs only warnings, rank 0 speaks for the job.
  EXPECT_TRUE(has(two.out + two.err, "[rank 0] ")) << two.out << two.err;
  EXPECT_TRUE(has(two.out + two.err, "rank 0/2 on host ")) << two.out << two.err;
  EXPECT_FALSE(has(two.out + two.err, "[rank 1] ")) << two.out << two.err;

  const std::vector<nlohmann::json> a = metrics(dir / "one"), b = metrics(dir / "two");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);  // rank 0 alone wrote
  int events_files = 0;  // and its TensorBoard events, one file
  for (const auto& e : fs::directory_iterator(dir / "two" / "tb")) events_files += has(e.path().string(), "tfevents");
  EXPECT_EQ(events_files, 1);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(b[s].at("world_size").get<int>(), 2);
    EXPECT_EQ(b[s].at("n_tree"), a[s].at("n_tree"));
    EXPECT_EQ(b[s].at("paths"), a[s].at("paths"));
    // Steps 2 and 3 run on the weights after the earlier updates, so their losses check those
    // updates too (the parameters themselves are compared in data_parallel_test.cc).
    for (const char* k : {"loss", "grad_norm"}) {
      const double va = a[s].at(k).get<double>(), vb = b[s].at(k).get<double>();
      EXPECT_NEAR(vb, va, 1e-4 * va) << k << " step " << s + 1;
    }
  }
}

TEST(DistributedCliTest, LaunchStopsTheOthersAndNamesTheRankThatFailed) {
  const Result r = treetrain(
      "launch --nproc 3 --program /bin/sh -- -c 'echo up $RANK of $WORLD_SIZE at $MASTER_ADDR; "
      "if [ $RANK = 1 ]; then sleep 0.5; echo giving up >&2; exit 3; fi; sleep 30'");
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);  // the sleepers were stopped, not waited for
  EXPECT_TRUE(has(r.out, "[rank 0] up 0 of 3 at 127.0.0.1\n")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 2] up 2 of 3 at 127.0.0.1\n")) << r.out;
  EXPECT_TRUE(has(r.err, "[rank 1] giving up\n")) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex("error: launch: rank 1 \\(pid [0-9]+\\) exited with code 3; "
                                                  "stopped ranks 0, 2\n")))
      << r.err;
}

// `treetrain launch` of nproc shells that print $var (with var set to `given` in the launcher's
// environment when not null): what they printed, "[rank R] var VALUE" a line.
Result launch_printing(const std::string& var, int nproc, const char* given = nullptr) {
  Result r = treetrain_env(given ? "env " + var + "=" + given + " " : "",
                           "launch --nproc " + std::to_string(nproc) + " --program /bin/sh -- -c 'echo " + var + " $" +
                               var + "'");
  EXPECT_EQ(r.code, 0) << r.err;
  return r;
}

TEST(DistributedCliTest, LaunchGivesItsRanksOneJobIdOrKeepsTheCallers) {
  Result r = launch_printing("TT_JOB_ID", 2);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("\\[rank 0\\] TT_JOB_ID (launch-[^ ]+-[0-9]+-[0-9]+)\n")))
      << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] TT_JOB_ID " + m[1].str() + "\n")) << r.out;
  r = launch_printing("TT_JOB_ID", 2, "sweep-run-3");
  EXPECT_TRUE(has(r.out, "[rank 0] TT_JOB_ID sweep-run-3\n")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] TT_JOB_ID sweep-run-3\n")) << r.out;
}

TEST(DistributedCliTest, LaunchGivesItsRanksOneSecretOrKeepsTheCallers) {
  const std::regex rank0_secret("\\[rank 0\\] TT_JOB_SECRET ([0-9a-f]{32})\n");
  Result r = launch_printing("TT_JOB_SECRET", 2);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, rank0_secret)) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] TT_JOB_SECRET " + m[1].str() + "\n")) << r.out;
  const std::string first = m[1].str();
  r = launch_printing("TT_JOB_SECRET", 1);
  ASSERT_TRUE(std::regex_search(r.out, m, rank0_secret)) << r.out;
  EXPECT_NE(m[1].str(), first) << "a fresh secret per launch";
  r = launch_printing("TT_JOB_SECRET", 2, "the-callers-secret");
  EXPECT_TRUE(has(r.out, "[rank 0] TT_JOB_SECRET the-callers-secret\n")) << r.out;
  EXPECT_TRUE(has(r.out, "[rank 1] TT_JOB_SECRET the-callers-secret\n")) << r.out;
}

TEST(DistributedCliTest, ATrainingRankThatCannotStartFailsTheLaunch) {
  // Rank 1 cannot run at all; rank 0 waits in the rendezvous until the launcher stops it.
  const fs::path dir = test_dir("dist_cli_no_start");
  const fs::path cfg = write_run(dir);
  const Result r = treetrain("launch --nproc 2 --program /bin/sh -- -c '"
                             "if [ $RANK = 1 ]; then exit 4; fi; exec trainer/treetrain train --config " +
                             cfg.string() + "'");
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(std::regex_search(r.err, std::regex("error: launch: rank 1 \\(pid [0-9]+\\) exited with code 4; "
                                                  "stopped rank 0\n")))
      << r.err;
}

TEST(DistributedCliTest, ErrorsOfADistributedRunNameHostAndRank) {
  const fs::path dir = test_dir("dist_cli_tagged");
  const fs::path cfg = write_run(dir);
  // NCCL reduces device buffers; the CPU backend's gradients are on the host: every rank fails
  // before joining, at once.
  Result r = treetrain("launch --nproc 2 -- train --config " + cfg.string() + " --set distributed.comm=nccl");
  EXPECT_EQ(r.code, 1);
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_TRUE(std::regex_search(r.err, std::regex("\\[rank [01]\\] error: rank [01]/2 on host [^ ]+ \\(local rank [01]\\): "
                                                  "distributed.comm: nccl reduces device buffers, but the cpu backend "
                                                  "keeps its gradients on the host")))
      << r.err;
  // An error that is not the communicator's gets the tag from main, once.
  r = treetrain("launch --nproc 2 -- train --config " + cfg.string() + " --set data.path=" +
                (dir / "missing.jsonl").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(std::regex_search(r.err, std::regex("\\[rank [01]\\] error: rank [01]/2 on host [^ ]+ \\(local rank [01]\\): "
                                                  "data.path: cannot read")))
      << r.err;
  EXPECT_FALSE(std::regex_search(r.err, std::regex("\\(local rank [01]\\): rank [01]/2"))) << r.err;
}

TEST(DistributedCliTest, LaunchDividesTheCpusAndWaitsPassively) {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  const std::string want = std::to_string(std::max(1, CPU_COUNT(&set) / 2));
  const std::string clean = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS -u TREETRAIN_OMP_DEFAULTS ";
  const std::string show =
      "launch --nproc 2 --program /bin/sh -- -c 'echo threads=$OMP_NUM_THREADS "
      "policy=$OMP_WAIT_POLICY spin=$GOMP_SPINCOUNT'";
  Result r = treetrain_env(clean, show);
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* rank : {"[rank 0] ", "[rank 1] "})
    EXPECT_TRUE(has(r.out, rank + ("threads=" + want + " policy=passive spin=\n"))) << r.out;
  // What the user set is kept.
  r = treetrain_env(clean + "OMP_NUM_THREADS=3 OMP_WAIT_POLICY=active ", show);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[rank 1] threads=3 policy=active spin=\n")) << r.out;
  r = treetrain_env(clean + "GOMP_SPINCOUNT=10 ", show);
  EXPECT_TRUE(has(r.out, "[rank 0] threads=" + want + " policy= spin=10\n")) << r.out;
}

TEST(DistributedCliTest, LaunchUsageErrors) {
  Result r = treetrain("launch --nproc 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "error: launch: expected -- before the arguments of the ranks")) << r.err;
  r = treetrain("launch --nproc 0 -- train");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "error: launch: --nproc N (1..1024) is required")) << r.err;
  r = treetrain("launch --nproc 2 --");
  EXPECT_EQ(r.code, 2);
  // --help after -- belongs to the ranks.
  r = treetrain("launch --nproc 1 -- --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "[rank 0] usage:")) << r.out;
}

TEST(DistributedCliTest, SweepRunsLocallyAndWritesSlurmScripts) {
  const fs::path dir = test_dir("dist_cli_sweep");
  const fs::path cfg = write_run(dir);
  std::ofstream(dir / "sweep.yaml") << "base: run.yaml\nrun_dir: " << (dir / "runs").string()
                                    << "\nset:\n  train.max_steps: 2\ngrid:\n  optim.lr: [1.0e-2, 3.0e-2]\n";
  Result r = treetrain("sweep --config " + (dir / "sweep.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("0_lr-1.0e-2 +ok +2 +[0-9.]+ +[0-9.]+\n"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("1_lr-3.0e-2 +ok +2 +[0-9.]+ +[0-9.]+\n"))) << r.out;
  for (const char* run : {"0_lr-1.0e-2", "1_lr-3.0e-2"}) {
    EXPECT_TRUE(fs::is_regular_file(dir / "runs" / run / "config.yaml")) << run;
    EXPECT_TRUE(fs::is_directory(dir / "runs" / run / "checkpoints" / "step_2")) << run;
  }

  r = treetrain("sweep --config " + (dir / "sweep.yaml").string() + " --mode slurm --out " + (dir / "array.sbatch").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string script = slurp(dir / "array.sbatch");
  EXPECT_TRUE(has(script, "#SBATCH --array=0-1\n")) << script;
  EXPECT_TRUE(has(script, "train --config \"$config\"")) << script;
  EXPECT_TRUE(has(r.out, (dir / "runs" / "1_lr-3.0e-2" / "config.yaml").string())) << r.out;

  r = treetrain("sweep --config " + (dir / "sweep.yaml").string() + " --mode cluster");
  EXPECT_EQ(r.code, 2);
  std::ofstream(dir / "bad.yaml") << "base: run.yaml\ngrid:\n  optim.lr: [fast]\n";
  r = treetrain("sweep --config " + (dir / "bad.yaml").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(has(r.err, "bad.yaml:3: grid: optim.lr: optim.lr: expected a number, got 'fast'")) << r.err;
}

}  // namespace
