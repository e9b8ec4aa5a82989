// Times the CPU tree attention forward and backward on training-sized batches (float, N = 4096,
// NH = 4, NKV = 2, HS = 32): a forest of branching trees and two long single-node sequences
// (the causal worst case), with the OpenMP threads of the environment.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "ops/cpu/attention.h"

namespace {

struct Layout {
  std::vector<int32_t> start, len, parent;
};

// Trees of `nodes` nodes with random parents (already in DFS order when each node's parent is
// the previous node or one of its ancestors) and `tokens` tokens each.
Layout forest(std::mt19937_64& rng, int trees, int nodes, int tokens) {
  Layout L;
  int pos = 0;
  for (int t = 0; t < trees; t++) {
    const int base = (int)L.start.size();
    std::vector<int> path;  // ancestors of the next node, root first
    for (int n = 0; n < nodes; n++) {
      const int len = tokens / nodes + (n < tokens % nodes ? 1 : 0);
      if (!path.empty()) path.resize(std::uniform_int_distribution<int>(1, (int)path.size())(rng));
      L.parent.push_back(path.empty() ? -1 : path.back());
      L.start.push_back(pos);
      L.len.push_back(len);
      path.push_back(base + n);
      pos += len;
    }
  }
  return L;
}

}  // namespace

int main() {
  const int N = 4096, NH = 4, NKV = 2, HS = 32, reps = 3;
  std::mt19937_64 rng(0);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> q((size_t)N * NH * HS), k((size_t)N * NKV * HS), v(k.size()), out(q.size()),
      lse((size_t)N * NH), dq(q.size()), dk(k.size()), dv(k.size());
  for (auto* x : {&q, &k, &v}) {
    for (float& e : *x) e = dist(rng);
  }
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
  std::printf("threads %d  N %d NH %d NKV %d HS %d float\n", omp_get_max_threads(), N, NH, NKV, HS);
  const Layout cases[] = {forest(rng, 16, 24, N / 16), forest(rng, 2, 1, N / 2)};
  const char* names[] = {"16 trees x 24 nodes", "2 sequences x 2048"};
  for (int c = 0; c < 2; c++) {
    const Layout& L = cases[c];
    const tt::cpu::AttnLayout view{(int)L.start.size(), L.start.data(), L.len.data(), L.parent.data()};
    const double fwd = time([&] {
      tt::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), view,
                                 (const tt::cpu::ExternalKV<float>*)nullptr, 0, N, NH, NKV, HS);
    });
    const double bwd = time([&] {
      tt::cpu::attention_backward(dq.data(), dk.data(), dv.data(), out.data(), out.data(), lse.data(), q.data(),
                                  k.data(), v.data(), view, (const tt::cpu::ExternalKV<float>*)nullptr, 0, N, NH,
                                  NKV, HS);
    });
    std::printf("%-22s forward %7.4f s  backward %7.4f s\n", names[c], fwd, bwd);
  }
  return 0;
}
