// The GEMM tuning table's entry (cuda::GemmHandle, gemm.h), in a header without CUDA so that
// the trainer's interface and its table file (trainer/gemm_tuning.h) can name it.
#pragma once

#include <array>
#include <cstdint>

namespace tt::cuda {

// One entry of the tuning table: the algorithm chosen for a bucket of shapes. key: m, n, k (each
// rounded up to gemm_tune_bucket, or exact when `exact`), op_a, op_b, out, the three pointer
// alignments, exact. An exact entry is written for a shape whose bucket's algorithm cuBLASLt
// refuses for it (cublasLtMatmulAlgoCheck), and is looked up before the bucket. algo: the bytes
// of cuBLASLt's cublasLtMatmulAlgo_t, which cuBLASLt documents as restorable with the same
// library version (gemm_tuning_signature names it with the GPU).
// step: the optimizer step whose GEMMs timed it (the trainer's tag; the entry takes effect from
// the next step, trainer/gemm_tuning.h).
struct GemmTuned {
  std::array<int64_t, 10> key{};
  std::array<uint64_t, 8> algo{};
  int64_t step = 0;
};

// The bucket of a GEMM dimension: x rounded up to the next of 2^e * {1, 1.25, 1.5, 1.75} (values
// up to 8 exact), so token counts within about 25% of each other share a tuned algorithm.
inline int64_t gemm_tune_bucket(int64_t x) {
  if (x <= 8) return x;
  int64_t base = 8;
  while (base * 2 < x) base *= 2;  // base < x <= 2 base
  for (int64_t step = 1; step < 4; ++step)
    if (x <= base + base * step / 4) return base + base * step / 4;
  return 2 * base;
}

}  // namespace tt::cuda
