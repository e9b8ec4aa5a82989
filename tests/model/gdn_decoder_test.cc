// A hybrid decoder (model/gdn.h: Gated DeltaNet "linear_attention" layers between full-attention
// ones) on the CPU backend in fp64: its parameter table (HF names and shapes), gradients against
// finite differences, tree == per-path (the exactness contract: a node's conv window and state
// come from its own ancestors), a sibling's change leaving the other branch alone, and the
// clear errors where a carry would be needed (partition gateways, the inference cache).
// Bounds: fp64 against fp64, 1e-10 relative (the same terms summed in another order), as
// tests/model/decoder_test.cc.
#include "model/gdn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "base/check.h"
#include "data/packing.h"
#include "data/reader.h"
#include "model/decoder.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::tiny_config;

// A hybrid of Qwen3.5's layer kinds (the architecture whose transformers class has them), head
// dim 4 with RoPE on half of it (testing::make_hybrid).
ModelConfig hybrid_config() {
  ModelConfig c = tiny_config("qwen3", false);
  testing::make_hybrid(c, "qwen3_5_text");
  return c;
}

// Qwen3.5 as transformers builds it (qwen3_5_text): zero-centred norms, gated attention, partial
// RoPE (half of head_dim 8 here), the Gated DeltaNet layers.
ModelConfig qwen35_config() {
  ModelConfig c = hybrid_config();
  c.head_dim = 8;
  return c;
}

void init_for_test(Model<double>& m, uint64_t seed) {
  m.init(seed);
  std::mt19937_64 rng(seed + 17);
  std::uniform_real_distribution<double> u(-0.2, 0.2);
  for (const ParamInfo& p : m.params_info()) {
    if (p.role == ParamRole::kMatrix) continue;
    for (int64_t i = 0; i < p.numel; ++i) m.params()[p.offset + i] += u(rng);
  }
}

// A tree with branch points, one-token nodes (shorter than the conv window) and a fan of three.
data::Tree test_tree(int64_t vocab) {
  return data::parse_tree_line(
      R"({"id":"t","nodes":[{"parent":-1,"tokens":[1,2]},{"parent":0,"tokens":[3]},{"parent":1,"tokens":[4]},)"
      R"({"parent":2,"tokens":[5,6,7],"weight":2.0},{"parent":2,"tokens":[8]},{"parent":0,"tokens":[9,10,1,2]},)"
      R"({"parent":0,"tokens":[3,3],"loss_mask":[1,0],"weight":-0.5}]})",
      "test:1", vocab);
}

