// Benchmark of the CUDA tree attention; see attention_bench.h.
#include "trainer/attention_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "data/tree.h"
#include "base/check.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/check.h"
#include "ops/cuda/memory.h"

namespace tt::trainer {
namespace {

using cuda::bf16;
using cuda::DeviceBuffer;

constexpr size_t kFillBlock = size_t(1) << 22;  // random elements generated on the host per fill

// A tree of the given shape with no targets (the benchmark needs only its layout): tokens follow
// a simple pattern, one path per leaf.
data::Tree make_tree(const std::string& id, const std::vector<int>& parent, const std::vector<int>& len) {
  const int n = (int)parent.size();
  data::Tree t;
  t.id = id;
  std::vector<int64_t> end_depth(n);
  std::vector<bool> has_child(n, false);
  for (int i = 0; i < n; i++) {
    data::Node nd;
    nd.parent = parent[i];
    nd.tokens.resize(len[i]);
    for (int j = 0; j < len[i]; j++) nd.tokens[j] = 1 + (i * 31 + j) % 250;
    nd.target_weight.assign(len[i], 0.0);
    nd.target_count.assign(len[i], 0);
    t.nodes.push_back(std::move(nd));
    end_depth[i] = (parent[i] >= 0 ? end_depth[parent[i]] : 0) + len[i];
    if (parent[i] >= 0) has_child[parent[i]] = true;
  }
  for (int i = 0; i < n; i++) {
    if (has_child[i]) continue;
    data::Path p;
    p.end_node = i;
    p.target_weight.assign(end_depth[i], 0.0);
    t.paths.push_back(std::move(p));
  }
  return t;
}

// dst (n) = uniform values of unit variance, as bf16: one host block uploaded, then replicated.
void fill_random(bf16* dst, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.7320508f, 1.7320508f);
  const size_t b = std::min(n, kFillBlock);
  std::vector<bf16> h(b);
  for (auto& x : h) x = cuda::host_float_to_bf16(dist(rng));
  TT_CUDA_CHECK(cudaMemcpy(dst, h.data(), b * sizeof(bf16), cudaMemcpyHostToDevice));
  for (size_t done = b; done < n;) {
    const size_t c = std::min(done, n - done);
    TT_CUDA_CHECK(cudaMemcpy(dst + done, dst, c * sizeof(bf16), cudaMemcpyDeviceToDevice));
    done += c;
  }
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

void write_npy_i32(const std::string& path, const std::vector<int32_t>& x) {
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(x.size()) + ",), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  TT_CHECK(f.good(), "dump_layout_npy: cannot write ", path);
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const uint16_t hl = (uint16_t)header.size();
  const unsigned char len_le[2] = {(unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
  f.write(reinterpret_cast<const char*>(len_le), 2);
  f.write(header.data(), (std::streamsize)header.size());
  f.write(reinterpret_cast<const char*>(x.data()), (std::streamsize)(x.size() * sizeof(int32_t)));
  TT_CHECK(f.good(), "dump_layout_npy: write failed for ", path);
}

}  // namespace

data::Tree episode_comb_tree(int prefix_len, int steps, int history_len, int leaf_len) {
  std::vector<int> parent = {-1}, len = {prefix_len};
  int trunk = 0;
  for (int s = 0; s < steps; s++) {
    parent.push_back(trunk);
    len.push_back(history_len);
    trunk = (int)parent.size() - 1;
    parent.push_back(trunk);
    len.push_back(leaf_len);
  }
  return make_tree("episode_comb", parent, len);
}

data::Tree agent_rollout_tree(int prompt_len, int turns, int turn_len, int branches, int branch_turns, int jitter,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dj(-jitter, jitter);
  std::vector<int> parent = {-1}, len = {prompt_len};
  std::vector<int> frontier = {0};
  for (int turn = 0; turn < turns; turn++) {
    const int fan = turn < branch_turns ? branches : 1;
    std::vector<int> next;
    for (int f : frontier)
      for (int b = 0; b < fan; b++) {
        parent.push_back(f);
        len.push_back(std::max(1, turn_len + dj(rng)));
        next.push_back((int)parent.size() - 1);
      }
    frontier = next;
  }
  return make_tree("agent_rollout", parent, len);
}

data::Tree causal_tree(int n) { return make_tree("causal", {-1}, {n}); }

data::Tree comb_short_tree() { return episode_comb_tree(1024, 200, 24, 40); }

data::Tree trunk_tree(int max_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> trunk_len(5, 40), leaf_len(8, 24), one_in(0, 9);
  std::vector<int> parent = {-1}, len = {trunk_len(rng)};
  int trunk = 0, total = len[0];
  while (true) {
    const int t = one_in(rng) == 0 ? 1 : trunk_len(rng), l = leaf_len(rng);
    if (total + t + l > max_tokens) break;
    parent.push_back(trunk);
    len.push_back(t);
    trunk = (int)parent.size() - 1;
    parent.push_back(trunk);
    len.push_back(l);
    total += t + l;
  }
  return make_tree("trunk", parent, len);
}

data::Tree workload_tree(const std::string& name, int n) {
  if (name == "comb") return episode_comb_tree();
  if (name == "rollout") return agent_rollout_tree();
  if (name == "agent_short") return agent_rollout_tree(4096, 6, 160, 4, 2, 0, 1);
  if (name == "causal") return causal_tree(n);
  if (name == "comb_short") return comb_short_tree();
  if (name == "trunk") return trunk_tree();
  throw Error(str("attention_bench: --workload ", name,
                  ", expected comb, rollout, agent_short, causal, comb_short or trunk"));
}

data::PackedBatch pack_one(const data::Tree& tree, data::ChildOrder order) {
  return data::pack({&tree}, data::Packing::kTree, order);
}

double tile_occupancy(const data::PackedBatch& batch, int bm, int bn) {
  const int N = batch.n_tokens;
  TT_CHECK(bm > 0 && bn > 0, "tile_occupancy: expected positive tile sizes, got ", bm, " x ", bn);
  if (N == 0) return 1.0;
  const int nq = (N + bm - 1) / bm, nk = (N + bn - 1) / bn;
  int64_t tiles = 0;
  std::vector<char> hit(nq);
  for (int kb = 0; kb < nk; kb++) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = kb * bn; j < std::min(N, (kb + 1) * bn); j++) {
      // Key j is seen by queries [j, subtree_end[j]): mark the query tiles that interval touches.
      const int q_end = batch.subtree_end[j];
      for (int qb = j / bm; qb * bm < q_end; qb++) hit[qb] = 1;
    }
    for (int qb = 0; qb < nq; qb++) tiles += hit[qb];
  }
  return (double)batch.visible_pairs / ((double)tiles * bm * bn);
}

void dump_layout_npy(const data::PackedBatch& batch, const std::string& prefix) {
  write_npy_i32(prefix + "subtree_end.npy", batch.subtree_end);
  write_npy_i32(prefix + "pos.npy", batch.pos);
}

AttentionBenchResult bench_attention(const data::PackedBatch& batch, const std::string& workload,
                                     const AttentionBenchOptions& opt) {
  const int N = batch.n_tokens, NH = opt.heads, NKV = opt.kv_heads, HS = opt.head_dim;
  TT_CHECK(N > 0, "bench_attention: empty batch");
  TT_CHECK(opt.iters > 0 && opt.warmup >= 0, "bench_attention: iters=", opt.iters, " warmup=", opt.warmup);
  if (std::string why; cuda::visible_devices(&why) == 0)
    throw Error(str("bench attention times the CUDA kernels, but no CUDA device is visible (", why, ")"));
  const size_t nq = (size_t)N * NH * HS, nk = (size_t)N * NKV * HS;
  DeviceBuffer<bf16> q(nq), k(nk), v(nk), dout(nq), out(nq), dq(nq), dk(nk), dv(nk);
  DeviceBuffer<float> lse((size_t)N * NH);
  fill_random(q.data(), nq, opt.seed);
  fill_random(k.data(), nk, opt.seed + 1);
  fill_random(v.data(), nk, opt.seed + 2);
  fill_random(dout.data(), nq, opt.seed + 3);

  cudaStream_t stream;
  TT_CUDA_CHECK(cudaStreamCreate(&stream));
  DeviceBuffer<int32_t> subtree_end(N);
  subtree_end.copy_from_host(batch.subtree_end);
  DeviceBuffer<char> tile_storage(cuda::tree_tiles_bytes(N));
  const cuda::TreeTiles tiles =
      cuda::build_tree_tiles(subtree_end.data(), N, cuda::Workspace{tile_storage.data(), tile_storage.size()}, stream);
  DeviceBuffer<char> ws(cuda::attention_backward_workspace_bytes(N, NH, HS));
  const cuda::Workspace workspace{ws.data(), ws.size()};

  auto fwd = [&] {
    cuda::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), tiles, nullptr, 0, N, NH, NKV, HS,
                            stream);
  };
  auto bwd = [&] {
    cuda::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(), q.data(), k.data(),
                             v.data(), tiles, nullptr, 0, N, NH, NKV, HS, workspace, stream);
  };
  for (int i = 0; i < opt.warmup; i++) {
    fwd();
    bwd();
  }
  TT_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaEvent_t e0, e1, e2;
  TT_CUDA_CHECK(cudaEventCreate(&e0));
  TT_CUDA_CHECK(cudaEventCreate(&e1));
  TT_CUDA_CHECK(cudaEventCreate(&e2));
  std::vector<double> tf, tb, tt;
  for (int i = 0; i < opt.iters; i++) {
    TT_CUDA_CHECK(cudaEventRecord(e0, stream));
    fwd();
    TT_CUDA_CHECK(cudaEventRecord(e1, stream));
    bwd();
    TT_CUDA_CHECK(cudaEventRecord(e2, stream));
    TT_CUDA_CHECK(cudaEventSynchronize(e2));
    float a = 0, b = 0;
    TT_CUDA_CHECK(cudaEventElapsedTime(&a, e0, e1));
    TT_CUDA_CHECK(cudaEventElapsedTime(&b, e1, e2));
    tf.push_back(a);
    tb.push_back(b);
    tt.push_back(a + b);
  }
  TT_CUDA_CHECK(cudaEventDestroy(e0));
  TT_CUDA_CHECK(cudaEventDestroy(e1));
  TT_CUDA_CHECK(cudaEventDestroy(e2));
  TT_CUDA_CHECK(cudaStreamDestroy(stream));

  AttentionBenchResult r;
  r.workload = workload;
  r.n = N;
  r.heads = NH;
  r.kv_heads = NKV;
  r.head_dim = HS;
  r.trees = batch.num_trees();
  r.nodes = batch.num_nodes();
  r.visible_pairs = batch.visible_pairs;
  r.fwd_ms = median(tf);
  r.bwd_ms = median(tb);
  r.total_ms = median(tt);
  const double flop_per_pair = (double)HS * NH;
  auto tflops = [&](double per_pair, double ms) { return per_pair * flop_per_pair * r.visible_pairs / (ms * 1e-3) / 1e12; };
  r.fwd_tflops = tflops(4, r.fwd_ms);
  r.bwd_tflops = tflops(10, r.bwd_ms);
  r.total_tflops = tflops(14, r.total_ms);
  r.fwd_occupancy = tile_occupancy(batch, 128, 128);
  r.bwd_occupancy = tile_occupancy(batch, 64, 128);
  return r;
}

std::string to_json(const AttentionBenchResult& r) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "{\"workload\": \"%s\", \"n\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"trees\": %d, "
                "\"nodes\": %d, \"visible_pairs\": %lld, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"total_ms\": %.4f, "
                "\"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f, \"total_tflops\": %.1f, \"fwd_occupancy\": %.4f, "
                "\"bwd_occupancy\": %.4f}",
                r.workload.c_str(), r.n, r.heads, r.kv_heads, r.head_dim, r.trees, r.nodes, (long long)r.visible_pairs,
                r.fwd_ms, r.bwd_ms, r.total_ms, r.fwd_tflops, r.bwd_tflops, r.total_tflops, r.fwd_occupancy,
                r.bwd_occupancy);
  return buf;
}

}  // namespace tt::trainer
