// Tree attention, CPU reference: the one attention primitive of treetrain.
//
// Queries of a DFS-packed batch attend to (a) their ancestors inside the packed tree and
// (b) optional external KV prefixes (a parent partition's gateway, a carried KV tail, a
// retrieval prefix). Visibility inside the tree comes from DFS intervals: the packed batch is a
// list of nodes in DFS order; a query in node n sees the tokens of n up to itself and every token
// of n's ancestor nodes (with AttnLayout::bidirectional: all of n). No N x N mask is built: keys are enumerated node by node along the
// ancestor chain. External prefix e is visible to queries in [q_begin, q_end) of the KV heads in
// its head set, and is read before the tree's own keys. Grouped-query attention: query head h reads KV head h / (NH / NKV).
//
// Forward saves lse (N, NH) (natural log of the softmax denominator, scale included).
// Gradient contract: dq, dk, dv are overwritten; an external prefix's dk/dv are accumulated (+=)
// when non-null (gradients on), skipped when null (gradients off).
#pragma once
#include <cstdint>

namespace tt::cpu {

// The DFS structure of a packed batch. Nodes are in DFS order with contiguous token ranges;
// node_parent[n] < n, or -1 for the root of a tree (several trees may share a batch and never
// see each other).
struct AttnLayout {
  int num_nodes = 0;
  const int32_t* node_start = nullptr;   // (num_nodes) first packed index of the node
  const int32_t* node_len = nullptr;     // (num_nodes)
  const int32_t* node_parent = nullptr;  // (num_nodes)
  // Visibility mode: false, causal inside a node (a query sees its node up to itself); true,
  // bidirectional inside a node (every query of a node sees all of it: an image's tokens in a
  // vision tower, each image a one-node tree). Ancestors and external prefixes are unchanged.
  bool bidirectional = false;
};

template <class T>
struct ExternalKV {
  const T* k = nullptr;  // (len, NKV, HS), after norms and RoPE
  const T* v = nullptr;  // (len, NKV, HS)
  T* dk = nullptr;       // (len, NKV, HS) +=; null: no gradient
  T* dv = nullptr;       // (len, NKV, HS) +=; null: no gradient
  int len = 0;
  int q_begin = 0;  // queries [q_begin, q_end) of the packed batch see this prefix
  int q_end = 0;
  // The KV heads that read this prefix: bit g set = KV head g and its query heads see it (a
  // segment's carried tail is read by the local heads only, its retrieval prefix by the
  // long-range heads); the others ignore it and give it no gradient. All heads by default.
  uint64_t heads = ~uint64_t(0);
  bool read_by(int g) const { return (heads >> g) & 1; }
};

// out (N, NH, HS), lse (N, NH); q (N, NH, HS); k, v (N, NKV, HS).
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const AttnLayout& layout,
                       const ExternalKV<T>* ext, int n_ext, int N, int NH, int NKV, int HS);

// dq (N, NH, HS), dk, dv (N, NKV, HS) overwritten.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const AttnLayout& layout, const ExternalKV<T>* ext,
                        int n_ext, int N, int NH, int NKV, int HS);

}  // namespace tt::cpu
