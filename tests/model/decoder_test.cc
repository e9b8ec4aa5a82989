// The decoder loop itself (model/decoder.h), on the CPU backend in fp64:
//  - a decoder whose layers differ (q/k norm in some layers, not in others): its parameter table,
//    gradients against finite differences, and tree vs per-path equivalence;
//  - the no-grad forward: the training forward's loss and logits, no gradient touched;
//  - the carry: a batch that reads another batch's exported K/V rows as its carry gives the
//    logits and gradients of the two run as one sequence;
//  - the FLOP API against the trainer's former count;
//  - config errors: layer_types.
// Bounds: fp64 math against fp64 math, 1e-10 relative (the ops sum in fp64 in fixed orders; the
// split runs add the same terms in another order), exact where the computation is the same.
#include "model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "base/check.h"
#include "data/packing.h"
#include "data/reader.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::chain_batch;
using testing::tiny_config;
using testing::tree_batch;

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

double max_diff(const double* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Layer 0 with Qwen3's q/k norm, layer 1 without, layer 2 with.
std::vector<LayerSpec> mixed_layers() {
  std::vector<LayerSpec> l(3);
  l[0].qk_norm = true;
  l[1].qk_norm = false;
  l[2].qk_norm = true;
  return l;
}

ModelConfig mixed_config() {
  ModelConfig c = tiny_config("qwen3", false);
  c.num_hidden_layers = 3;
  return c;
}

void init_for_test(Model<double>& m, uint64_t seed) {
  m.init(seed);
  std::mt19937_64 rng(seed + 17);
  std::uniform_real_distribution<double> u(-0.2, 0.2);
  for (const ParamInfo& p : m.params_info()) {
    if (p.role != ParamRole::kNormWeight) continue;
    for (int64_t i = 0; i < p.numel; ++i) m.params()[p.offset + i] += u(rng);
  }
}

TEST(MixedLayers, TableHasEachLayersOwnTensors) {
  DecoderOptions o;
  o.layers = mixed_layers();
  Model<double> m(mixed_config(), o);
  EXPECT_GE(m.table().find("model.layers.0.self_attn.q_norm.weight"), 0);
  EXPECT_LT(m.table().find("model.layers.1.self_attn.q_norm.weight"), 0);
  EXPECT_LT(m.table().find("model.layers.1.self_attn.k_norm.weight"), 0);
  EXPECT_GE(m.table().find("model.layers.2.self_attn.k_norm.weight"), 0);
  // Blocks own consecutive slices: embedding, then mixer/MLP per layer, then the head.
  const std::vector<ParamSlice>& s = m.table().slices();
  ASSERT_EQ(s.size(), 1u + 2 * 3 + 1);
  EXPECT_EQ(s[0].block, "model.embed_tokens");
  EXPECT_EQ(s[3].block, "model.layers.1.self_attn");
  EXPECT_EQ(s[3].end - s[3].begin, 5);  // input_layernorm, q, k, v, o
  EXPECT_EQ(s[1].end - s[1].begin, 7);  // and q_norm, k_norm
  EXPECT_EQ(s.back().block, "lm_head");
  for (size_t i = 1; i < s.size(); ++i) EXPECT_EQ(s[i].begin, s[i - 1].end);
  EXPECT_EQ(s.back().end, m.table().size());
}

// Central differences on sampled entries of every tensor (model_test_util.h states the bound).
TEST(MixedLayers, GradientsMatchFiniteDifferences) {
  DecoderOptions o;
  o.layers = mixed_layers();
  Model<double> m(mixed_config(), o);
  init_for_test(m, 3);
  testing::expect_sampled_gradients(m, tree_batch().batch, 0.5, 9, 8, "mixed layers");
}

// The mixed decoder keeps the exactness contract: a tree (branch points, a one-token node,
// masks, weights) and its paths packed one by one give the same loss and gradients.
TEST(MixedLayers, TreeEqualsPerPath) {
  DecoderOptions o;
  o.layers = mixed_layers();
  Model<double> m(mixed_config(), o);
  init_for_test(m, 4);
  const data::Tree tree = data::parse_tree_line(
      R"({"id":"t","nodes":[{"parent":-1,"tokens":[1,2,3]},{"parent":0,"tokens":[4,5],"weight":2.0},)"
      R"({"parent":1,"tokens":[6]},{"parent":0,"tokens":[7,8,9],"loss_mask":[1,0,1]},)"
      R"({"parent":3,"tokens":[10]},{"parent":3,"tokens":[2,2],"weight":0.5}]})",
      "test:1", m.config().vocab_size);
  testing::expect_tree_equals_per_path(m, tree, 1.0 / 3);
}

// The unweighted NLL sum (Losses::nll_sum): for a tree with signed and zero weights and partial
// masks, tree packing, per-path packing and a direct sum over the paths' masked tokens (each
// path's own full forward) agree; with every weight 1 it is the loss.
TEST(Nll, IsTheSumOverThePathsMaskedTokens) {
  Model<double> m(tiny_config("qwen3", false));
  init_for_test(m, 12);
  const data::Tree tree = data::parse_tree_line(
      R"({"id":"t","nodes":[{"parent":-1,"tokens":[1,2,3]},{"parent":0,"tokens":[4,5],"weight":-2.0},)"
      R"({"parent":1,"tokens":[6]},{"parent":0,"tokens":[7,8,9],"loss_mask":[1,0,1],"weight":0.0},)"
      R"({"parent":3,"tokens":[10]},{"parent":3,"tokens":[2,2],"weight":0.5}]})",
      "test:1", m.config().vocab_size);
  const int V = (int)m.config().vocab_size;
  double direct = 0;
  for (int64_t k = 0; k < tree.n_paths(); ++k) {
    const std::vector<int32_t> toks = tree.path_tokens(k);
    const std::vector<double> z = m.infer(testing::chain_batch(toks), InferRequest::all_logits()).logits;
    for (size_t j = 1; j < toks.size(); ++j) {
      if (!tree.paths[k].is_target(j)) continue;
      const double* row = z.data() + (j - 1) * V;
      double mx = row[0], s = 0;
      for (int v = 1; v < V; ++v) mx = std::max(mx, row[v]);
      for (int v = 0; v < V; ++v) s += std::exp(row[v] - mx);
      direct += mx + std::log(s) - row[toks[j]];
    }
  }
  Activations<CpuExec<double>> acts;
  double sums[2];
  int i = 0;
  for (data::Packing p : {data::Packing::kTree, data::Packing::kPerPath}) {
    m.forward(data::pack({&tree}, p), 1.0, acts);
    sums[i++] = m.losses(acts).nll_sum;
  }
  EXPECT_NEAR(sums[0], direct, 1e-10 * direct);
  EXPECT_NEAR(sums[1], direct, 1e-10 * direct);
  // Unit weights: the NLL sum is the loss.
  data::PackedBatch b = data::pack({&tree}, data::Packing::kTree);
  for (size_t t = 0; t < b.tgt_w.size(); ++t) b.tgt_w[t] = b.tgt_cnt[t];
  m.forward(b, 1.0, acts);
  const Losses l = m.losses(acts);
  EXPECT_NEAR(l.nll_sum, l.loss, 1e-12 * l.loss);
  EXPECT_NEAR(l.nll_sum, direct, 1e-10 * direct);
}

// The no-grad forward returns the training forward's loss and logits (the same ops in the same
// order: bitwise), on every row or a chosen list, and leaves the gradients alone.
TEST(NoGrad, EqualsTheTrainingForward) {
  for (const std::string arch : {"qwen3", "llama"}) {
    Model<double> m(tiny_config(arch, arch == "llama"));
    init_for_test(m, 6);
    const data::PackedBatch b = tree_batch().batch;
    const int V = (int)m.config().vocab_size;
    m.zero_grad();
    Activations<CpuExec<double>> acts;
    m.forward(b, 0.25, acts);
    const double l_train = m.loss(acts);
    const std::vector<int32_t> rows = m.saved_head_rows(acts);
    const std::vector<double> z_train = m.saved_logits(acts);

    InferRequest all = InferRequest::all_logits();
    all.loss = true;
    const InferResult r = m.infer(b, all);
    EXPECT_EQ(r.loss * 0.25, l_train) << arch;
    ASSERT_EQ((int)r.rows.size(), b.n_tokens);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int v = 0; v < V; ++v) ASSERT_EQ(r.logits[(size_t)rows[i] * V + v], z_train[i * V + v]) << arch;

    InferRequest some;
    some.loss = false;
    some.rows = InferRequest::Rows::kList;
    some.list = {7, 2, 7, 0};
    const InferResult s = m.infer(b, some);
    ASSERT_EQ(s.rows, some.list);
    for (size_t i = 0; i < s.rows.size(); ++i)
      for (int v = 0; v < V; ++v) ASSERT_EQ(s.logits[i * V + v], r.logits[(size_t)s.rows[i] * V + v]);

    for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m.grads()[i], 0.0) << "infer touched a gradient";
    // The training activations are still those of the training forward: backward works after infer.
    m.backward(acts);
    EXPECT_GT(max_abs(std::vector<double>(m.grads(), m.grads() + m.num_params())), 0.0);
  }
}

