// Timed and profiled training steps of a benchmark (bench/train_bench.cc, bench/vla_bench.cc): the trainer's
// step (zero_grad, forward_backward per micro-batch, the gradient norm, AdamW with lr 0 so the
// weights stay put), wall-clock medians after warm-up, and the per-run report (step time,
// tokens/s, model and executed FLOPs from the FLOP API, MFU against trainer::kPeakFlops).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/check.h"
#include "data/packing.h"
#include "model/decoder.h"
#include "trainer/backend.h"
#include "trainer/train.h"

namespace tt::bench {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Run {
  std::vector<double> step_s, fb_s, opt_s;
  double loss = 0;
};

// warmup + steps training steps over `batches` (one optimizer step each).
inline Run time_steps(tt::trainer::Backend& be, const std::vector<tt::data::PackedBatch>& batches, double loss_scale, int warmup,
               int steps, int64_t* step_no) {
  Run r;
  for (int i = 0; i < warmup + steps; ++i) {
    const double t0 = now_s();
    be.zero_grad();
    double loss = 0;
    for (const tt::data::PackedBatch& b : batches) loss += be.forward_backward(b, loss_scale);
    const double t1 = now_s();
    const double norm = std::sqrt(be.grad_sum_squares());
    tt::trainer::OptimStep p;
    p.lr = 0;
    p.weight_decay = 0.1;
    p.step = ++*step_no;
    p.grad_scale = std::min(1.0, 1.0 / (norm + 1e-6));
    be.adamw_step(p);
    // The step's new GEMM winners take effect from the next step, as in the trainer.
    if (std::vector<tt::cuda::GemmTuned> won = be.take_gemm_pending(); !won.empty()) {
      std::vector<tt::cuda::GemmTuned> table = be.gemm_tuning();
      table.insert(table.end(), won.begin(), won.end());
      be.set_gemm_tuning(table);
    }
    const double t2 = now_s();
    if (!std::isfinite(loss) || !std::isfinite(norm)) throw tt::Error(tt::str("bench: loss ", loss, " norm ", norm));
    std::fprintf(stderr, "  step %d: %.3f s (fwd+bwd %.3f, opt %.3f) loss %.4f gnorm %.3f%s\n", i, t2 - t0, t1 - t0,
                 t2 - t1, loss, norm, i < warmup ? " (warm-up)" : "");
    if (i < warmup) continue;
    r.step_s.push_back(t2 - t0);
    r.fb_s.push_back(t1 - t0);
    r.opt_s.push_back(t2 - t1);
    r.loss = loss;
  }
  return r;
}

// Rows that are the source of a target (the rows the LM head runs on).
inline int64_t head_rows(const std::vector<tt::data::PackedBatch>& batches) {
  int64_t n = 0;
  for (const tt::data::PackedBatch& b : batches) {
    std::vector<int32_t> src(b.tgt_src);
    std::sort(src.begin(), src.end());
    n += std::unique(src.begin(), src.end()) - src.begin();
  }
  return n;
}

// Model and executed FLOPs of a training step over the batches (the FLOP API).
inline tt::model::Flops step_flops(const tt::model::Architecture& arch, const std::vector<tt::data::PackedBatch>& batches) {
  tt::model::Work w;
  for (const tt::data::PackedBatch& b : batches) w += tt::model::Work::of(b);
  return arch.flops(w, tt::model::Pass::kTrain);
}

inline nlohmann::json report(const tt::model::Architecture& arch, const std::vector<tt::data::PackedBatch>& batches, const Run& r,
                      int64_t n_tree, double* flops_out, double* step_out) {
  int64_t tokens = 0, pairs = 0, targets = 0;
  for (const tt::data::PackedBatch& b : batches) {
    tokens += b.n_tokens;
    pairs += b.visible_pairs;
    targets += (int64_t)b.tgt_src.size();
  }
  const tt::model::Flops f = step_flops(arch, batches);
  const double flops = f.model, executed = f.executed;
  const double t = median(r.step_s);
  *flops_out = flops;
  *step_out = t;
  return {{"micro_batches", batches.size()},
          {"packed_tokens", tokens},
          {"unique_tokens", n_tree},
          {"visible_pairs", pairs},
          {"targets", targets},
          {"step_s", t},
          {"step_s_all", r.step_s},
          {"fwd_bwd_s", median(r.fb_s)},
          {"optimizer_s", median(r.opt_s)},
          {"tokens_per_s", n_tree / t},
          {"packed_tokens_per_s", tokens / t},
          {"model_tflop", flops / 1e12},
          {"executed_tflop", executed / 1e12},
          {"model_tflops", flops / t / 1e12},
          {"mfu", flops / (tt::trainer::kPeakFlops * t)},
          {"loss", r.loss}};
}

// One profiled forward_backward of `b` after an unprofiled warm-up (whose GEMM winners are
// adopted for the profiled run): GPU time per op class (m built with CudaExecOptions::profile).
inline tt::model::CudaProfile profiled_step(tt::model::CudaModel& m, const tt::data::PackedBatch& b, double loss_scale) {
  m.zero_grad();
  m.forward_backward(b, loss_scale);
  if (std::vector<tt::cuda::GemmTuned> won = m.exec().gemm().take_pending(); !won.empty()) {
    std::vector<tt::cuda::GemmTuned> table = m.exec().gemm().tuned();
    table.insert(table.end(), won.begin(), won.end());
    m.exec().gemm().set_tuned(table);
  }
  m.exec().take_profile();
  m.forward_backward(b, loss_scale);
  return m.exec().take_profile();
}

}  // namespace tt::bench
