// Model<T>: parameter table, initialisation, forward against a dense causal reference written
// here from the Hugging Face definitions, and every parameter's gradient against central
// finite differences, in fp64, for qwen3 / llama with tied and untied embeddings.
#include "model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/config.h"
#include "base/check.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::chain_batch;
using testing::tiny_config;
using testing::tree_batch;

struct Variant {
  std::string arch;
  bool tied;
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& i) {
  return i.param.arch + (i.param.tied ? "_tied" : "_untied");
}

// Initialised with a non-trivial scale, norm weights moved away from 1 so their gradients and the
// rmsnorm weight paths are exercised.
void init_for_test(Model<double>& m, uint64_t seed) {
  m.init(seed);
  std::mt19937_64 rng(seed + 17);
  std::uniform_real_distribution<double> u(-0.2, 0.2);
  for (const ParamInfo& p : m.params_info()) {
    if (p.shape.size() != 1) continue;
    for (int64_t i = 0; i < p.numel; ++i) m.params()[p.offset + i] += u(rng);
  }
}

// ---------------------------------------------------------------------------------------------
// Dense causal reference: one sequence, HF Llama/Qwen3 semantics, plain loops in fp64.

using Mat = std::vector<double>;  // row-major

Mat linear(const Mat& x, const double* w, int T, int IC, int OC) {  // x (T, IC) @ w (OC, IC)^T
  Mat y((size_t)T * OC, 0.0);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < OC; ++o) {
      double s = 0;
      for (int i = 0; i < IC; ++i) s += x[(size_t)t * IC + i] * w[(size_t)o * IC + i];
      y[(size_t)t * OC + o] = s;
    }
  return y;
}

Mat rms(const Mat& x, const double* w, int rows, int C, double eps) {
  Mat y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[(size_t)r * C + c] * x[(size_t)r * C + c];
    const double inv = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) y[(size_t)r * C + c] = x[(size_t)r * C + c] * inv * w[c];
  }
  return y;
}

void rotate_half(Mat& x, int T, int H, int HS, double theta) {  // position = row index
  const int half = HS / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      double* v = &x[((size_t)t * H + h) * HS];
      for (int d = 0; d < half; ++d) {
        const double a = t * std::pow(theta, -2.0 * d / HS);
        const double x1 = v[d], x2 = v[d + half];
        v[d] = x1 * std::cos(a) - x2 * std::sin(a);
        v[d + half] = x2 * std::cos(a) + x1 * std::sin(a);
      }
    }
}

