// Data-parallel training on the CPU: W ranks (threads of this process, or forked processes,
// joined by the real TCP rendezvous on loopback) take the update of one process with the same
// global batch; distributed runs are deterministic and resume bitwise; only rank 0 writes; ranks
// that disagree, or a rank that leaves, end the run with an error naming it.
//
// Tolerance rule (the one of tests/trainer/train_test.cc, GradAccumUsesTheStepWideNormaliser):
// the distributed step sums the same per-tree terms as the single process, regrouped into other
// micro-batches and summed over ranks in fp64, so the runs differ only by fp32 summation order.
// Loss and gradient norm agree to 1e-4 relative (fp32 against fp32); parameters to 1e-4 of the
// largest update plus 1e-6 of the parameter, with optim.eps = 1e-3 well above fp32 noise so that
// AdamW's update m / (sqrt(v) + eps) is Lipschitz in the gradient. Counts (tokens, paths) are
// integers and agree exactly; two distributed runs agree bitwise.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/partition.h"
#include "data/reader.h"
#include "data/synthetic.h"
#include "distributed/shard.h"
#include "model/decoder.h"
#include "model/segments.h"
#include "base/check.h"
#include "tests/distributed/test_util.h"
#include "tests/trainer/test_util.h"
#include "tests/trainer/tiny_run.h"
#include "trainer/checkpoint.h"
#include "trainer/train.h"

