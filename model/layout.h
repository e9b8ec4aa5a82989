// The decoder's dimensions and per-layer parameter views, shared by the CPU (model.cc) and CUDA
// (cuda_model.cc) decoders so both read the flat parameter buffer of param_table() the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"

namespace tt::model {

// Parameter-table entries per layer, in the order param_table() writes them.
inline int tensors_per_layer(const ModelConfig& cfg) { return cfg.qk_norm() ? 11 : 9; }

struct Dims {
  int N, V, C, I, NH, NKV, HS, QD, KD, L;
  double eps, theta;
  bool qk_norm;
};

inline Dims dims_of(const ModelConfig& cfg, int N) {
  Dims d;
  d.N = N;
  d.V = (int)cfg.vocab_size;
  d.C = (int)cfg.hidden_size;
  d.I = (int)cfg.intermediate_size;
  d.NH = (int)cfg.num_attention_heads;
  d.NKV = (int)cfg.num_key_value_heads;
  d.HS = (int)cfg.head_dim;
  d.QD = d.NH * d.HS;
  d.KD = d.NKV * d.HS;
  d.L = (int)cfg.num_hidden_layers;
  d.eps = cfg.rms_norm_eps;
  d.theta = cfg.rope_theta;
  d.qk_norm = cfg.qk_norm();
  return d;
}

// One layer's weights or gradients: pointers into a flat buffer in param_table() order.
template <class P>
struct LayerParams {
  P* in_norm;    // (C)
  P* wq;         // (QD, C)
  P* wk;         // (KD, C)
  P* wv;         // (KD, C)
  P* wo;         // (C, QD)
  P* q_norm;     // (HS), qwen3 only
  P* k_norm;     // (HS), qwen3 only
  P* post_norm;  // (C)
  P* wg;         // (I, C)
  P* wu;         // (I, C)
  P* wd;         // (C, I)
};

template <class P>
LayerParams<P> layer_params(P* base, const std::vector<ParamInfo>& info, const ModelConfig& cfg, int l) {
  int k = 1 + l * tensors_per_layer(cfg);
  auto next = [&]() { return base + info[k++].offset; };
  LayerParams<P> p;
  p.in_norm = next();
  p.wq = next();
  p.wk = next();
  p.wv = next();
  p.wo = next();
  p.q_norm = cfg.qk_norm() ? next() : nullptr;
  p.k_norm = cfg.qk_norm() ? next() : nullptr;
  p.post_norm = next();
  p.wg = next();
  p.wu = next();
  p.wd = next();
  return p;
}

// The seed of tensor `name`'s init stream: the first splitmix64 output of the run seed, xor the
// FNV-1a hash of the name. Both decoders draw the same values from it (model.cc on the host,
// cuda_model_kernels.cu on the device).
inline uint64_t param_init_seed(uint64_t seed, const std::string& name) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return (z ^ (z >> 31)) ^ h;
}

}  // namespace tt::model
