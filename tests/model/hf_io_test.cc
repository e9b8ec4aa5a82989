// Hugging Face directories and config.json: save / load round trips, tied embeddings, errors that
// name the tensor and the file, and the config mapping's strictness.
#include "model/hf_io.h"
#include "tests/equivalence/vla_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/safetensors.h"
#include "base/check.h"
#include "tests/model/model_test_util.h"

namespace tt::model {
namespace {

using testing::expect_error;
using testing::tiny_config;

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "hf_io_test/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.initializer_range, b.initializer_range);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
}

// Writes the model's tensors to dir/model.safetensors, with `edit` applied to the list first.
template <class Edit>
void write_weights(const std::string& dir, const Model<float>& m, Edit edit) {
  std::filesystem::create_directories(dir);
  std::vector<StWriteTensor> ts;
  for (const ParamInfo& p : m.params_info()) ts.push_back({p.name, p.shape, m.params() + p.offset, nullptr});
  edit(ts);
  write_safetensors(dir + "/model.safetensors", ts, "F32");
}

class HfRoundTrip : public ::testing::TestWithParam<std::pair<std::string, bool>> {};

TEST_P(HfRoundTrip, F32IsExact) {
  const ModelConfig c = tiny_config(GetParam().first, GetParam().second);
  Model<float> m(c);
  m.init(42);
  m.params()[3] = 0.1f;  // a value BF16 could not hold
  const std::string dir = temp_dir("rt_" + c.architecture + (c.tie_word_embeddings ? "_tied" : ""));
  save_hf(dir, m, "F32");

  const ModelConfig c2 = read_hf_config(dir);
  expect_same_config(c2, c);
  Model<float> m2(c2);
  load_hf_weights(dir, m2);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m2.params()[i], m.params()[i]) << i;

  const auto st = read_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(st.size(), m.params_info().size());
  EXPECT_EQ(st.count("lm_head.weight"), c.tie_word_embeddings ? 0u : 1u);
  for (const auto& [name, t] : st) EXPECT_EQ(t.dtype, "F32") << name;

  std::ifstream in(dir + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("model_type"), c.architecture);
  EXPECT_EQ(j.at("architectures")[0], c.architecture == "qwen3" ? "Qwen3ForCausalLM" : "LlamaForCausalLM");
  EXPECT_EQ(j.at("torch_dtype"), "float32");
  EXPECT_EQ(j.at("hidden_act"), "silu");
  EXPECT_EQ(j.at("attention_bias"), false);
  EXPECT_EQ(j.at("use_cache"), true);
  EXPECT_EQ(j.at("head_dim"), 4);
}

// Saving through a reader of parameter slices (a device's weights, a piece at a time) writes the
// same files byte for byte as saving from the flat host buffer, asking for pieces of at most 2^20
// inside the parameters; a slice outside them is an error.
TEST(HfIo, SliceReaderWritesTheSameFiles) {
  ModelConfig c = tiny_config("qwen3", false);
  c.vocab_size = 140000;  // the embeddings and the head: 1,120,000 values each, two pieces
  Model<float> m(c);
  m.init(7);
  const std::string a = temp_dir("slice_flat"), b = temp_dir("slice_reader");
  save_hf(a, m, "F32");
  int64_t calls = 0;
  const ParamReader reader = [&](int64_t offset, int64_t n, float* dst) {
    EXPECT_GE(offset, 0);
    EXPECT_LE(n, int64_t{1} << 20);
    EXPECT_LE(offset + n, m.num_params());
    m.params_slice_host(offset, n, dst);
    ++calls;
  };
  save_hf(b, c, m.params_info(), reader, "F32");
  EXPECT_EQ(calls, (int64_t)m.params_info().size() + 2);  // one piece each, two for the two large ones
  for (const char* f : {"/config.json", "/model.safetensors"}) {
    std::ifstream fa(a + f, std::ios::binary), fb(b + f, std::ios::binary);
    const std::string ba((std::istreambuf_iterator<char>(fa)), {}), bb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_FALSE(ba.empty()) << f;
    EXPECT_EQ(ba, bb) << f;
  }
  float x[2];
  expect_error([&] { m.params_slice_host(m.num_params() - 1, 2, x); },
               {"params_slice_host: [" + std::to_string(m.num_params() - 1) + ", "});
  expect_error([&] { m.params_slice_host(-1, 1, x); },
               {"is outside the " + std::to_string(m.num_params()) + " parameters"});
}

