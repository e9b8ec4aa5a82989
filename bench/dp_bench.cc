// Data-parallel benchmark on a Qwen3-1.7B-shaped model (bench/qwen3_shapes.h), one process per
// GPU. Start N ranks with `treetrain launch --nproc N --program dp_bench -- <mode> ...` (any
// launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT works), or run it
// alone for one GPU. Rank 0 prints one JSON object per line on stdout; logs go to stderr.
//
//   dp_bench train --data FILE [--grad-accum 4] [--max-tokens 20000] [--warmup 2] [--steps 4]
//                  [--layers 28]
//     Trainer::train_step as `treetrain train` runs it (the loader, the deal of the step's trees
//     to ranks, forward/backward, the bucketed NCCL gradient all-reduce overlapped with the last
//     backward, the norm, AdamW), without metrics files or checkpoints (20 GB for this model).
//     The global batch is the same for any number of ranks: --grad-accum micro-batches of at most
//     --max-tokens tokens per step. Reports the medians over the timed steps of the step time,
//     the global tokens/s (unique tree tokens), this rank's MFU, and reduce_s: the wall time from
//     the end of the last backward to the reduced gradient norm, i.e. the part of the gradient
//     all-reduce that backward did not hide (with one process: the norm alone).
//   dp_bench allreduce [--warmup 2] [--iters 5] [--layers 28]
//     The plain NCCL all-reduce of the model's fp32 gradient buffer through the communicator the
//     trainer uses: one call over the whole buffer, the GradBuckets plan (about 25 MiB of whole
//     parameters per bucket, started back to back in backward's order), and one 25 MiB bucket.
//     Reports time, algorithm bandwidth (bytes / time) and bus bandwidth, nccl-tests' measure
//     for all-reduce: algbw * 2 (W - 1) / W, comparable with the link's peak for any W.
//     Needs W >= 2.
// Timing: CUDA events on the compute stream around the collectives (the compute stream waits for
// the communication stream through Communicator::wait()), after a host barrier, averaged over
// --iters back-to-back calls.
#include <cuda_runtime.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/qwen3_shapes.h"
#include "distributed/buckets.h"
#include "distributed/communicator.h"
#include "distributed/env.h"
#include "distributed/nccl_communicator.h"
#include "distributed/rendezvous.h"
#include "model/decoder.h"
#include "base/check.h"
#include "ops/cuda/check.h"
#include "trainer/config.h"
#include "trainer/train.h"

namespace {

using tt::Error;
using tt::str;

struct Flags {
  std::string mode;
  std::string data;
  int grad_accum = 4;
  int64_t max_tokens = 20000;
  int warmup = 2;
  int steps = 4;
  int iters = 5;
  int layers = 28;
};

Flags parse(int argc, char** argv) {
  Flags f;
  if (argc < 2) throw Error("usage: dp_bench train|allreduce [flags] (see bench/dp_bench.cc)");
  f.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(str(a, ": missing value"));
      return argv[++i];
    };
    if (a == "--data") f.data = next();
    else if (a == "--grad-accum") f.grad_accum = std::stoi(next());
    else if (a == "--max-tokens") f.max_tokens = std::stoll(next());
    else if (a == "--warmup") f.warmup = std::stoi(next());
    else if (a == "--steps") f.steps = std::stoi(next());
    else if (a == "--iters") f.iters = std::stoi(next());
    else if (a == "--layers") f.layers = std::stoi(next());
    else throw Error(str("unknown flag ", a, " (see bench/dp_bench.cc)"));
  }
  if (f.mode != "train" && f.mode != "allreduce") throw Error(str("unknown mode '", f.mode, "': train|allreduce"));
  if (f.mode == "train" && f.data.empty()) throw Error("train: --data FILE is required");
  if (f.steps < 1 || f.iters < 1 || f.warmup < 0) throw Error("--steps and --iters must be >= 1, --warmup >= 0");
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

