// The model shape the benchmarks time: Qwen3-1.7B (hidden 2048, 16 heads, 8 KV heads, head dim
// 128, intermediate 6144, vocab 151936, tied head; 28 layers unless `layers` says otherwise).
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

}  // namespace tt::bench