INSTANTIATE_TEST_SUITE_P(Archs, HfRoundTrip,
                         ::testing::Values(std::make_pair(std::string("qwen3"), false),
                                           std::make_pair(std::string("qwen3"), true),
                                           std::make_pair(std::string("llama"), false),
                                           std::make_pair(std::string("llama"), true)));

// A VLA checkpoint is LlavaForConditionalGeneration's layout: the decoder under
// model.language_model, the tower and projector under their LLaVA names, the config's text and
// vision sections; it loads back exactly, skips what LLaVA never reads, and refuses feature
// selections it cannot represent.
TEST(HfIo, VlaRoundTripInLlavaLayout) {
  const ModelConfig c = tt::testing::tiny_vla_config();
  Model<float> m(c);
  m.init(3);
  const std::string dir = temp_dir("rt_vla");
  save_hf(dir, m, "F32");
  const ModelConfig c2 = read_hf_config(dir);
  expect_same_config(c2, c);
  EXPECT_EQ(c2.vision.hidden_size, 8);
  EXPECT_EQ(c2.vision.image_size, 4);
  EXPECT_EQ(c2.vision.patch_size, 2);
  EXPECT_EQ(c2.vision.state_dim, 3);
  EXPECT_EQ(c2.vision.image_token_index, 0);
  EXPECT_EQ(c2.vision.projector_hidden_act, "gelu");
  Model<float> m2(c2);
  load_hf_weights(dir, m2);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m2.params()[i], m.params()[i]) << i;
  const auto st = read_safetensors(dir + "/model.safetensors");
  // transformers 5.17's own on-disk names for LlavaForConditionalGeneration.
  for (const char* name : {"language_model.model.embed_tokens.weight", "language_model.model.layers.1.mlp.up_proj.weight",
                           "language_model.model.norm.weight", "language_model.lm_head.weight",
                           "vision_tower.encoder.layers.0.self_attn.q_proj.bias",
                           "vision_tower.embeddings.patch_embedding.weight", "multi_modal_projector.linear_2.weight",
                           "state_projector.weight"})
    EXPECT_EQ(st.count(name), 1u) << name;
  EXPECT_EQ(st.size(), m.params_info().size());
  // Every spelling transformers uses for the same tensor reads back to it.
  for (const auto& [file, table] : std::vector<std::pair<std::string, std::string>>{
           {"model.language_model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"},
           {"language_model.model.norm.weight", "model.norm.weight"},
           {"language_model.lm_head.weight", "lm_head.weight"},
           {"vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias",
            "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias"},
           {"model.vision_tower.encoder.layers.0.mlp.fc1.bias",
            "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias"},
           {"model.multi_modal_projector.linear_1.weight", "model.multi_modal_projector.linear_1.weight"},
           {"multi_modal_projector.linear_1.weight", "model.multi_modal_projector.linear_1.weight"}})
    EXPECT_EQ(table_tensor_name(c, file), table) << file;
  std::ifstream in(dir + "/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("architectures")[0], "LlavaForConditionalGeneration");
  EXPECT_EQ(j.at("model_type"), "llava");
  EXPECT_EQ(j.at("text_config").at("model_type"), "qwen3");
  EXPECT_EQ(j.at("vision_config").at("model_type"), "siglip_vision_model");
  EXPECT_EQ(j.at("vision_feature_select_strategy"), "full");
  EXPECT_EQ(j.at("image_seq_length"), 4);
  // A SigLIP checkpoint's pooling head and post_layernorm (unused by LLaVA) are skipped on read.
  write_weights(dir, m, [&](std::vector<StWriteTensor>& ts) {
    for (StWriteTensor& t : ts) t.name = hf_tensor_name(c, t.name);
    static const float extra[8] = {};
    ts.push_back({"vision_tower.post_layernorm.weight", {8}, extra, nullptr});
  });
  Model<float> m3(c2);
  load_hf_weights(dir, m3);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m3.params()[i], m.params()[i]) << i;
  j["vision_feature_select_strategy"] = "default";
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg.json"); }, {"cfg.json", "vision_feature_select_strategy", "full"});
  j["vision_feature_select_strategy"] = "full";
  // Any one hidden state of the tower (LLaVA-1.5 reads -2), round-tripped through config.json; a
  // list (several layers concatenated) or an index past the tower is an error naming the key.
  j["vision_feature_layer"] = -2;
  const ModelConfig c3 = ModelConfig::from_hf_json(j, "cfg.json");
  EXPECT_EQ(c3.vision.vision_feature_layer, -2);
  EXPECT_EQ(c3.vision.feature_layers(), 1);
  EXPECT_EQ(c3.to_hf_json().at("vision_feature_layer"), -2);
  j["vision_feature_layer"] = nlohmann::json::array({-2, -1});
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg.json"); }, {"cfg.json", "vision_feature_layer", "not a list"});
  // Absent keys are LlavaConfig's defaults: -2, and the "default" strategy (refused).
  j.erase("vision_feature_layer");
  EXPECT_EQ(ModelConfig::from_hf_json(j, "cfg.json").vision.vision_feature_layer, -2);
  j.erase("vision_feature_select_strategy");
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg.json"); },
               {"cfg.json", "vision_feature_select_strategy absent", "full"});
  j["vision_feature_select_strategy"] = "full";
  j["vision_feature_layer"] = -4;
  expect_error([&] { ModelConfig::from_hf_json(j, "cfg.json"); }, {"cfg.json", "vision.vision_feature_layer", "[-3, 2]"});
}

