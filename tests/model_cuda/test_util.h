// Shared pieces of the CUDA decoder tests: small configs, random prefix trees read through the
// real tree reader (data::parse_tree_line) and packed by data::pack, and the tolerance rule.
//
// Tolerance rule (one rule for every gradient comparison): per parameter tensor, the relative L2
// error ||g_gpu - g_ref|| / ||g_ref|| < grad_bound(L), where g_ref is the fp64 CPU model
// (model::Model<double>) run on exactly the weights the GPU computes with (its bf16 copy).
// Derivation. bf16 keeps 8 significant bits, so round-to-nearest has unit roundoff u = 2^-8; a
// rounding's relative error is uniform in about [-u, u], standard deviation u / sqrt(3). Sums run
// in fp32 (cuBLASLt, the attention, the norms), whose error over the reduction lengths here
// (K <= 2^13 terms: K 2^-24 < 2^-11) stays below one bf16 rounding, so the bf16 roundings of
// stored tensors dominate. Along a gradient's path there are at most n_r(L) = 24 L + 5 of them:
// per layer 13 in the forward (n, q_pre, k_pre, q, k after the fused norm + RoPE, v, att, the
// residual, n, gate, up, h, the residual) and 11 in the backward (dh, dgate, dup, dx, datt, dq,
// dk, dv, dq_pre, dk_pre, dx), and 5 in the head (nf, logits, dlogits, dnf, dx). Independent
// roundings give a relative error with standard deviation sigma = sqrt(n_r / 3) u; the bound is
// 3 sigma: 0.049 for L = 2, 0.059 for L = 3. A wrong or missing gradient term (another layer's,
// piece's or target's contribution) is O(1). Measured on the H200: at most 2.3e-2 (q_norm/k_norm
// weights, whose gradient flows only through attention's dS = P (dP - D), where dP and D cancel).
// Loss: relative error < kLossRel = 5e-3 (the logits are rounded once to bf16 and the activations
// before them a few times; the loss averages over many targets).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/packing.h"
#include "data/reader.h"
#include "data/tree.h"
#include "model/config.h"
#include "model/decoder.h"
#include "ops/cuda/bf16.h"

namespace tt::model_cuda_test {

constexpr double kBf16U = 1.0 / 256;  // 2^-8
inline double grad_bound(int layers) { return 3.0 * std::sqrt((24.0 * layers + 5) / 3.0) * kBf16U; }
// The floor of the same-precision rule (expect_no_worse_than): the standard deviation of one bf16
// rounding's relative error for a significand uniform in [1, 2), u sqrt(E[1/m^2] / 3) = u / sqrt(6),
// about 1.6e-3. Below it two bf16 results of the same value cannot be ordered.
const double kOneRounding = kBf16U / std::sqrt(6.0);
constexpr double kLossRel = 5e-3;
// Logits (the no-grad forward) against the fp64 CPU decoder: relative L2 over all of them below
// 3 sqrt(n_r / 3) u with the forward's n_r = 13 L + 2 roundings (the layers' 13, nf and the logits).
inline double logit_bound(int layers) { return 3.0 * std::sqrt((13.0 * layers + 2) / 3.0) * kBf16U; }

// Hybrid decoders' logits: the forward's roundings, 18 a Gated DeltaNet layer (with its MLP; see
// hybrid_grad_bound), 15 a gated attention layer, 2 in the head.
inline double hybrid_logit_bound(int linear, int full) {
  return 3.0 * std::sqrt((18.0 * linear + 15.0 * full + 2) / 3.0) * kBf16U;
}

// Fails (not skips) without a device: these tests run on the GPU machine only (tags = ["gpu"]).
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess) << "no CUDA driver/device";
    ASSERT_GT(n, 0) << "no CUDA device";
  }
};

struct Shape {
  std::string name;
  std::string arch;
  int V, C, I, L, NH, NKV, HS;
  bool tied;
  int head_chunk_rows;  // LM-head rows per chunk (0: the default, one chunk here)
};

inline model::ModelConfig config_of(const Shape& s) {
  model::ModelConfig c;
  c.architecture = s.arch;
  c.vocab_size = s.V;
  c.hidden_size = s.C;
  c.intermediate_size = s.I;
  c.num_hidden_layers = s.L;
  c.num_attention_heads = s.NH;
  c.num_key_value_heads = s.NKV;
  c.head_dim = s.HS;
  c.tie_word_embeddings = s.tied;
  c.initializer_range = 0.05;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 4096;
  return c;
}