namespace tt::distributed {
namespace {

using namespace testing;
using trainer::RunConfig;
using trainer::StepMetrics;
using trainer::Trainer;
namespace fs = std::filesystem;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A tiny qwen3 on 12 synthetic rollout trees (dir/data.jsonl); 2 micro-batches of <= 40 tokens
// per step, so a step holds 2 to 4 trees to deal.
RunConfig tiny_config(const fs::path& dir) {
  RunConfig c = trainer::testing::tiny_run_config(dir);
  c.train.max_steps = 4;
  c.train.grad_clip = 0.5;  // active: the clip factor depends on the whole step's gradient
  c.optim.eps = 1e-3;       // see the tolerance rule
  c.distributed.mode = "off";  // the tests hand the trainers their communicators
  c.validate();
  return c;
}

struct RunResult {
  std::vector<StepMetrics> steps;
  std::vector<float> params;
};

// `steps` steps of one process.
RunResult single(const RunConfig& c, int steps) {
  Trainer t(c);
  RunResult r;
  for (int s = 0; s < steps; ++s) r.steps.push_back(t.train_step());
  r.params = t.backend().params_host();
  return r;
}

// `steps` steps on `world` ranks; every rank's result, by rank.
std::vector<RunResult> distributed_run(const RunConfig& c, int world, int steps) {
  auto comms = loopback_world(world, short_timeouts());
  std::vector<RunResult> out(world);
  expect_no_errors(on_ranks(world, [&](int r) {
    Trainer t(c, std::move(comms[r]));
    EXPECT_EQ(t.rank(), r);
    EXPECT_EQ(t.world_size(), world);
    for (int s = 0; s < steps; ++s) out[r].steps.push_back(t.train_step());
    out[r].params = t.backend().params_host();
  }));
  return out;
}

void expect_same_update(const RunResult& want, const RunResult& got, const std::vector<float>& p0,
                        const std::string& what) {
  ASSERT_EQ(want.steps.size(), got.steps.size());
  for (size_t s = 0; s < want.steps.size(); ++s) {
    const StepMetrics &a = want.steps[s], &b = got.steps[s];
    EXPECT_EQ(b.n_tree, a.n_tree) << what << " step " << s + 1;
    EXPECT_EQ(b.n_flat, a.n_flat) << what << " step " << s + 1;
    EXPECT_EQ(b.paths, a.paths) << what << " step " << s + 1;
    EXPECT_EQ(b.pieces, a.pieces) << what << " step " << s + 1;
    EXPECT_NEAR(b.loss, a.loss, 1e-4 * a.loss) << what << " step " << s + 1;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-4 * a.grad_norm) << what << " step " << s + 1;
  }
  trainer::testing::expect_params_match(got.params, want.params, p0, what);
}

TEST(DataParallelTest, RanksTakeTheUpdateOfOneProcess) {
  for (const std::string norm : {"path_mean", "token_mean"}) {
    const fs::path dir = test_dir("dp_equal_" + norm);
    RunConfig c = tiny_config(dir);
    c.train.loss_norm = norm;
    const std::vector<float> p0 = Trainer(c).backend().params_host();
    const RunResult want = single(c, 4);
    for (int world : {2, 3}) {
      const std::vector<RunResult> got = distributed_run(c, world, 4);
      for (int r = 0; r < world; ++r) {
        expect_same_update(want, got[r], p0, norm + " world " + std::to_string(world) + " rank " + std::to_string(r));
        // Every rank holds the same bytes: the reduced gradient is the same on all of them.
        EXPECT_EQ(got[r].params, got[0].params) << "rank " << r;
        for (const StepMetrics& m : got[r].steps) {
          EXPECT_EQ(m.world_size, world);
          EXPECT_GE(m.imbalance, 1.0);
          EXPECT_LE(m.imbalance, (double)world);
        }
      }
    }
  }
}

TEST(DataParallelTest, TwoProcessesTakeTheUpdateOfOneProcess) {
  // The same as above with real processes: two forked ranks write their losses and final
  // parameters to files; the parent compares them with its own one-process run.
  const fs::path dir = test_dir("dp_processes");
  const RunConfig c = tiny_config(dir);
  const std::vector<float> p0 = Trainer(c).backend().params_host();
  const RunResult want = single(c, 4);
  Listener l = bind_free_port();
  std::vector<pid_t> children;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        const DistEnv env = loopback_env(r, 2, l.port);
        std::unique_ptr<Rendezvous> rv = r == 0 ? Rendezvous::connect_with_listener(env, short_timeouts(), std::move(l.socket))
                                                : Rendezvous::connect(env, short_timeouts());
        Trainer t(c, make_cpu_communicator(std::move(rv)));
        std::ofstream out(dir / ("rank" + std::to_string(r)), std::ios::binary);
        for (int s = 0; s < 4; ++s) {
          const StepMetrics m = t.train_step();
          out.write(reinterpret_cast<const char*>(&m.loss), sizeof(double));
          out.write(reinterpret_cast<const char*>(&m.grad_norm), sizeof(double));
        }
        const std::vector<float> p = t.backend().params_host();
        out.write(reinterpret_cast<const char*>(p.data()), (std::streamsize)(p.size() * sizeof(float)));
        code = out ? 0 : 4;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 3;
      }
      ::_exit(code);
    }
    children.push_back(pid);
  }
  l.socket.close();
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)), std::ios::binary);
    RunResult got;
    for (int s = 0; s < 4; ++s) {
      StepMetrics m = want.steps[s];  // the counts; loss and gradient norm come from the rank
      in.read(reinterpret_cast<char*>(&m.loss), sizeof(double));
      in.read(reinterpret_cast<char*>(&m.grad_norm), sizeof(double));
      got.steps.push_back(m);
    }
    got.params.resize(p0.size());
    in.read(reinterpret_cast<char*>(got.params.data()), (std::streamsize)(p0.size() * sizeof(float)));
    ASSERT_TRUE(in) << "rank " << r;
    expect_same_update(want, got, p0, "process rank " + std::to_string(r));
  }
}

TEST(DataParallelTest, DistributedRunsAreDeterministic) {
  const fs::path dir = test_dir("dp_determinism");
  const RunConfig c = tiny_config(dir);
  const std::vector<RunResult> a = distributed_run(c, 2, 3);
  const std::vector<RunResult> b = distributed_run(c, 2, 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(a[0].steps[s].loss, b[0].steps[s].loss);
    EXPECT_EQ(a[0].steps[s].grad_norm, b[0].steps[s].grad_norm);
    EXPECT_EQ(a[0].steps[s].imbalance, b[0].steps[s].imbalance);
  }
  EXPECT_EQ(a[0].params, b[0].params);
}