// Logits (T, V) of a causal LM over `tokens` with the model's parameters.
Mat reference_logits(Model<double>& m, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = m.config();
  const int T = (int)tokens.size(), C = (int)c.hidden_size, V = (int)c.vocab_size;
  const int I = (int)c.intermediate_size, NH = (int)c.num_attention_heads;
  const int NKV = (int)c.num_key_value_heads, HS = (int)c.head_dim;
  const double eps = c.rms_norm_eps;
  auto P = [&](const std::string& n) { return (const double*)m.param(n); };
  Mat x((size_t)T * C);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < C; ++i) x[(size_t)t * C + i] = P("model.embed_tokens.weight")[(size_t)tokens[t] * C + i];
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    const Mat n1 = rms(x, P(pre + "input_layernorm.weight"), T, C, eps);
    Mat q = linear(n1, P(pre + "self_attn.q_proj.weight"), T, C, NH * HS);
    Mat k = linear(n1, P(pre + "self_attn.k_proj.weight"), T, C, NKV * HS);
    const Mat v = linear(n1, P(pre + "self_attn.v_proj.weight"), T, C, NKV * HS);
    if (c.qk_norm()) {
      q = rms(q, P(pre + "self_attn.q_norm.weight"), T * NH, HS, eps);
      k = rms(k, P(pre + "self_attn.k_norm.weight"), T * NKV, HS, eps);
    }
    rotate_half(q, T, NH, HS, c.rope_theta);
    rotate_half(k, T, NKV, HS, c.rope_theta);
    Mat att((size_t)T * NH * HS, 0.0);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        const int g = h / (NH / NKV);
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int e = 0; e < HS; ++e) d += q[((size_t)t * NH + h) * HS + e] * k[((size_t)j * NKV + g) * HS + e];
          s[j] = d / std::sqrt((double)HS);
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= t; ++j)
          for (int e = 0; e < HS; ++e)
            att[((size_t)t * NH + h) * HS + e] += s[j] / z * v[((size_t)j * NKV + g) * HS + e];
      }
    const Mat o = linear(att, P(pre + "self_attn.o_proj.weight"), T, NH * HS, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const Mat n2 = rms(x, P(pre + "post_attention_layernorm.weight"), T, C, eps);
    const Mat gate = linear(n2, P(pre + "mlp.gate_proj.weight"), T, C, I);
    const Mat up = linear(n2, P(pre + "mlp.up_proj.weight"), T, C, I);
    Mat hmid(gate.size());
    for (size_t i = 0; i < gate.size(); ++i) hmid[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    const Mat down = linear(hmid, P(pre + "mlp.down_proj.weight"), T, I, C);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const Mat nf = rms(x, P("model.norm.weight"), T, C, eps);
  return linear(nf, P(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"), T, C, V);
}

// ---------------------------------------------------------------------------------------------

TEST(ParamTable, Qwen3UntiedNamesShapesOffsets) {
  const ModelConfig c = tiny_config("qwen3", false);
  const std::vector<ParamInfo> t = param_table(c);
  ASSERT_EQ(t.size(), 1u + 2 * 11 + 1 + 1);
  EXPECT_EQ(t[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(t[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(t[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(t[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(t[5].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(t[5].shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(t[6].name, "model.layers.0.self_attn.q_norm.weight");
  EXPECT_EQ(t[6].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(t[7].name, "model.layers.0.self_attn.k_norm.weight");
  EXPECT_EQ(t[8].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(t[9].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(t[9].shape, (std::vector<int64_t>{12, 8}));
  EXPECT_EQ(t[11].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(t[11].shape, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(t[23].name, "model.norm.weight");
  EXPECT_EQ(t[24].name, "lm_head.weight");
  EXPECT_EQ(t[24].shape, (std::vector<int64_t>{11, 8}));
  int64_t off = 0;
  for (const ParamInfo& p : t) {
    EXPECT_EQ(p.offset, off) << p.name;
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    EXPECT_EQ(p.numel, n) << p.name;
    EXPECT_EQ(p.decay, p.shape.size() == 2) << p.name;
    off += n;
  }
  EXPECT_EQ(Model<float>(c).num_params(), off);
}

TEST(ParamTable, LlamaTiedHasNoQkNormNorLmHead) {
  const std::vector<ParamInfo> t = param_table(tiny_config("llama", true));
  ASSERT_EQ(t.size(), 1u + 2 * 9 + 1);
  for (const ParamInfo& p : t) {
    EXPECT_EQ(p.name.find("q_norm"), std::string::npos);
    EXPECT_NE(p.name, "lm_head.weight");
  }
  EXPECT_EQ(t.back().name, "model.norm.weight");
}

TEST(ModelParam, UnknownNameThrows) {
  Model<double> m(tiny_config("llama", true));
  EXPECT_NO_THROW(m.param("model.norm.weight"));
  try {
    m.param("lm_head.weight");
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
}

TEST(ModelInit, DeterministicPerSeedAndName) {
  ModelConfig c = tiny_config("qwen3", false);
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.initializer_range = 0.02;
  Model<double> a(c), b(c), d(c);
  Model<float> f(c);
  a.init(1234);
  b.init(1234);
  d.init(1235);
  f.init(1234);
  for (int64_t i = 0; i < a.num_params(); ++i) {
    ASSERT_EQ(a.params()[i], b.params()[i]) << i;
    ASSERT_EQ(f.params()[i], (float)a.params()[i]) << i;
  }
  int64_t differ = 0;
  for (int64_t i = 0; i < a.num_params(); ++i) differ += a.params()[i] != d.params()[i];
  for (const ParamInfo& p : a.params_info()) {
    const double* w = a.params() + p.offset;
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(w[i], 1.0) << p.name;
      continue;
    }
    if (p.numel < 10000) continue;
    // Sample std of n normals: relative standard error 1/sqrt(2n) < 0.8%; 5% is > 6 sigma.
    double s = 0, ss = 0;
    for (int64_t i = 0; i < p.numel; ++i) s += w[i], ss += w[i] * w[i];
    const double mean = s / p.numel, sd = std::sqrt(ss / p.numel - mean * mean);
    EXPECT_NEAR(sd, 0.02, 0.05 * 0.02) << p.name;
    EXPECT_NEAR(mean, 0.0, 6 * 0.02 / std::sqrt((double)p.numel)) << p.name;
  }
  // Different seeds: every matrix entry differs (norm weights are all ones in both).
  int64_t matrix_entries = 0;
  for (const ParamInfo& p : a.params_info())
    if (p.shape.size() > 1) matrix_entries += p.numel;
  EXPECT_EQ(differ, matrix_entries);
  // Tensors of the same shape get different streams.
  EXPECT_NE(a.param("model.layers.0.mlp.gate_proj.weight")[0], a.param("model.layers.0.mlp.up_proj.weight")[0]);
}

class ModelVariant : public ::testing::TestWithParam<Variant> {};

// The tree batch's logits equal, row by row, a dense causal model run on each root-to-leaf
// path; the loss equals the weighted cross-entropy of those logits. fp64: bound 1e-10 relative.
TEST_P(ModelVariant, TreeForwardMatchesDenseCausalPerPath) {
  const ModelConfig c = tiny_config(GetParam().arch, GetParam().tied);
  Model<double> m(c);
  init_for_test(m, 7);
  const testing::TreeBatch tb = tree_batch();
  const data::PackedBatch& b = tb.batch;
  const double loss = m.forward(b, 0.7);
  const std::vector<double> logits = m.infer(b, InferRequest::all_logits()).logits;
  const int V = (int)c.vocab_size;
  std::vector<double> ref_logits((size_t)b.n_tokens * V);
  for (const std::vector<int>& rows : tb.path_rows) {
    std::vector<int32_t> toks;
    for (int r : rows) toks.push_back(b.tokens[r]);
    const Mat ref = reference_logits(m, toks);
    for (size_t t = 0; t < rows.size(); ++t)
      for (int v = 0; v < V; ++v) ref_logits[(size_t)rows[t] * V + v] = ref[t * V + v];
  }
  for (int i = 0; i < b.n_tokens * V; ++i)
    ASSERT_NEAR(logits[i], ref_logits[i], 1e-10 * std::max(1.0, std::fabs(ref_logits[i]))) << "entry " << i;
  double ref_loss = 0;
  for (size_t t = 0; t < b.tgt_src.size(); ++t) {
    const double* row = &ref_logits[(size_t)b.tgt_src[t] * V];
    double mx = *std::max_element(row, row + V), z = 0;
    for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    ref_loss += b.tgt_w[t] * (mx + std::log(z) - row[b.tgt_tok[t]]);
  }
  EXPECT_NEAR(loss, 0.7 * ref_loss, 1e-10 * std::fabs(ref_loss));
}

// Every parameter tensor's gradient (up to 20 sampled entries each) against central differences.
// Bound: |fd - analytic| <= 1e-6 |analytic| + 1e-9; the absolute floor is the finite-difference
// round-off, about eps_64 * |loss| / h = 1e-16 * 10 / 1e-5 = 1e-10.
TEST_P(ModelVariant, GradientsMatchFiniteDifferences) {
  const ModelConfig c = tiny_config(GetParam().arch, GetParam().tied);
  Model<double> m(c);
  init_for_test(m, 11);
  const data::PackedBatch b = tree_batch().batch;
  const double scale = 0.7;
  m.zero_grad();
  m.forward(b, scale);
  m.backward();
  const std::vector<double> grad(m.grads(), m.grads() + m.num_params());

  std::mt19937_64 rng(5);
  const double h = 1e-5;
  int checked = 0;
  for (const ParamInfo& p : m.params_info()) {
    std::vector<int64_t> idx(p.numel);
    for (int64_t i = 0; i < p.numel; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(std::min<int64_t>(p.numel, 20));
    double max_abs = 0;
    for (int64_t i : idx) {
      double& w = m.params()[p.offset + i];
      const double w0 = w;
      w = w0 + h;
      const double lp = m.forward(b, scale);
      w = w0 - h;
      const double lm = m.forward(b, scale);
      w = w0;
      const double fd = (lp - lm) / (2 * h);
      const double an = grad[p.offset + i];
      EXPECT_NEAR(an, fd, 1e-6 * std::fabs(an) + 1e-9) << p.name << "[" << i << "]";
      max_abs = std::max(max_abs, std::fabs(an));
      ++checked;
    }
    // Every tensor takes part in the loss: at least one sampled entry has a real gradient.
    if (p.name != "model.embed_tokens.weight") {
      EXPECT_GT(max_abs, 1e-4) << p.name;
    }
  }
  EXPECT_GT(checked, 100);
  // An embedding row has a gradient exactly when its token sits at a row that some target's
  // source row sees (key r is visible from query i when r <= i < subtree_end[r]); the tokens at
  // leaf ends (rows 6, 8, 10) reach no loss. Tied, every row is also an LM-head row.
  const ParamInfo& emb = m.params_info()[0];
  for (int v = 0; v < c.vocab_size; ++v) {
    bool used = false;
    for (int r = 0; r < b.n_tokens; ++r)
      for (int32_t src : b.tgt_src) used |= b.tokens[r] == v && r <= src && src < b.subtree_end[r];
    double s = 0;
    for (int i = 0; i < c.hidden_size; ++i) s += std::fabs(grad[emb.offset + v * c.hidden_size + i]);
    if (used || c.tie_word_embeddings) {
      EXPECT_GT(s, 0) << "row " << v;
    } else {
      EXPECT_EQ(s, 0) << "row " << v;
    }
  }
}

// backward() accumulates: a second call adds the same gradient again. Exact (x + x = 2x) except
// for tied embeddings, whose two contributions are added in a different order: 1e-14 relative.
TEST_P(ModelVariant, BackwardAccumulates) {
  Model<double> m(tiny_config(GetParam().arch, GetParam().tied));
  init_for_test(m, 3);
  const data::PackedBatch b = tree_batch().batch;
  m.zero_grad();
  m.forward(b, 1.0);
  m.backward();
  const std::vector<double> g1(m.grads(), m.grads() + m.num_params());
  m.backward();
  const bool tied = m.config().tie_word_embeddings;
  for (int64_t i = 0; i < m.num_params(); ++i) {
    if (tied && i < m.params_info()[0].numel) {
      ASSERT_NEAR(m.grads()[i], 2 * g1[i], 1e-14 * std::fabs(g1[i])) << i;
    } else {
      ASSERT_EQ(m.grads()[i], 2 * g1[i]) << i;
    }
  }
}

// A single-node chain is a causal LM: changing token j leaves rows < j bit-identical and changes
// row j; and it matches the dense reference.
TEST_P(ModelVariant, ChainIsCausal) {
  const ModelConfig c = tiny_config(GetParam().arch, GetParam().tied);
  Model<double> m(c);
  init_for_test(m, 5);
  const std::vector<int32_t> toks = {1, 4, 1, 5, 9, 2, 6, 5};
  const int V = (int)c.vocab_size, T = (int)toks.size();
  const data::PackedBatch b0 = chain_batch(toks);
  const std::vector<double> l0 = m.infer(b0, InferRequest::all_logits()).logits;
  const Mat ref = reference_logits(m, toks);
  for (int i = 0; i < T * V; ++i) ASSERT_NEAR(l0[i], ref[i], 1e-10 * std::max(1.0, std::fabs(ref[i])));
  for (int j = 0; j < T; ++j) {
    std::vector<int32_t> t2 = toks;
    t2[j] = (t2[j] + 3) % V;
    const data::PackedBatch b1 = chain_batch(t2);
    const std::vector<double> l1 = m.infer(b1, InferRequest::all_logits()).logits;
    for (int i = 0; i < j * V; ++i) ASSERT_EQ(l1[i], l0[i]) << "changed token " << j;
    double diff = 0;
    for (int i = j * V; i < (j + 1) * V; ++i) diff += std::fabs(l1[i] - l0[i]);
    EXPECT_GT(diff, 0) << "row " << j;
  }
}

// The float model follows the double one: relative 1e-4 (fp32 against fp64).
TEST_P(ModelVariant, FloatMatchesDouble) {
  const ModelConfig c = tiny_config(GetParam().arch, GetParam().tied);
  Model<double> md(c);
  init_for_test(md, 9);
  Model<float> mf(c);
  for (int64_t i = 0; i < md.num_params(); ++i) mf.params()[i] = (float)md.params()[i];
  for (int64_t i = 0; i < md.num_params(); ++i) md.params()[i] = mf.params()[i];
  const data::PackedBatch b = tree_batch().batch;
  md.zero_grad();
  mf.zero_grad();
  const double ld = md.forward(b, 1.0), lf = mf.forward(b, 1.0);
  EXPECT_NEAR(lf, ld, 1e-4 * std::fabs(ld));
  md.backward();
  mf.backward();
  double gmax = 0;
  for (int64_t i = 0; i < md.num_params(); ++i) gmax = std::max(gmax, std::fabs(md.grads()[i]));
  for (int64_t i = 0; i < md.num_params(); ++i)
    ASSERT_NEAR(mf.grads()[i], md.grads()[i], 1e-4 * gmax) << i;
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelVariant,
                         ::testing::Values(Variant{"qwen3", false}, Variant{"qwen3", true},
                                           Variant{"llama", false}, Variant{"llama", true}),
                         variant_name);

TEST(ModelForward, RejectsBadBatch) {
  Model<double> m(tiny_config("qwen3", false));
  m.init(1);
  data::PackedBatch b = tree_batch().batch;
  b.tokens[3] = 11;  // == vocab_size
  EXPECT_THROW(m.forward(b, 1.0), Error);
  b = tree_batch().batch;
  b.node_len[1] = 3;  // nodes no longer tile the batch
  EXPECT_THROW(m.forward(b, 1.0), Error);
  b = tree_batch().batch;
  b.tgt_src[0] = 11;
  EXPECT_THROW(m.forward(b, 1.0), Error);
}

TEST(ModelForward, BatchSizeChangesReuseBuffers) {
  Model<double> m(tiny_config("qwen3", false));
  init_for_test(m, 2);
  const data::PackedBatch big = tree_batch().batch;
  const data::PackedBatch small = chain_batch({1, 2, 3});
  const double l_small = m.forward(small, 1.0);
  m.zero_grad();
  m.backward();
  const std::vector<double> g_small(m.grads(), m.grads() + m.num_params());
  m.forward(big, 1.0);
  m.backward();
  m.zero_grad();
  EXPECT_EQ(m.forward(small, 1.0), l_small);
  m.backward();
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m.grads()[i], g_small[i]) << i;
}

}  // namespace
}  // namespace tt::model
