// `treetrain eval --env nav`: closed-loop evaluation of a trained VLA in the built-in navigation
// environment (data/nav_env.h), on layouts drawn from --seed (training data from `generate --kind
// nav-episodes` uses another stream, so they are held out). Each step renders the frame, appends
// it to the context the model was trained on (model/policy.h: the instruction and the history of
// the checkpoint's data.history, in the KV cache), decodes the action token greedily among the
// four action ids and executes it. Reported beside the model: a uniformly random policy and the
// same model with every frame black ("zeroed images": a policy that ignores vision scores the
// same as the model). CPU backend (the policy's one-step decode runs there; training runs on either).
// The longest context a step reads (the instruction and a frame per step of max_steps, or of the
// window's steps) must fit the model's max_position_embeddings: an error naming --max-steps or
// --window otherwise, before any rollout; the KV cache holds just that context.
#pragma once

#include <cstdint>
#include <string>

#include "data/nav_env.h"

namespace tt::trainer {

struct NavEvalOptions {
  std::string checkpoint;  // a run_dir (its newest checkpoint) or a checkpoint folder
  int64_t episodes = 50;
  uint64_t seed = 7777;
  data::NavSpec spec;      // image_size comes from the checkpoint's vision.image_size
  int window = -1;         // -1: the checkpoint's data.history (0 without a config.yaml)
};

struct NavScore {
  double success = 0, spl = 0;
};

struct NavEvalResult {
  std::string checkpoint;
  int64_t episodes = 0;
  uint64_t seed = 0;
  int window = 0;
  NavScore model, random, zeroed;
  double mean_steps = 0;  // the model's actions per episode
};

NavEvalResult run_nav_eval(const NavEvalOptions& opt);
std::string to_json(const NavEvalResult& r);

}  // namespace tt::trainer
