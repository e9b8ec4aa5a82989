#include "trainer/schedule.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace tt::trainer {

double lr_at(const RunConfig& cfg, int64_t step) {
  const double lr = cfg.optim.lr;
  const int64_t warmup = cfg.schedule.warmup_steps;
  const int64_t total = cfg.train.max_steps;
  const double r = cfg.schedule.min_lr_ratio;
  if (step <= warmup) return lr * (double)std::max<int64_t>(step, 0) / (double)warmup;
  const double p =
      total > warmup ? std::min(1.0, (double)(step - warmup) / (double)(total - warmup)) : 1.0;
  const std::string& decay = cfg.schedule.decay;
  if (decay == "cosine") return lr * (r + (1.0 - r) * 0.5 * (1.0 + std::cos(M_PI * p)));
  if (decay == "linear") return lr * (1.0 - (1.0 - r) * p);
  if (decay == "constant") return lr;
  throw Error(str("schedule.decay: expected one of cosine|linear|constant, got '", decay, "'"));
}

}  // namespace tt::trainer