struct HybridShape {
  Shape base;
  int nk, nv, dk, dv;
};

// Layers: linear, full, linear (Qwen3.5's 3 : 1 pattern, shortened), RoPE on half the head.
inline model::ModelConfig hybrid_config_of(const HybridShape& h) {
  model::ModelConfig c = config_of(h.base);
  c.partial_rotary_factor = 0.5;
  c.layer_types = {"linear_attention", "full_attention", "linear_attention"};
  c.num_hidden_layers = 3;
  c.linear_num_key_heads = h.nk;
  c.linear_num_value_heads = h.nv;
  c.linear_key_head_dim = h.dk;
  c.linear_value_head_dim = h.dv;
  c.linear_conv_kernel_dim = 4;
  return c;
}

// A random tree in the tree JSONL format: a root with at least two children (a branch point),
// nodes of 1..max_len tokens (a quarter of them one token long), up to max_children children per
// node and max_depth nodes on a chain, random 0/1 loss masks (mostly 1) and node weights.
inline std::string random_tree_line(std::mt19937_64& rng, int vocab, int max_depth, int max_children, int max_len,
                                    int max_nodes, const std::string& id) {
  std::uniform_int_distribution<int> tok(0, vocab - 1), len(2, max_len), kids(0, max_children);
  std::uniform_real_distribution<double> u(0, 1);
  struct N {
    int parent, depth;
  };
  std::vector<N> nodes = {{-1, 1}};
  for (size_t i = 0; i < nodes.size() && (int)nodes.size() < max_nodes; ++i) {
    if (nodes[i].depth >= max_depth) continue;
    const int k = i == 0 ? std::max(2, kids(rng)) : kids(rng);
    for (int c = 0; c < k && (int)nodes.size() < max_nodes; ++c) nodes.push_back({(int)i, nodes[i].depth + 1});
  }
  std::ostringstream os;
  os << "{\"id\":\"" << id << "\",\"nodes\":[";
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int n = u(rng) < 0.25 ? 1 : len(rng);
    os << (i ? "," : "") << "{\"parent\":" << nodes[i].parent << ",\"tokens\":[";
    for (int t = 0; t < n; ++t) os << (t ? "," : "") << tok(rng);
    os << "],\"loss_mask\":[";
    for (int t = 0; t < n; ++t) os << (t ? "," : "") << (u(rng) < 0.8 ? 1 : 0);
    os << "],\"weight\":" << (0.5 + 1.5 * u(rng)) << "}";
  }
  os << "]}";
  return os.str();
}

inline std::vector<data::Tree> random_trees(uint64_t seed, int n_trees, int vocab, int max_depth = 5,
                                            int max_children = 3, int max_len = 24, int max_nodes = 24) {
  std::mt19937_64 rng(seed);
  std::vector<data::Tree> trees;
  for (int i = 0; i < n_trees; ++i) {
    const std::string id = "t" + std::to_string(i);
    trees.push_back(data::parse_tree_line(random_tree_line(rng, vocab, max_depth, max_children, max_len, max_nodes, id),
                                          "random:" + std::to_string(i + 1), vocab));
  }
  return trees;
}

inline data::PackedBatch pack_all(const std::vector<data::Tree>& trees, data::Packing packing) {
  std::vector<const data::Tree*> ptrs;
  for (const data::Tree& t : trees) ptrs.push_back(&t);
  return data::pack(ptrs, packing);
}

// The master weights of a seeded CPU init (fp32), loaded into the GPU model.
inline std::vector<float> init_master(const model::ModelConfig& cfg, uint64_t seed,
                                      const model::DecoderOptions& o = {}) {
  model::DecoderOptions co = o;
  co.head_chunk_bytes = 0;
  model::Model<float> m(cfg, co);
  m.init(seed);
  return std::vector<float>(m.params(), m.params() + m.num_params());
}

// The weights the GPU computes with: the fp32 master rounded to bf16.
inline std::vector<double> bf16_weights(const std::vector<float>& master) {
  std::vector<double> w(master.size());
  for (size_t i = 0; i < master.size(); ++i) w[i] = cuda::round_to_bf16(master[i]);
  return w;
}

