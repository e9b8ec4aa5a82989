// Closed-loop evaluation in the built-in navigation environment (see eval.h).
#include "trainer/eval.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "base/check.h"
#include "data/frames.h"
#include "data/image.h"
#include "data/rng.h"
#include "model/decoder.h"
#include "model/hf_io.h"
#include "model/policy.h"
#include "trainer/sample.h"

namespace tt::trainer {
namespace {

enum class Policy { kModel, kRandom, kZeroed };

NavScore run_episodes(model::Decoder<model::CpuExec<float>>& m, const NavEvalOptions& opt, const data::NavSpec& spec,
                      int window, Policy kind, double* mean_steps) {
  model::VlaPolicy<model::CpuExec<float>> policy(m, window);
  data::SplitMix64 rng(data::mix64(opt.seed) ^ 0x72616e64ULL);
  const int S = spec.image_size;
  NavScore score;
  int64_t steps = 0;
  for (int64_t e = 0; e < opt.episodes; ++e) {
    data::NavEnv env(spec, data::nav_layout_seed(opt.seed, e));
    policy.reset(env.instruction());
    while (!env.done()) {
      int action;
      if (kind == Policy::kRandom) {
        action = (int)rng.below(data::kNavActions);
      } else {
        data::Image img = env.render();
        if (kind == Policy::kZeroed) std::fill(img.rgb.begin(), img.rgb.end(), 0);
        model::Observation obs;
        const data::FrameSpec fs;  // the tower's normalisation, as training frames get it
        obs.frames.push_back(data::tower_pixels(img, S, fs.mean, fs.std));
        action = policy.act(obs, 1, spec.action_base, spec.action_base + data::kNavActions)[0] - spec.action_base;
      }
      env.step(action);
    }
    score.success += env.success();
    score.spl += env.spl();
    steps += env.steps_taken();
  }
  score.success /= (double)opt.episodes;
  score.spl /= (double)opt.episodes;
  if (mean_steps) *mean_steps = (double)steps / (double)opt.episodes;
  return score;
}

}  // namespace

NavEvalResult run_nav_eval(const NavEvalOptions& opt) {
  TT_CHECK(opt.episodes >= 1, "--episodes ", opt.episodes, ": expected >= 1");
  const std::string dir = resolve_checkpoint(opt.checkpoint);
  const model::ModelConfig cfg = model::read_hf_config(dir);
  if (!cfg.vision.enabled())
    throw Error(str(dir, "/config.json: a text model (no vision_config); eval --env nav needs a VLA checkpoint"));
  data::NavSpec spec = opt.spec;
  spec.image_size = (int)cfg.vision.image_size;
  spec.validate();
  if (spec.action_base + data::kNavActions > cfg.vocab_size)
    throw Error(str(dir, ": vocab_size ", cfg.vocab_size, " has no room for the nav action ids ", spec.action_base, "..",
                    spec.action_base + data::kNavActions - 1));
  if (cfg.vision.state_dim != 0)
    throw Error(str(dir, ": vision.state_dim ", cfg.vision.state_dim, ", but the nav environment has no state"));
  const int window = opt.window >= 0 ? opt.window : checkpoint_history_window(dir);
  const std::unique_ptr<model::Decoder<model::CpuExec<float>>> model =
      load_inference_model<model::CpuExec<float>>(cfg, dir);
  model::Decoder<model::CpuExec<float>>& m = *model;
  NavEvalResult r;
  r.checkpoint = dir;
  r.episodes = opt.episodes;
  r.seed = opt.seed;
  r.window = window;
  spdlog::info("eval: {} nav episodes (seed {}, room {}x{}, {} landmarks, history {}) with {}", opt.episodes, opt.seed,
               spec.size, spec.size, spec.landmarks, window == 0 ? std::string("full") : str("window ", window), dir);
  r.model = run_episodes(m, opt, spec, window, Policy::kModel, &r.mean_steps);
  r.random = run_episodes(m, opt, spec, window, Policy::kRandom, nullptr);
  r.zeroed = run_episodes(m, opt, spec, window, Policy::kZeroed, nullptr);
  return r;
}

std::string to_json(const NavEvalResult& r) {
  auto score = [](const NavScore& s) { return nlohmann::json{{"success", s.success}, {"spl", s.spl}}; };
  nlohmann::json j = {{"env", "nav"},
                      {"checkpoint", r.checkpoint},
                      {"episodes", r.episodes},
                      {"seed", r.seed},
                      {"history_window", r.window},
                      {"model", score(r.model)},
                      {"random", score(r.random)},
                      {"zeroed_images", score(r.zeroed)},
                      {"mean_steps", r.mean_steps}};
  return j.dump();
}

}  // namespace tt::trainer