TEST(HfIo, DoubleModelSavesBf16) {
  const ModelConfig c = tiny_config("qwen3", false);
  Model<double> m(c);
  m.init(1);
  const std::string dir = temp_dir("bf16");
  save_hf(dir, m, "BF16");
  std::ifstream in(dir + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(in).at("torch_dtype"), "bfloat16");
  Model<double> m2(read_hf_config(dir));
  load_hf_weights(dir, m2);
  for (int64_t i = 0; i < m.num_params(); ++i) {
    // BF16 keeps 8 significant bits: round to nearest errs by at most 2^-8 relative.
    ASSERT_NEAR(m2.params()[i], m.params()[i], std::fabs(m.params()[i]) * 0x1p-8) << i;
  }
  EXPECT_THROW(save_hf(dir, m, "F16"), Error);
}

TEST(HfIo, TiedModelIgnoresLmHeadOnRead) {
  const ModelConfig c = tiny_config("llama", true);
  Model<float> m(c);
  m.init(3);
  const std::string dir = temp_dir("tied_extra");
  std::vector<float> lm(11 * 8, 0.5f);
  write_weights(dir, m, [&](std::vector<StWriteTensor>& ts) { ts.push_back({"lm_head.weight", {11, 8}, lm.data(), nullptr}); });
  Model<float> m2(c);
  load_hf_weights(dir, m2);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m2.params()[i], m.params()[i]);
}