TEST(GdnDecoder, TableHasTheGatedDeltaNetTensors) {
  Model<double> m(hybrid_config());
  const ParamTable& t = m.table();
  const int conv_dim = 2 * 1 * 4 + 2 * 3;
  auto shape = [&](const std::string& name) {
    const int i = t.find(name);
    return i < 0 ? std::vector<int64_t>{} : t[i].shape;
  };
  const std::string la = "model.layers.0.linear_attn.";
  EXPECT_EQ(shape("model.layers.0.input_layernorm.weight"), (std::vector<int64_t>{8}));
  EXPECT_EQ(shape(la + "in_proj_qkv.weight"), (std::vector<int64_t>{conv_dim, 8}));
  EXPECT_EQ(shape(la + "in_proj_z.weight"), (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(shape(la + "in_proj_b.weight"), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(shape(la + "in_proj_a.weight"), (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(shape(la + "conv1d.weight"), (std::vector<int64_t>{conv_dim, 1, 4}));
  EXPECT_EQ(shape(la + "A_log"), (std::vector<int64_t>{2}));
  EXPECT_EQ(shape(la + "dt_bias"), (std::vector<int64_t>{2}));
  EXPECT_EQ(shape(la + "norm.weight"), (std::vector<int64_t>{3}));
  EXPECT_EQ(shape(la + "out_proj.weight"), (std::vector<int64_t>{8, 6}));
  EXPECT_GE(t.find("model.layers.1.self_attn.q_proj.weight"), 0);
  EXPECT_LT(t.find("model.layers.1.linear_attn.A_log"), 0);
  EXPECT_GE(t.find("model.layers.2.linear_attn.out_proj.weight"), 0);
  // A_log, dt_bias and the norms take no weight decay; the matrices and the conv do.
  EXPECT_FALSE(t[t.find(la + "A_log")].decay);
  EXPECT_FALSE(t[t.find(la + "dt_bias")].decay);
  EXPECT_TRUE(t[t.find(la + "conv1d.weight")].decay);
  EXPECT_EQ(m.num_params(), m.config().parameter_count());
  // A_log is the log of a decay rate in (0, 16]: finite, at most log 16.
  m.init(1);
  const ParamInfo& a = t[t.find(la + "A_log")];
  for (int64_t i = 0; i < a.numel; ++i) {
    EXPECT_TRUE(std::isfinite(m.params()[a.offset + i]));
    EXPECT_LE(m.params()[a.offset + i], std::log(16.0));
  }
}

void check_gradients(const ModelConfig& cfg) {
  Model<double> m(cfg);
  init_for_test(m, 3);
  const data::Tree tree = test_tree(m.config().vocab_size);
  testing::expect_sampled_gradients(m, data::pack({&tree}, data::Packing::kTree), 0.5, 9, 6, cfg.architecture);
}

TEST(GdnDecoder, GradientsMatchFiniteDifferences) { check_gradients(hybrid_config()); }
TEST(Qwen35, GradientsMatchFiniteDifferences) { check_gradients(qwen35_config()); }

void check_tree_equals_per_path(const ModelConfig& cfg) {
  Model<double> m(cfg);
  init_for_test(m, 4);
  EXPECT_GT(testing::expect_tree_equals_per_path(m, test_tree(m.config().vocab_size), 1.0 / 4), 1e-3);
}

TEST(GdnDecoder, TreeEqualsPerPath) { check_tree_equals_per_path(hybrid_config()); }
TEST(Qwen35, TreeEqualsPerPath) { check_tree_equals_per_path(qwen35_config()); }

// Qwen3-Next (dense): Qwen3.5's layers with the Gated DeltaNet's input projections fused and
// grouped per key head; two key heads of two value heads each (testing::make_hybrid).
ModelConfig next_config() {
  ModelConfig c = tiny_config("qwen3", false);
  testing::make_hybrid(c, "qwen3_next");
  c.head_dim = 8;
  return c;
}

TEST(Qwen3Next, GradientsMatchFiniteDifferences) { check_gradients(next_config()); }
TEST(Qwen3Next, TreeEqualsPerPath) { check_tree_equals_per_path(next_config()); }

// The rows of in_proj_qkvz / in_proj_ba of key head g and the rows of the split projections they
// are (anchors-ssm-vla.md 1.3), as (fused row, split tensor suffix, split row) for every row.
struct RowMap {
  int64_t fused;
  const char* split;
  int64_t row;
};
std::vector<RowMap> grouped_rows(const ModelConfig& c, bool ba) {
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, dk = c.linear_key_head_dim,
                dv = c.linear_value_head_dim, r = nv / nk, KD = nk * dk;
  std::vector<RowMap> out;
  for (int64_t g = 0; g < nk; ++g) {
    if (ba) {
      for (int64_t i = 0; i < r; ++i) out.push_back({g * 2 * r + i, "in_proj_b.weight", g * r + i});
      for (int64_t i = 0; i < r; ++i) out.push_back({g * 2 * r + r + i, "in_proj_a.weight", g * r + i});
      continue;
    }
    const int64_t base = g * (2 * dk + 2 * r * dv);
    for (int64_t i = 0; i < dk; ++i) out.push_back({base + i, "in_proj_qkv.weight", g * dk + i});
    for (int64_t i = 0; i < dk; ++i) out.push_back({base + dk + i, "in_proj_qkv.weight", KD + g * dk + i});
    for (int64_t i = 0; i < r * dv; ++i) out.push_back({base + 2 * dk + i, "in_proj_qkv.weight", 2 * KD + g * r * dv + i});
    for (int64_t i = 0; i < r * dv; ++i) out.push_back({base + 2 * dk + r * dv + i, "in_proj_z.weight", g * r * dv + i});
  }
  return out;
}

// A qwen3_next model is the qwen3_5_text model whose split projections are its fused rows
// ungrouped: the same loss, and the same gradients row for row.
TEST(Qwen3Next, IsQwen35WithGroupedFusedProjections) {
  const ModelConfig nc = next_config();
  ModelConfig sc = nc;
  sc.architecture = "qwen3_5_text";
  Model<double> next(nc), split(sc);
  init_for_test(next, 5);
  const int64_t C = nc.hidden_size;
  auto copy_rows = [&](bool to_split, const std::string& fused_name, bool ba) {
    const ParamInfo& f = next.params_info()[next.table().find(fused_name)];
    const std::string la = fused_name.substr(0, fused_name.rfind('.', fused_name.size() - 8) + 1);
    for (const RowMap& m : grouped_rows(nc, ba)) {
      const int si = split.table().find(la + m.split);
      EXPECT_GE(si, 0) << la + m.split;
      double* s = (to_split ? split.params() : split.grads()) + split.params_info()[si].offset + m.row * C;
      const double* n = (to_split ? next.params() : next.grads()) + f.offset + m.fused * C;
      if (to_split) std::copy(n, n + C, s);
      else
        for (int64_t j = 0; j < C; ++j) EXPECT_NEAR(n[j], s[j], 1e-10 * (1 + std::fabs(s[j]))) << fused_name;
    }
  };
  for (const ParamInfo& p : split.params_info()) {
    const int i = next.table().find(p.name);
    if (i >= 0) std::copy_n(next.params() + next.params_info()[i].offset, p.numel, split.params() + p.offset);
  }
  std::vector<std::string> fused;
  for (const ParamInfo& p : next.params_info())
    if (p.name.find("in_proj_qkvz") != std::string::npos || p.name.find("in_proj_ba") != std::string::npos)
      fused.push_back(p.name);
  ASSERT_EQ(fused.size(), 4u) << "two linear_attention layers";
  for (const std::string& n : fused) copy_rows(true, n, n.find("in_proj_ba") != std::string::npos);
  const data::Tree tree = test_tree(nc.vocab_size);
  const data::PackedBatch b = data::pack({&tree}, data::Packing::kTree);
  next.zero_grad();
  split.zero_grad();
  const double ln = next.forward_backward(b, 0.5), ls = split.forward_backward(b, 0.5);
  EXPECT_NEAR(ln, ls, 1e-12 * std::fabs(ls));
  for (const std::string& n : fused) copy_rows(false, n, n.find("in_proj_ba") != std::string::npos);
  for (const ParamInfo& p : split.params_info()) {
    const int i = next.table().find(p.name);
    if (i < 0) continue;
    for (int64_t j = 0; j < p.numel; ++j)
      EXPECT_NEAR(next.grads()[next.params_info()[i].offset + j], split.grads()[p.offset + j],
                  1e-10 * (1 + std::fabs(split.grads()[p.offset + j])))
          << p.name;
  }
  // transformers' config: Qwen3NextForCausalLM, dense; a config that leaves num_experts to
  // transformers' default (512 experts) is refused.
  nlohmann::json j = nc.to_hf_json();
  EXPECT_EQ(j.at("architectures")[0], "Qwen3NextForCausalLM");
  EXPECT_EQ(j.at("model_type"), "qwen3_next");
  EXPECT_EQ(j.at("num_experts"), 0);
  const ModelConfig back = ModelConfig::from_hf_json(j, "config.json");
  EXPECT_EQ(back.architecture, "qwen3_next");
  EXPECT_EQ(back.layer_types, nc.layer_types);
  j.erase("num_experts");
  try {
    ModelConfig::from_hf_json(j, "config.json");
    FAIL() << "a qwen3_next config without num_experts is a mixture of experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected num_experts: 0"), std::string::npos) << e.what();
  }
}

TEST(Qwen35, TableAndConfigAreTransformers) {
  Model<double> m(qwen35_config());
  const ParamTable& t = m.table();
  // q_proj holds the query and the output gate per head; norms are zero-centred (init 0).
  EXPECT_EQ(t[t.find("model.layers.1.self_attn.q_proj.weight")].shape, (std::vector<int64_t>{2 * 2 * 8, 8}));
  EXPECT_EQ(t[t.find("model.layers.1.self_attn.q_norm.weight")].role, ParamRole::kZeroNorm);
  EXPECT_EQ(t[t.find("model.norm.weight")].role, ParamRole::kZeroNorm);
  EXPECT_EQ(t[t.find("model.layers.0.input_layernorm.weight")].role, ParamRole::kZeroNorm);
  EXPECT_EQ(t[t.find("model.layers.0.linear_attn.norm.weight")].role, ParamRole::kNormWeight) << "plain, HF's exception";
  EXPECT_EQ(m.num_params(), m.config().parameter_count());
  m.init(2);
  const ParamInfo& n = t[t.find("model.norm.weight")];
  for (int64_t i = 0; i < n.numel; ++i) EXPECT_EQ(m.params()[n.offset + i], 0.0);
  const nlohmann::json j = m.config().to_hf_json();
  EXPECT_EQ(j["model_type"], "qwen3_5_text");
  EXPECT_EQ(j["architectures"][0], "Qwen3_5ForCausalLM");
  EXPECT_EQ(j["rope_parameters"]["partial_rotary_factor"], 0.5);
  const ModelConfig r = ModelConfig::from_hf_json(j, "config.json");
  EXPECT_EQ(r.architecture, "qwen3_5_text");
  EXPECT_EQ(r.partial_rotary_factor, 0.5);
  EXPECT_EQ(r.layer_types, qwen35_config().layer_types);
  // transformers' default when the file has no partial_rotary_factor: 0.25.
  nlohmann::json k = j;
  k["rope_parameters"].erase("partial_rotary_factor");
  EXPECT_EQ(ModelConfig::from_hf_json(k, "config.json").partial_rotary_factor, 0.25);
  ModelConfig bad = tiny_config("qwen3", false);
  bad.partial_rotary_factor = 0.5;
  EXPECT_THROW(bad.validate(), Error);
  // A mixture-of-experts config is an error naming the key, not a silently dense model.
  nlohmann::json moe = j;
  moe["num_experts"] = 8;
  try {
    ModelConfig::from_hf_json(moe, "moe/config.json");
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "moe/config.json: num_experts = 8 (a mixture-of-experts model) is unsupported; "
                                     "expected 0 or absent (dense MLPs)");
  }
  moe["num_experts"] = 0;
  EXPECT_EQ(ModelConfig::from_hf_json(moe, "config.json").architecture, "qwen3_5_text");
}

// Changing the tokens of one branch changes nothing in its sibling's rows, however the siblings
// sit in packed order (the recurrent state of a finished sibling must not flow into the next).
TEST(GdnDecoder, ASiblingsChangeLeavesTheOtherBranchAlone) {
  Model<double> m(hybrid_config());
  init_for_test(m, 5);
  auto logits = [&](const std::string& json) {
    const data::Tree tree = data::parse_tree_line(json, "test:1", m.config().vocab_size);
    const data::PackedBatch b = data::pack({&tree}, data::Packing::kTree);
    return m.infer(b, InferRequest::all_logits()).logits;
  };
  const int V = (int)m.config().vocab_size;
  // Root [1 2] (rows 0-1), first child [3 4 5] (rows 2-4), second child [6 7] (rows 5-6).
  const std::vector<double> a =
      logits(R"({"id":"t","nodes":[{"parent":-1,"tokens":[1,2]},{"parent":0,"tokens":[3,4,5]},{"parent":0,"tokens":[6,7]}]})");
  const std::vector<double> b =
      logits(R"({"id":"t","nodes":[{"parent":-1,"tokens":[1,2]},{"parent":0,"tokens":[9,8,7]},{"parent":0,"tokens":[6,7]}]})");
  ASSERT_EQ(a.size(), (size_t)7 * V);
  for (int r = 5; r < 7; ++r)
    for (int v = 0; v < V; ++v) EXPECT_EQ(a[(size_t)r * V + v], b[(size_t)r * V + v]) << "row " << r;
  bool changed = false;
  for (int r = 2; r < 5; ++r)
    for (int v = 0; v < V; ++v) changed |= a[(size_t)r * V + v] != b[(size_t)r * V + v];
  EXPECT_TRUE(changed) << "the changed branch's own rows do change";
}

// A carry must say where each root's state is (never zeros behind the caller's back), and a
// recurrent layer reads no K/V prefixes: both are errors naming the layer.
TEST(GdnDecoder, ABadCarryIsAnErrorNamingTheLayer) {
  Model<double> m(hybrid_config());
  init_for_test(m, 6);
  const data::Tree tree = test_tree(m.config().vocab_size);
  const data::PackedBatch b = data::pack({&tree}, data::Packing::kTree);
  auto expect_error = [&](const Carry<CpuExec<double>>& carry, const std::string& what) {
    Activations<CpuExec<double>> acts;
    try {
      m.forward(b, 1.0, acts, &carry);
      FAIL() << "expected tt::Error: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Carry<CpuExec<double>> carry(3);
  expect_error(carry, "model: layer 0 is linear_attention: a carry must give each root's recurrent state slot");
  std::vector<double> k(8), v(8);
  carry[0].state_slot = {-1};
  carry[0].kv.push_back({});
  carry[0].kv[0].k = k.data();
  carry[0].kv[0].v = v.data();
  carry[0].kv[0].len = 1;
  expect_error(carry, "model: layer 0 is linear_attention: its carry holds a recurrent state and conv context, not "
                      "K/V prefixes");
  carry[0].kv.clear();
  carry[0].state_slot = {0};
  expect_error(carry, "model: layer 0 is linear_attention: a training forward reads state slot 0 without d_state / "
                      "d_conv accumulators for its gradient");
  try {
    m.infer(b, InferRequest::all_logits(), &carry);
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model: layer 0: root 0 reads state slot 0 of a carry without state buffers"),
              std::string::npos)
        << e.what();
  }
  // Offers (a partition piece's end states for its child pieces) need their gradient buffers.
  std::vector<double> state(m.recurrent_state_elems(0)), conv(m.conv_context_elems(0));
  carry[0].state_slot = {-1};
  carry[0].offer_node = {0};
  carry[0].offer_state = state.data();
  carry[0].offer_conv = conv.data();
  expect_error(carry, "model: layer 0 offers 1 nodes without offer_d_state");
}

TEST(GdnDecoder, ConfigNamesWhatALinearAttentionLayerNeeds) {
  ModelConfig c = hybrid_config();
  c.validate();
  c.linear_conv_kernel_dim = 0;
  try {
    c.validate();
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_conv_kernel_dim"), std::string::npos) << e.what();
  }
  c = hybrid_config();
  c.linear_num_value_heads = 3;  // not a multiple of linear_num_key_heads = 2
  c.linear_num_key_heads = 2;
  try {
    c.validate();
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_num_value_heads"), std::string::npos) << e.what();
  }
  // linear_attention is Qwen3.5's layer: another architecture is an error naming the key.
  c = hybrid_config();
  c.architecture = "qwen3";
  c.partial_rotary_factor = 1;
  try {
    c.validate();
    FAIL() << "expected tt::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types names linear_attention layers, which architectures qwen3_5_text and qwen3_next"),
              std::string::npos)
        << e.what();
  }
  // A Qwen3.5 config.json without layer_types gets transformers' default: every
  // full_attention_interval-th layer full.
  nlohmann::json j = hybrid_config().to_hf_json();
  j.erase("layer_types");
  j["full_attention_interval"] = 3;
  EXPECT_EQ(ModelConfig::from_hf_json(j, "config.json").layer_types,
            (std::vector<std::string>{"linear_attention", "linear_attention", "full_attention"}));
  // The config.json round trip keeps the hybrid's fields.
  const ModelConfig r = ModelConfig::from_hf_json(hybrid_config().to_hf_json(), "config.json");
  EXPECT_EQ(r.layer_types, hybrid_config().layer_types);
  EXPECT_EQ(r.linear_num_value_heads, 2);
  EXPECT_EQ(r.linear_value_head_dim, 3);
  EXPECT_EQ(r.linear_conv_kernel_dim, 4);
}

}  // namespace
}  // namespace tt::model