int run_train(const Flags& f) {
  tt::trainer::RunConfig c;
  c.source = "dp_bench";
  c.run_dir = "/tmp/dp_bench_run";  // never written: no run(), no checkpoint
  c.device = "cuda";
  c.model = tt::bench::qwen3_1_7b(f.layers);
  c.data.path = f.data;
  c.data.format = "rollouts";
  c.data.packing = "tree";
  c.data.max_tokens_per_batch = f.max_tokens;
  c.train.max_steps = f.warmup + f.steps;
  c.train.grad_accum = f.grad_accum;
  c.train.loss_norm = "token_mean";
  c.train.grad_clip = 1.0;
  c.optim.lr = 1e-5;
  c.optim.weight_decay = 0.1;
  c.schedule.decay = "constant";
  c.validate();

  tt::trainer::Trainer t(c);
  const int W = t.world_size();
  std::vector<double> step_s, tok_s, mfu, reduce_s;
  int64_t tokens = 0;
  double loss = 0;
  for (int s = 0; s < f.warmup + f.steps; ++s) {
    const tt::trainer::StepMetrics m = t.train_step();
    spdlog::info("step {} ({}): {:.3f} s, {:.0f} tok/s, mfu {:.1f}%, reduce {:.1f} ms, loss {:.4f}, imbalance {:.3f}",
                 m.step, s < f.warmup ? "warm-up" : "timed", m.step_s, m.tokens_per_s, 100 * m.mfu, 1e3 * m.reduce_s,
                 m.loss, m.imbalance);
    if (s < f.warmup) continue;
    step_s.push_back(m.step_s);
    tok_s.push_back(m.tokens_per_s);
    mfu.push_back(m.mfu);
    reduce_s.push_back(m.reduce_s);
    tokens = m.n_tree;
    loss = m.loss;
  }
  if (t.rank() == 0) {
    const nlohmann::json j = {{"mode", "train"},
                              {"world_size", W},
                              {"parameters", t.backend().num_params()},
                              {"layers", f.layers},
                              {"grad_accum", f.grad_accum},
                              {"tokens_per_step", tokens},
                              {"timed_steps", f.steps},
                              {"step_s", median(step_s)},
                              {"tokens_per_s", median(tok_s)},
                              {"mfu_rank0", median(mfu)},
                              {"reduce_s", median(reduce_s)},
                              {"last_loss", loss}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

int run_allreduce(const Flags& f) {
  const tt::distributed::DistEnv env = tt::distributed::read_env("auto");
  if (!env.distributed()) throw Error("allreduce: needs >= 2 ranks (start it with treetrain launch --nproc N --program)");
  int visible = 0;
  TT_CUDA_CHECK(cudaGetDeviceCount(&visible));
  const int gpu = tt::distributed::pick_device(env.local_rank, env.local_world_size, visible);
  TT_CUDA_CHECK(cudaSetDevice(gpu));
  cudaStream_t compute = nullptr;
  TT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  tt::distributed::RendezvousOptions options;
  options.timeout_s = 60;
  options.collective_timeout_s = 120;
  auto comm = tt::distributed::make_nccl_communicator(tt::distributed::Rendezvous::connect(env, options), gpu, compute);

  const std::vector<tt::model::ParamInfo> info = tt::model::param_table(tt::bench::qwen3_1_7b(f.layers));
  std::vector<tt::distributed::ParamRange> ranges;
  for (const tt::model::ParamInfo& p : info) ranges.push_back({p.offset, p.numel});
  const int64_t P = info.back().offset + info.back().numel;
  tt::distributed::GradBuckets buckets(ranges);
  float* buf = nullptr;
  TT_CUDA_CHECK(cudaMalloc(&buf, sizeof(float) * P));
  TT_CUDA_CHECK(cudaMemsetAsync(buf, 0, sizeof(float) * P, compute));
  cudaEvent_t t0, t1;
  TT_CUDA_CHECK(cudaEventCreate(&t0));
  TT_CUDA_CHECK(cudaEventCreate(&t1));
  const int W = comm->world_size();
  const int64_t bucket_values = tt::distributed::GradBuckets::kDefaultBucketBytes / (int64_t)sizeof(float);

  auto time_ms = [&](auto&& body) {
    for (int i = 0; i < f.warmup; ++i) body();
    comm->wait();
    TT_CUDA_CHECK(cudaStreamSynchronize(compute));
    comm->barrier();
    TT_CUDA_CHECK(cudaEventRecord(t0, compute));
    for (int i = 0; i < f.iters; ++i) body();
    comm->wait();
    TT_CUDA_CHECK(cudaEventRecord(t1, compute));
    TT_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return (double)ms / f.iters;
  };
  auto report = [&](const std::string& what, int64_t values, int64_t calls, double ms) {
    const double bytes = (double)values * sizeof(float);
    const double algbw = bytes / (ms * 1e-3) / 1e9;
    const nlohmann::json j = {{"mode", "allreduce"}, {"what", what},         {"world_size", W},
                              {"bytes", bytes},      {"calls", calls},       {"ms", ms},
                              {"algbw_GBps", algbw}, {"busbw_GBps", algbw * 2.0 * (W - 1) / W}};
    if (comm->rank() == 0) std::printf("%s\n", j.dump().c_str());
  };

  report("bucket_25MiB", bucket_values, 1, time_ms([&] { comm->all_reduce_sum(buf, bucket_values); }));
  report("grad_whole", P, 1, time_ms([&] { comm->all_reduce_sum(buf, P); }));
  const int n_params = (int)info.size();
  report("grad_buckets", P, (int64_t)buckets.buckets().size(), time_ms([&] {
           buckets.begin(buf, *comm);
           for (int p = n_params - 1; p >= 0; --p) buckets.mark_ready(p);
           buckets.finish();
         }));
  std::fflush(stdout);
  TT_CUDA_CHECK(cudaStreamSynchronize(compute));
  comm->barrier();
  comm.reset();
  cudaFree(buf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tag;
  try {
    const Flags f = parse(argc, argv);
    const tt::distributed::DistEnv env = tt::distributed::read_env("auto");
    if (env.distributed()) tag = env.describe() + ": ";
    spdlog::set_default_logger(spdlog::stderr_color_mt("dp_bench"));  // stdout holds the JSON alone
    if (env.rank > 0) spdlog::set_level(spdlog::level::warn);
    return f.mode == "train" ? run_train(f) : run_allreduce(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp_bench: %s%s\n", tag.c_str(), e.what());
    return 1;
  }
}