TEST(HfIo, MissingWrongShapeAndExtraTensorsNameTensorAndFile) {
  const ModelConfig c = tiny_config("qwen3", false);
  Model<float> m(c);
  m.init(3);
  const std::string file_part = "model.safetensors";

  const std::string d1 = temp_dir("missing");
  write_weights(d1, m, [](std::vector<StWriteTensor>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(),
                            [](const StWriteTensor& t) { return t.name == "model.layers.1.self_attn.k_norm.weight"; }),
             ts.end());
  });
  Model<float> m2(c);
  m2.init(9);
  const std::vector<float> before(m2.params(), m2.params() + m2.num_params());
  expect_error([&] { load_hf_weights(d1, m2); }, {"model.layers.1.self_attn.k_norm.weight", file_part, "missing"});
  // A failed load leaves the model as it was.
  for (int64_t i = 0; i < m2.num_params(); ++i) ASSERT_EQ(m2.params()[i], before[i]);

  const std::string d2 = temp_dir("shape");
  write_weights(d2, m, [](std::vector<StWriteTensor>& ts) {
    for (StWriteTensor& t : ts)
      if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {8, 12};
  });
  expect_error([&] { load_hf_weights(d2, m2); }, {"model.layers.0.mlp.up_proj.weight", file_part, "(8, 12)", "(12, 8)"});

  const std::string d3 = temp_dir("extra");
  const float x = 1;
  write_weights(d3, m, [&](std::vector<StWriteTensor>& ts) { ts.push_back({"model.layers.0.self_attn.q_proj.bias", {1}, &x, nullptr}); });
  expect_error([&] { load_hf_weights(d3, m2); }, {"model.layers.0.self_attn.q_proj.bias", file_part, "unexpected"});

  expect_error([&] { load_hf_weights(temp_dir("empty"), m2); }, {"model.safetensors", "not found"});

  // The same checks from the headers alone, against a config's table (no model built): a
  // config.json claiming a vocabulary of 2^24 names the weights' real shape.
  ModelConfig huge = c;
  huge.vocab_size = int64_t{1} << 24;
  expect_error([&] { check_hf_weight_shapes(d3, c, param_table(c)); },
               {"model.layers.0.self_attn.q_proj.bias", file_part, "unexpected"});
  const std::string good = temp_dir("good");
  write_weights(good, m, [](std::vector<StWriteTensor>&) {});
  EXPECT_NO_THROW(check_hf_weight_shapes(good, c, param_table(c)));
  expect_error([&] { check_hf_weight_shapes(good, huge, param_table(huge)); },
               {"lm_head.weight", file_part, "has shape (11, 8), expected (16777216, 8)"});
}

TEST(HfIo, ShardedCheckpointLoads) {
  const ModelConfig c = tiny_config("llama", false);
  Model<float> m(c);
  m.init(8);
  const std::string dir = temp_dir("sharded");
  std::filesystem::create_directories(dir);
  std::vector<StWriteTensor> a, b;
  nlohmann::json map;
  for (const ParamInfo& p : m.params_info()) {
    const bool first = p.offset < m.num_params() / 2;
    (first ? a : b).push_back({p.name, p.shape, m.params() + p.offset, nullptr});
    map[p.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", a, "F32");
  write_safetensors(dir + "/model-00002-of-00002.safetensors", b, "F32");
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", map}}.dump();
  Model<float> m2(c);
  load_hf_weights(dir, m2);
  for (int64_t i = 0; i < m.num_params(); ++i) ASSERT_EQ(m2.params()[i], m.params()[i]);
  // A shard that cannot be read after another was: an error naming it, the model as it was.
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  Model<float> m3(c);
  m3.init(11);
  const std::vector<float> before(m3.params(), m3.params() + m3.num_params());
  expect_error([&] { load_hf_weights(dir, m3); }, {"model-00002-of-00002.safetensors", "cannot open"});
  for (int64_t i = 0; i < m3.num_params(); ++i) ASSERT_EQ(m3.params()[i], before[i]);
}

// --- config.json mapping ---

nlohmann::json qwen3_0p6b_config() {
  // The fields of Qwen/Qwen3-0.6B's config.json.
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(HfConfig, ReadsQwen3Config) {
  const ModelConfig c = ModelConfig::from_hf_json(qwen3_0p6b_config(), "q/config.json");
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads = 64
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.vocab_size, 151936);
}

TEST(HfConfig, LlamaDefaults) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})");
  const ModelConfig c = ModelConfig::from_hf_json(j, "l/config.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_FALSE(c.tie_word_embeddings);
  const nlohmann::json out = c.to_hf_json("float32");
  EXPECT_EQ(out.at("mlp_bias"), false);
  EXPECT_EQ(out.at("head_dim"), 16);
  expect_same_config(ModelConfig::from_hf_json(out, "x"), c);
}

