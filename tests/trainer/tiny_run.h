// The tiny training run shared by the trainer and data-parallel tests: a small qwen3 on 12
// synthetic rollout trees written to dir/data.jsonl, run_dir dir/run, CPU backend, micro-batches
// of <= 40 tokens, grad_accum 2, 6 steps (use_combs swaps in four episode combs). Tests override
// what they vary.
#pragma once

#include <filesystem>

#include "data/synthetic.h"
#include "trainer/config.h"

namespace tt::trainer::testing {

inline RunConfig tiny_run_config(const std::filesystem::path& dir) {
  data::SyntheticSpec spec;
  spec.kind = "rollouts";
  spec.num_trees = 12;
  spec.vocab_size = 32;
  spec.seed = 3;
  spec.prompt_len = 6;
  spec.turns = 2;
  spec.turn_len = 4;
  spec.branches = 2;
  spec.branch_turns = 1;
  data::write_jsonl(spec, (dir / "data.jsonl").string());
  RunConfig c;
  c.source = "test";
  c.run_dir = (dir / "run").string();
  c.device = "cpu";
  c.model.vocab_size = 32;
  c.model.hidden_size = 16;
  c.model.intermediate_size = 32;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 2;
  c.model.num_key_value_heads = 1;
  c.model.head_dim = 8;
  c.model.max_position_embeddings = 128;
  c.data.path = (dir / "data.jsonl").string();
  c.data.format = "rollouts";
  c.data.max_tokens_per_batch = 40;
  c.train.max_steps = 6;
  c.train.seed = 7;
  c.train.grad_accum = 2;
  c.train.keep_checkpoints = 0;
  c.optim.lr = 1e-2;
  c.optim.weight_decay = 0.1;
  c.schedule.warmup_steps = 1;
  c.validate();
  return c;
}

// Unique tokens of one comb of use_combs (12 + 3 x (4 + 6)).
constexpr int64_t kTinyCombTokens = 42;

// Points c at four episode combs of kTinyCombTokens unique tokens each (tree format), written to
// dir/combs.jsonl; the caller validates after its own overrides.
inline void use_combs(RunConfig& c, const std::filesystem::path& dir) {
  data::SyntheticSpec spec;
  spec.kind = "comb";
  spec.num_trees = 4;
  spec.vocab_size = 32;
  spec.seed = 5;
  spec.prefix_len = 12;
  spec.steps = 3;
  spec.history_len = 4;
  spec.leaf_len = 6;
  data::write_jsonl(spec, (dir / "combs.jsonl").string());
  c.data.path = (dir / "combs.jsonl").string();
  c.data.format = "tree";
}

}  // namespace tt::trainer::testing
