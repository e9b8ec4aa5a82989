// Benchmark of the CUDA tree attention (ops/cuda/attention.h) on a packed batch.
//
// Times forward + backward with CUDA events after warm-up and reports medians, with TFLOP/s of
// visible (query, key) pairs: 4 HS NH FLOPs per pair forward, 10 backward, 14 in all (the
// convention of FlashAttention's causal accounting, applied to the tree's pairs). Inputs are
// random bf16, never zeros. The layout can be dumped (subtree_end and pos as int32 .npy) so that
// scripts/device/attention_compare.py times PyTorch FlexAttention with the same tree mask and
// dense causal SDPA at the same length, in the same run.
#pragma once

#include <cstdint>
#include <string>

#include "data/packing.h"

namespace tt::trainer {

struct AttentionBenchOptions {
  int heads = 16;
  int kv_heads = 16;
  int head_dim = 128;
  int warmup = 3;
  int iters = 10;
  uint64_t seed = 1;
};

struct AttentionBenchResult {
  std::string workload;
  int n = 0, heads = 0, kv_heads = 0, head_dim = 0, trees = 0, nodes = 0;
  int64_t visible_pairs = 0;
  double fwd_ms = 0, bwd_ms = 0, total_ms = 0;           // medians
  double fwd_tflops = 0, bwd_tflops = 0, total_tflops = 0;  // of visible pairs
  // Tile occupancy: visible pairs over the pairs of the tiles that hold at least one visible pair
  // (the tiles a kernel that skips empty tiles computes), for the forward's 128 x 128 and the
  // backward's 64 x 128 (query x key) tiles.
  double fwd_occupancy = 0, bwd_occupancy = 0;
};

// Visible pairs / pairs of the (bm queries x bn keys) tiles holding a visible pair (key j is seen
// by queries j .. subtree_end[j] - 1); 1 for a layout whose every touched tile is full.
double tile_occupancy(const data::PackedBatch& batch, int bm, int bn);

// Runs the benchmark on the GPU (throws tt::Error on CUDA errors or bad shapes).
AttentionBenchResult bench_attention(const data::PackedBatch& batch, const std::string& workload,
                                     const AttentionBenchOptions& opt);

// One JSON object, one line.
std::string to_json(const AttentionBenchResult& r);

// Writes <prefix>subtree_end.npy and <prefix>pos.npy (int32, shape (N,)).
void dump_layout_npy(const data::PackedBatch& batch, const std::string& prefix);

// The public workloads, one tree each:
// a navigation-episode comb: a prefix, then `steps` steps of a history node on the trunk and a
// leaf (observation + action) hanging off it;
data::Tree episode_comb_tree(int prefix_len = 512, int steps = 40, int history_len = 128, int leaf_len = 256);
// an agent rollout tree: a prompt, then `turns` turns of about turn_len tokens (lengths jittered
// by up to +-jitter, fixed by seed), `branches` children at each of the first branch_turns turns.
data::Tree agent_rollout_tree(int prompt_len = 4096, int turns = 6, int turn_len = 1024, int branches = 4,
                              int branch_turns = 2, int jitter = 64, uint64_t seed = 1);
// one chain of n tokens: plain causal attention, for the kernel's own dense baseline.
data::Tree causal_tree(int n);
// Fine-grained trees (issue 20), fixed shapes and seeds:
// "comb_short": a navigation comb with short history nodes: prefix 1024, 200 steps of a 24-token
// history node and a 40-token leaf (13,824 tokens);
// "trunk": a long trunk of nodes of 5..40 tokens, one in ten of one token, each with a leaf of
// 8..24 tokens, seed 7, up to 16,384 tokens.
data::Tree comb_short_tree();
data::Tree trunk_tree(int max_tokens = 16384, uint64_t seed = 7);
// A workload by its bench name: comb, rollout, agent_short (bench/train_bench's agent tree: a
// 4096-token prompt, 6 turns of 160 tokens, 4 x 4 branches; 17,536 tokens), causal (n tokens),
// comb_short or trunk, with the defaults above. Throws tt::Error naming the expected names.
data::Tree workload_tree(const std::string& name, int n);

// One tree packed alone as training packs it (data::pack, tree packing), its children in `order`
// (data::Tree::preorder; kListed is the layout before 2026-12-03, kept for comparisons).
data::PackedBatch pack_one(const data::Tree& tree, data::ChildOrder order = data::ChildOrder::kLargestFirst);

}  // namespace tt::trainer