TEST(NoGrad, RejectsRowsOutsideTheBatch) {
  Model<double> m(tiny_config("qwen3", false));
  m.init(1);
  InferRequest r;
  r.rows = InferRequest::Rows::kList;
  r.list = {11};
  try {
    m.infer(tree_batch().batch, r);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logits of row 11 of a batch of 11 rows"), std::string::npos) << e.what();
  }
}

// A chain [a | b] as one batch, and as two: b reads a's exported rows as its carry, and a's
// backward takes b's relayed gradients. Logits (no-grad and training), loss and every gradient
// agree.
TEST(Carry, TwoBatchesEqualOne) {
  for (const std::string arch : {"qwen3", "llama"}) {
    Model<double> m(tiny_config(arch, false));
    init_for_test(m, 8);
    const std::vector<int32_t> toks = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    const int na = 4, n = (int)toks.size(), V = (int)m.config().vocab_size, L = 2;
    const data::PackedBatch whole = chain_batch(toks);
    data::PackedBatch a = chain_batch(std::vector<int32_t>(toks.begin(), toks.begin() + na));
    a.tgt_src.push_back(na - 1);  // a's last row predicts b's first token
    a.tgt_tok.push_back(toks[na]);
    a.tgt_w.push_back(1.0);
    data::PackedBatch b = chain_batch(std::vector<int32_t>(toks.begin() + na, toks.end()));
    for (int32_t& p : b.pos) p += na;

    m.zero_grad();
    const double l_whole = m.forward(whole, 1.0);
    m.backward();
    const std::vector<double> g_whole(m.grads(), m.grads() + m.num_params());
    const std::vector<double> z_whole = m.infer(whole, InferRequest::all_logits()).logits;

    m.zero_grad();
    Activations<CpuExec<double>> acts_a, acts_b;
    m.forward(a, 1.0, acts_a);
    Carry<CpuExec<double>> rows = m.export_carry(acts_a);
    ASSERT_EQ((int)rows.size(), L);
    std::vector<std::vector<double>> relay(L);
    Carry<CpuExec<double>> gateway(L);
    for (int l = 0; l < L; ++l) {
      ASSERT_EQ(rows[l].kv.size(), 1u);
      const int64_t e = m.carry_row_elems(l);
      ASSERT_EQ(e, m.config().num_key_value_heads * m.config().head_dim);
      relay[l].assign(2 * na * e, 0.0);
      rows[l].kv[0].dk = relay[l].data();
      rows[l].kv[0].dv = relay[l].data() + na * e;
      CpuExec<double>::KV kv = rows[l].kv[0];
      kv.q_begin = 0;
      kv.q_end = b.n_tokens;
      gateway[l].kv.push_back(kv);
    }
    const std::vector<double> z_b = m.infer(b, InferRequest::all_logits(), &gateway).logits;
    EXPECT_LE(max_diff(z_b.data(), z_whole.data() + (int64_t)na * V, (int64_t)(n - na) * V),
              1e-10 * max_abs(z_whole)) << arch;
    m.forward(b, 1.0, acts_b, &gateway);
    const double l_split = m.loss(acts_a) + m.loss(acts_b);
    m.backward(acts_b);
    m.backward(acts_a, &rows);
    EXPECT_NEAR(l_split, l_whole, 1e-10 * std::fabs(l_whole)) << arch;
    EXPECT_LE(max_diff(m.grads(), g_whole.data(), m.num_params()), 1e-10 * max_abs(g_whole)) << arch;

    Carry<CpuExec<double>> short_carry(1);
    try {
      m.forward(b, 1.0, acts_b, &short_carry);
      FAIL() << "expected tt::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("a carry of 1 layers, expected one entry per layer (2)"), std::string::npos)
          << e.what();
    }
  }
}