TEST(DataParallelTest, PartitionedTreesTrainDataParallel) {
  // Combs of 42 tokens larger than the 16-token budget: each is a micro-batch of its own, trained
  // piece by piece (8-token pieces) on whichever rank it is dealt to.
  const fs::path dir = test_dir("dp_partition");
  RunConfig c = tiny_config(dir);
  trainer::testing::use_combs(c, dir);
  c.data.max_tokens_per_batch = 16;
  c.partition.capacity_tokens = 8;
  const std::vector<float> p0 = Trainer(c).backend().params_host();
  const RunResult want = single(c, 4);
  const std::vector<RunResult> got = distributed_run(c, 2, 4);
  for (const StepMetrics& m : got[0].steps) {
    EXPECT_GT(m.pieces, 2);
    EXPECT_DOUBLE_EQ(m.imbalance, 1.0);  // two equal combs per step, one per rank
  }
  expect_same_update(want, got[0], p0, "partitioned");
}

// Trees deeper than segments.length are dealt by what their segments execute (model::
// segment_work: a tail of M rows, not the whole history), not by their tree packing's FLOPs: two
// sequences of 48 and 20 tokens in segments of 8 with a 4-row tail, one per micro-batch, one step
// (each on a rank): the step's imbalance is the segmented costs', which differs from the packed
// ones' (attention over the whole history). The update is the one process's.
TEST(DataParallelTest, SegmentedTreesAreDealtByWhatTheirSegmentsExecute) {
  const fs::path dir = test_dir("dp_segments");
  RunConfig c = tiny_config(dir);
  std::vector<data::Tree> trees;
  {
    std::ofstream f(dir / "seqs.jsonl");
    int id = 0;
    for (int n : {48, 20}) {
      std::string line = R"({"id": "s)" + std::to_string(id++) + R"(", "sequences": [{"tokens": [)";
      for (int i = 0; i < n; ++i) line += (i ? "," : "") + std::to_string((7 * i + n) % 32);
      line += "]}]}";
      f << line << "\n";
      trees.push_back(data::parse_rollouts_line(line, "test", 0));
    }
  }
  c.data.path = (dir / "seqs.jsonl").string();
  c.data.max_tokens_per_batch = 64;
  c.data.shuffle = false;
  c.train.grad_accum = 2;
  c.train.max_steps = 1;
  c.segments.length = 8;
  c.segments.tail = 4;
  c.validate();
  const model::Architecture arch(c.model);
  std::vector<double> segmented, packed;
  for (const data::Tree& t : trees) {
    const model::Work w = model::segment_work(c.segments, data::plan_segments(t, c.segments.length), c.model);
    segmented.push_back(arch.flops(w, model::Pass::kTrain).executed);
    packed.push_back(tree_cost(arch, t, data::Packing::kTree));
  }
  const double want = balance(segmented, 2).imbalance(), packed_imbalance = balance(packed, 2).imbalance();
  ASSERT_GT(std::fabs(want - packed_imbalance), 1e-3) << "the two estimates must differ for the test to tell";
  const std::vector<float> p0 = Trainer(c).backend().params_host();
  const RunResult one = single(c, 1);
  const std::vector<RunResult> got = distributed_run(c, 2, 1);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(got[r].steps.size(), 1u);
    EXPECT_EQ(got[r].steps[0].pieces, 6 + 3) << "segments: 48 / 8 and 20 / 8 rounded up";
    EXPECT_NEAR(got[r].steps[0].imbalance, want, 1e-12 * want) << "rank " << r;
  }
  expect_same_update(one, got[0], p0, "segmented");
}