TEST(HfConfig, ReadsRopeParametersOfNewerTransformers) {
  nlohmann::json j = qwen3_0p6b_config();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000000.0}};
  EXPECT_EQ(ModelConfig::from_hf_json(j, "n/config.json").rope_theta, 5e6);
  j["rope_parameters"]["rope_type"] = "yarn";
  expect_error([&] { ModelConfig::from_hf_json(j, "n/config.json"); }, {"n/config.json", "rope_type", "unsupported"});
  j = qwen3_0p6b_config();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  expect_error([&] { ModelConfig::from_hf_json(j, "n/config.json"); }, {"n/config.json", "disagree"});
}

TEST(HfConfig, RejectsWhatTheDecoderCannotRepresent) {
  const std::string where = "some/dir/config.json";
  auto with = [](const char* key, nlohmann::json v) {
    nlohmann::json j = qwen3_0p6b_config();
    j[key] = v;
    return j;
  };
  expect_error([&] { ModelConfig::from_hf_json(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}), where); },
               {where, "rope_scaling", "unsupported"});
  expect_error([&] { ModelConfig::from_hf_json(with("attention_bias", true), where); }, {where, "attention_bias"});
  expect_error([&] { ModelConfig::from_hf_json(with("hidden_act", "gelu"), where); }, {where, "hidden_act"});
  expect_error([&] { ModelConfig::from_hf_json(with("model_type", "mistral"), where); }, {where, "mistral"});
  expect_error([&] { ModelConfig::from_hf_json(with("num_key_value_heads", 3), where); },
               {where, "num_key_value_heads"});
  expect_error([&] { ModelConfig::from_hf_json(with("hidden_size", "big"), where); }, {where, "hidden_size"});
  nlohmann::json j = qwen3_0p6b_config();
  j.erase("vocab_size");
  expect_error([&] { ModelConfig::from_hf_json(j, where); }, {where, "vocab_size"});
}

TEST(HfConfig, ValidateNamesTheField) {
  ModelConfig c = tiny_config("qwen3", false);
  c.head_dim = 5;
  expect_error([&] { c.validate(); }, {"head_dim"});
  c = tiny_config("qwen3", false);
  c.intermediate_size = 0;
  expect_error([&] { c.validate(); }, {"intermediate_size"});
  c = tiny_config("qwen3", false);
  c.architecture = "gpt2";
  expect_error([&] { c.validate(); }, {"architecture", "gpt2"});
  c = tiny_config("qwen3", false);
  c.rms_norm_eps = 0;
  expect_error([&] { c.validate(); }, {"rms_norm_eps"});
  c.rms_norm_eps = 1e308;  // finite, but it would swamp every mean square
  expect_error([&] { c.validate(); }, {"rms_norm_eps", "at most 1", "1e+308"});
  c = tiny_config("qwen3", false);
  c.rope_theta = -1;
  expect_error([&] { c.validate(); }, {"rope_theta"});
  c = tiny_config("qwen3", false);
  c.num_key_value_heads = 3;
  expect_error([&] { c.validate(); }, {"num_attention_heads", "num_key_value_heads"});
  EXPECT_NO_THROW(tiny_config("llama", true).validate());
}

TEST(HfConfig, ReadHfConfigNamesTheFile) {
  const std::string dir = temp_dir("badcfg");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << "{ not json";
  expect_error([&] { read_hf_config(dir); }, {dir + "/config.json", "invalid JSON"});
  expect_error([&] { read_hf_config(temp_dir("nocfg")); }, {"config.json", "cannot open"});
}

}  // namespace
}  // namespace tt::model
