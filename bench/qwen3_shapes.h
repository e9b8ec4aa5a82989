// The model shapes the benchmarks time: Qwen3-1.7B (hidden 2048, 16 heads, 8 KV heads, head dim
// 128, intermediate 6144, vocab 151936, tied head; 28 layers unless `layers` says otherwise), and
// a ~2B Qwen3-Next-style hybrid (hybrid_2b).
#pragma once

#include "model/config.h"

namespace tt::bench {

inline model::ModelConfig qwen3_1_7b(int layers = 28) {
  model::ModelConfig c;
  c.architecture = "qwen3";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.tie_word_embeddings = true;
  c.initializer_range = 0.02;
  c.max_position_embeddings = 40960;
  return c;
}

// A ~2.0B dense Qwen3-Next-style hybrid (issue 15's end-to-end shape; configs/qwen3_next_2b.yaml
// is the same model, tests/trainer/config_test checks so): Qwen3-1.7B's hidden 2048, intermediate
// 6144, vocab 151936 and tied head; 24 layers, three Gated DeltaNet layers to one gated attention
// layer (Qwen3-Next's 3 : 1); the GDN layers have Qwen3-Next-80B's linear heads (16 key heads, 32
// value heads, head dims 128, conv kernel 4), the attention layers its 16 query heads (each with
// its output gate) and 2 KV heads of head dim 256 with RoPE on a quarter of each head;
// zero-centred norms. (Until 2026-12-03 the attention head dim was 128, the CUDA kernels' largest
// then: docs/BENCHMARKS.md says which a figure used.)
inline model::ModelConfig hybrid_2b(int layers = 24) {
  model::ModelConfig c = qwen3_1_7b(layers);
  c.architecture = "qwen3_next";
  c.num_attention_heads = 16;
  c.num_key_value_heads = 2;
  c.head_dim = 256;
  c.partial_rotary_factor = 0.25;
  c.layer_types.clear();
  for (int l = 0; l < layers; ++l) c.layer_types.push_back(l % 4 == 3 ? "full_attention" : "linear_attention");
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  return c;
}

}  // namespace tt::bench
