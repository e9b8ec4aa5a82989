// Fixtures of the VLA tests (tests/equivalence/vla_test.cc, tests/model/vision_test.cc): a tiny
// VLA config (SigLIP tower of 4-pixel frames, 2 x 2 patches: 4 tokens a frame; LLaVA projector;
// state projection) and robot episodes whose frames are in-memory pixels, drawn per (step,
// camera) from a seed, so no test depends on image files.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "data/episode_tree.h"
#include "data/episodes.h"
#include "data/frames.h"
#include "data/packing.h"
#include "model/config.h"

namespace tt::testing {

// Decoder V=24, C=8, I=12, 2 layers, NH=2, NKV=1, HS=4; tower D=8, I=12, 2 layers, 2 heads, image
// 4, patch 2 (P = 4); state_dim 3 (state rows: id 1; image rows: id 0).
inline model::ModelConfig tiny_vla_config(bool freeze = false, int tower_layers = 2) {
  model::ModelConfig c;
  c.architecture = "qwen3";
  c.vocab_size = 24;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.initializer_range = 0.3;
  c.max_position_embeddings = 256;
  model::VisionConfig& v = c.vision;
  v.hidden_size = 8;
  v.intermediate_size = 12;
  v.num_hidden_layers = tower_layers;
  v.num_attention_heads = 2;
  v.image_size = 4;
  v.patch_size = 2;
  v.image_token_index = 0;
  v.state_dim = 3;
  v.state_token_index = 1;
  v.freeze = freeze;
  return c;
}

// An episode of `steps` steps, `cameras` frames a step, a 3-value state, and 2 discrete action
// ids a step (ids 10..23); instruction [5, 6, 7].
inline data::Episode tiny_episode(int steps, int cameras, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> act(10, 23);
  std::normal_distribution<float> st(0.f, 1.f);
  data::Episode ep;
  ep.id = "ep" + std::to_string(seed);
  ep.instruction = {5, 6, 7};
  for (int s = 0; s < steps; ++s) {
    data::EpisodeStep step;
    for (int c = 0; c < cameras; ++c) step.images.push_back("mem:" + std::to_string(s) + ":" + std::to_string(c));
    step.state = {st(rng), st(rng), st(rng)};
    step.action_ids = {act(rng), act(rng)};
    ep.steps.push_back(step);
  }
  return ep;
}

// Pixels (3, S, S) of frame (step, camera), from the seed.
inline std::shared_ptr<const std::vector<float>> frame_pixels(int S, int step, int camera, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + (uint64_t)step * 101 + (uint64_t)camera);
  std::normal_distribution<float> n(0.f, 1.f);
  auto px = std::make_shared<std::vector<float>>((size_t)3 * S * S);
  for (float& x : *px) x = n(rng);
  return px;
}

// The episode's tree (window 0: full history) with in-memory frames.
inline data::Tree vla_tree(const data::Episode& ep, int window, const model::ModelConfig& cfg, uint64_t pixel_seed) {
  data::EpisodeTreeSpec spec;
  spec.tokens_per_frame = (int)cfg.vision.tokens_per_frame();
  spec.image_token = (int32_t)cfg.vision.image_token_index;
  spec.state_token = (int32_t)cfg.vision.state_token_index;
  spec.window = window;
  data::Tree t = data::episode_tree(ep, 0, nullptr, spec);
  for (data::FrameRef& f : t.media.frames) f.pixels = frame_pixels((int)cfg.vision.image_size, f.step, f.camera, pixel_seed);
  return t;
}

inline data::PackedBatch vla_batch(const data::Tree& t, data::Packing packing, const model::ModelConfig& cfg) {
  data::PackedBatch b = data::pack({&t}, packing);
  data::FrameSpec spec;
  spec.image_size = (int)cfg.vision.image_size;
  data::load_frames(b, spec);
  return b;
}

}  // namespace tt::testing