TEST(DataParallelTest, PerPathSpreadTreesTrainDataParallel) {
  // Combs of 78 tokens per_path over a 32-token budget: each is dealt whole to one rank, which
  // runs its three paths as three micro-batches.
  const fs::path dir = test_dir("dp_spread");
  RunConfig c = tiny_config(dir);
  trainer::testing::use_combs(c, dir);
  c.data.packing = "per_path";
  c.data.max_tokens_per_batch = 32;
  const std::vector<float> p0 = Trainer(c).backend().params_host();
  const RunResult want = single(c, 4);
  const std::vector<RunResult> got = distributed_run(c, 2, 4);
  for (const StepMetrics& m : got[0].steps) {
    EXPECT_EQ(m.paths, 6);  // two combs a step
    EXPECT_DOUBLE_EQ(m.imbalance, 1.0);  // one comb per rank
  }
  expect_same_update(want, got[0], p0, "per_path spread");
}

int count_lines(const fs::path& file) {
  std::ifstream in(file);
  int lines = 0;
  for (std::string l; std::getline(in, l);) lines += !l.empty();
  return lines;
}

TEST(DataParallelTest, RankZeroWritesAndAResumedRunIsBitwiseTheSame) {
  const fs::path dir = test_dir("dp_resume");
  RunConfig a = tiny_config(dir);
  a.train.max_steps = 6;
  a.train.checkpoint_every = 3;
  std::vector<std::vector<StepMetrics>> full(2);
  std::vector<float> want_params;
  {
    auto comms = loopback_world(2, short_timeouts());
    expect_no_errors(on_ranks(2, [&](int r) {
      Trainer t(a, std::move(comms[r]));
      full[r] = t.run();
      if (r == 0) want_params = t.backend().params_host();
    }));
  }
  EXPECT_EQ(count_lines(fs::path(a.run_dir) / "metrics.jsonl"), 6);  // one writer
  EXPECT_EQ(trainer::list_checkpoints(a.run_dir).size(), 2u);
  std::ifstream metrics(fs::path(a.run_dir) / "metrics.jsonl");
  std::string line;
  std::getline(metrics, line);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("world_size").get<int>(), 2);
  EXPECT_GE(j.at("imbalance").get<double>(), 1.0);

  // Interrupted after step 3 (both processes die after rank 0's checkpoint), then resumed.
  RunConfig b = a;
  b.run_dir = (dir / "run_b").string();
  b.train.checkpoint_every = 0;
  {
    auto comms = loopback_world(2, short_timeouts());
    expect_no_errors(on_ranks(2, [&](int r) {
      Trainer t(b, std::move(comms[r]));
      for (int s = 0; s < 3; ++s) t.train_step();
      EXPECT_EQ(t.save_checkpoint().empty(), r != 0);
    }));
  }
  b.train.resume = true;
  std::vector<std::vector<StepMetrics>> resumed(2);
  std::vector<float> got_params;
  {
    auto comms = loopback_world(2, short_timeouts());
    expect_no_errors(on_ranks(2, [&](int r) {
      Trainer t(b, std::move(comms[r]));
      EXPECT_EQ(t.start_step(), 3);
      resumed[r] = t.run();
      if (r == 0) got_params = t.backend().params_host();
    }));
  }
  ASSERT_EQ(resumed[0].size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(resumed[0][s].loss, full[0][s + 3].loss) << "step " << s + 4;
  EXPECT_EQ(got_params, want_params);
}