// The FLOP API reproduces the trainer's former count: model FLOPs 6 P tokens + 12 L NH HS pairs,
// P the parameters that enter a matmul (all but an untied input embedding; norm weights counted),
// and executed FLOPs that count the LM head (6 V C per row) only on head rows. Forward only: a third.
TEST(Flops, MatchTheFormerCount) {
  for (const std::string arch : {"qwen3", "llama"}) {
    for (bool tied : {false, true}) {
      const ModelConfig c = tiny_config(arch, tied);
      const Architecture a(c);
      int64_t params = 0;
      for (const ParamInfo& p : a.table().entries())
        if (c.tie_word_embeddings || p.name != "model.embed_tokens.weight") params += p.numel;
      const Work w{1000, 70000, 300};
      const double former = 6.0 * (double)params * w.tokens +
                            12.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * (double)w.visible_pairs;
      const Flops f = a.flops(w, Pass::kTrain);
      EXPECT_DOUBLE_EQ(f.model, former) << arch << tied;
      EXPECT_DOUBLE_EQ(f.executed, former - 6.0 * c.vocab_size * c.hidden_size * (w.tokens - w.head_rows));
      const Flops fw = a.flops(w, Pass::kForward);
      EXPECT_DOUBLE_EQ(fw.model * 3, f.model);
      EXPECT_DOUBLE_EQ(fw.executed * 3, f.executed);
      const Work wb = Work::of(tree_batch().batch);
      EXPECT_EQ(wb.tokens, 11);
      EXPECT_EQ(wb.head_rows, 8);  // 9 targets, row 2 the source of two
      EXPECT_EQ(wb.visible_pairs, tree_batch().batch.visible_pairs);
    }
  }
}

TEST(LayerTypes, UnknownEntryIsAnErrorNamingIt) {
  ModelConfig c = tiny_config("qwen3", false);
  c.layer_types = {"full_attention", "mamba"};
  try {
    c.validate();
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types entry 1 is \"mamba\", not a layer kind of this model (supported: "
                                         "\"full_attention\", \"linear_attention\")"),
              std::string::npos)
        << e.what();
  }
  c.layer_types = {"full_attention"};
  EXPECT_THROW(c.validate(), Error);  // one per layer
  nlohmann::json j = tiny_config("qwen3", false).to_hf_json();
  j["layer_types"] = {"full_attention", "full_attention"};
  const ModelConfig r = ModelConfig::from_hf_json(j, "config.json");
  EXPECT_TRUE(r.layer_types.empty()) << "all full_attention is the default form";
  j["layer_types"] = {"full_attention", "sliding_attention"};
  try {
    ModelConfig::from_hf_json(j, "dir/config.json");
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding_attention"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tt::model
