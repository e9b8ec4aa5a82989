// Learning-rate schedule: linear warmup, then cosine, linear or constant decay.
//
// Steps are 1-based optimizer steps (the update being taken). For s <= warmup_steps:
// lr * s / warmup_steps. After warmup, with p = (s - warmup) / (max_steps - warmup) in [0, 1]:
//   cosine:   lr * (r + (1 - r) * (1 + cos(pi p)) / 2)
//   linear:   lr * (1 - (1 - r) p)
//   constant: lr
// where r = min_lr_ratio, so cosine and linear reach lr * min_lr_ratio at s = max_steps. With
// warmup_steps > max_steps (a warning, RunConfig::warnings) the run ends inside the warmup.
#pragma once

#include <cstdint>

#include "trainer/config.h"

namespace tt::trainer {

double lr_at(const RunConfig& cfg, int64_t step);

}  // namespace tt::trainer
