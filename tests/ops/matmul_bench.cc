// Times the CPU matmul forward and backward on a training-sized projection:
// x (4096, 256) @ w (768, 256)^T, float, with the OpenMP threads of the environment.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "ops/cpu/matmul.h"

int main() {
  const int N = 4096, IC = 256, OC = 768, reps = 10;
  std::mt19937_64 rng(0);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x((size_t)N * IC), w((size_t)OC * IC), out((size_t)N * OC), dx(x.size()), dw(w.size());
  for (float& e : x) e = dist(rng);
  for (float& e : w) e = dist(rng);
  // Best of reps after a warm-up: the least disturbed by other work on the machine.
  auto time = [&](auto fn) {
    fn();
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double flop = 2.0 * N * IC * OC;
  const double fwd = time([&] { tt::cpu::matmul_forward(out.data(), x.data(), w.data(), N, IC, OC); });
  const double bdx = time([&] { tt::cpu::matmul_backward(dx.data(), (float*)nullptr, out.data(), x.data(), w.data(), N, IC, OC); });
  const double bdw = time([&] { tt::cpu::matmul_backward((float*)nullptr, dw.data(), out.data(), x.data(), w.data(), N, IC, OC); });
  std::printf("threads %d  (%d x %d) @ (%d x %d)^T float\n", omp_get_max_threads(), N, IC, OC, IC);
  std::printf("forward      %7.4f s  %6.2f GFLOP/s\n", fwd, flop / fwd * 1e-9);
  std::printf("backward dx  %7.4f s  %6.2f GFLOP/s\n", bdx, flop / bdx * 1e-9);
  std::printf("backward dw  %7.4f s  %6.2f GFLOP/s\n", bdw, flop / bdw * 1e-9);
  return 0;
}