// fp64 CPU reference: loss and gradients of `batch` with weights w.
struct Reference {
  double loss = 0;
  std::vector<double> grads;
};

inline Reference cpu_reference(const model::ModelConfig& cfg, const std::vector<double>& w,
                               const data::PackedBatch& batch, double loss_scale,
                               const model::DecoderOptions& options = {}) {
  model::DecoderOptions o = options;
  o.head_chunk_bytes = 0;  // the CPU's own default
  model::Model<double> m(cfg, o);
  std::copy(w.begin(), w.end(), m.params());
  m.zero_grad();
  Reference r;
  r.loss = m.forward(batch, loss_scale);
  m.backward();
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  return r;
}

template <class T>
double rel_l2(const T* got, const double* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = (double)got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

// The same rule for hybrid decoders (model/gdn.h): a Gated DeltaNet layer rounds more tensors to
// bf16 along a gradient's path than an attention layer's 24: forward n, qkv, z, b, a, the conv's
// u, qn, kn, g, beta, o, y and the residual (13) plus the MLP's n, gate, up, h and residual (5);
// backward dy, d_o, dz, dqn, dkn, dv, dg, dbeta, da, db, dq, dk, du, dqkv and dx (15) plus the
// MLP's dh, dgate, dup and dx (4): 37. Qwen3.5's gated attention adds the gate, the gated output
// and their two gradients to the 24: 28. The delta rule itself runs in fp32 (chunk sums of at most
// 64 + 128 terms, far below one bf16 rounding). n_r = 37 linear + 28 full + 5 (the head).
inline double hybrid_grad_bound(int linear, int full) {
  return 3.0 * std::sqrt((37.0 * linear + 28.0 * full + 5) / 3.0) * kBf16U;
}

// Checks every tensor against `bound` (the rule above); prints the worst tensors for the log.
inline void expect_grads_within(const std::vector<model::ParamInfo>& info, const std::vector<float>& got,
                                const std::vector<double>& ref, double bound, const std::string& what) {
  double worst = 0;
  std::string worst_name;
  for (const model::ParamInfo& p : info) {
    const double e = rel_l2(got.data() + p.offset, ref.data() + p.offset, p.numel);
    EXPECT_LT(e, bound) << what << ": gradient of " << p.name << " has relative L2 error " << e;
    if (!(e <= worst)) worst = e, worst_name = p.name;
  }
  std::printf("[ errors   ] %s: worst gradient rel L2 %.3e (%s), bound %.3e\n", what.c_str(), worst,
              worst_name.c_str(), bound);
}

inline void expect_grads_close(const std::vector<model::ParamInfo>& info, const std::vector<float>& got,
                               const std::vector<double>& ref, int layers, const std::string& what) {
  expect_grads_within(info, got, ref, grad_bound(layers), what);
}

// The same-precision rule: per tensor, `got` (e.g. the tree run) is no more than 2x as far from
// the fp64 reference as `baseline` (e.g. the per-path run, same bf16 precision), plus kOneRounding
// for tensors where both are within about one rounding of the reference.
inline void expect_no_worse_than(const std::vector<model::ParamInfo>& info, const std::vector<float>& got,
                                 const std::vector<float>& baseline, const std::vector<double>& ref,
                                 const std::string& what) {
  for (const model::ParamInfo& p : info) {
    const double e = rel_l2(got.data() + p.offset, ref.data() + p.offset, p.numel);
    const double b = rel_l2(baseline.data() + p.offset, ref.data() + p.offset, p.numel);
    EXPECT_LE(e, 2.0 * b + kOneRounding) << what << ": gradient of " << p.name << " has relative L2 error " << e
                                 << ", more than twice the same-precision baseline's " << b;
  }
}

inline void expect_loss_close(double got, double ref, const std::string& what) {
  const double e = std::abs(got - ref) / std::abs(ref);
  EXPECT_LT(e, kLossRel) << what << ": loss " << got << " vs fp64 reference " << ref;
  std::printf("[ errors   ] %s: loss %.8f vs %.8f, rel %.3e\n", what.c_str(), got, ref, e);
}

}  // namespace tt::model_cuda_test