TEST(DataParallelTest, RanksThatDisagreeAreAnError) {
  const fs::path dir = test_dir("dp_disagree");
  const RunConfig c = tiny_config(dir);
  auto comms = loopback_world(2, short_timeouts());
  const auto errors = on_ranks(2, [&](int r) {
    RunConfig mine = c;
    if (r == 1) mine.optim.lr = 2e-2;  // e.g. a --set given to one rank only
    Trainer t(mine, std::move(comms[r]));
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(has(errors[r], "rank 1 disagrees with rank 0: '  lr: 0.02' vs '  lr: 0.01'")) << errors[r];
}

// Rank 1 of 2 in a forked process joining rank 0's listener: body(communicator) returns the
// child's exit status (an exception: 99). The caller waits for the returned pid.
pid_t fork_rank1(int port, const std::function<int(std::unique_ptr<Communicator>)>& body) {
  const pid_t child = ::fork();
  if (child != 0) return child;
  int code = 99;
  try {
    code = body(make_cpu_communicator(Rendezvous::connect(loopback_env(1, 2, port), short_timeouts())));
  } catch (...) {
  }
  ::_exit(code);
}

// The same config on every rank, but data.path holds other trees on rank 1's machine (a stale
// copy on a node's own disk; here a relative path from another working folder): an error on
// every rank before any step, not a run that mixes two datasets.
TEST(DataParallelTest, RanksThatReadOtherDataAreAnError) {
  const fs::path dir = test_dir("dp_other_data");
  RunConfig c = tiny_config(dir);
  for (const char* node : {"a", "b"}) {
    data::SyntheticSpec spec;
    spec.kind = "rollouts";
    spec.num_trees = 12;
    spec.vocab_size = 32;
    spec.seed = node[0] == 'a' ? 3 : 4;  // the shape of tiny_run_config's data
    spec.prompt_len = 6;
    spec.turns = 2;
    spec.turn_len = 4;
    spec.branches = 2;
    spec.branch_turns = 1;
    fs::create_directories(dir / node);
    data::write_jsonl(spec, (dir / node / "data.jsonl").string());
  }
  c.data.path = "data.jsonl";
  const fs::path cwd = fs::current_path();
  Listener l = bind_free_port();
  const pid_t child = fork_rank1(l.port, [&](std::unique_ptr<Communicator> comm) {
    fs::current_path(dir / "b");  // (before the constructor reads data.path)
    try {
      Trainer t(c, std::move(comm));
    } catch (const Error& e) {
      return has(e.what(), "rank 1 disagrees with rank 0: 'data ") ? 3 : 4;
    }
    return 0;
  });
  ASSERT_GE(child, 0);
  std::string error;
  try {
    fs::current_path(dir / "a");
    auto comm = make_cpu_communicator(
        Rendezvous::connect_with_listener(loopback_env(0, 2, l.port), short_timeouts(), std::move(l.socket)));
    Trainer t(c, std::move(comm));
  } catch (const Error& e) {
    error = e.what();
  }
  fs::current_path(cwd);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << "rank 1's exit: " << status;
  EXPECT_TRUE(has(error, "rank 1 disagrees with rank 0: 'data ")) << error;
  EXPECT_TRUE(has(error, "(every rank must read the same data: data.path data.jsonl holds other trees on rank 1's "
                         "machine)"))
      << error;
}

TEST(DataParallelTest, ARankThatExitsEarlyEndsTheOtherWithAClearError) {
  // Rank 1 is a forked process that trains one step and exits; rank 0 fails in step 2 at once.
  const fs::path dir = test_dir("dp_early_exit");
  const RunConfig c = tiny_config(dir);
  Listener l = bind_free_port();
  const pid_t child = fork_rank1(l.port, [&](std::unique_ptr<Communicator> comm) {
    Trainer t(c, std::move(comm));
    t.train_step();
    return 0;
  });
  ASSERT_GE(child, 0);
  std::string error;
  int steps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    auto comm = make_cpu_communicator(
        Rendezvous::connect_with_listener(loopback_env(0, 2, l.port), short_timeouts(3, 60), std::move(l.socket)));
    Trainer t(c, std::move(comm));
    for (; steps < 4; ++steps) t.train_step();
  } catch (const Error& e) {
    error = e.what();
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(steps, 1);
  EXPECT_TRUE(has(error, "rank 0/2 on host host0 (local rank 0): lost rank 1 (host host1) during all_reduce")) << error;
  EXPECT_LT(seconds_since(t0), 10.0);  // bounded by the step, not by collective_timeout_s = 60
}

}  // namespace
}  // namespace tt::distributed
