// Closed-loop evaluation in the built-in navigation environment (see eval.h).
#include "trainer/eval.h"

#include <spdlog/spdlog.h>

#include <algorithm>
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

// capacity: cache rows, the longest context plus the action token.
// seg: the checkpoint's run's segments (on: the policy runs the segment operator as training did).
NavScore run_episodes(model::Decoder<model::CpuExec<float>>& m, const NavEvalOptions& opt, const data::NavSpec& spec,
                      int window, int64_t capacity, const model::SegmentConfig& seg, Policy kind, double* mean_steps) {
  model::VlaPolicy<model::CpuExec<float>> policy(m, window, capacity, seg);
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
  const model::ModelConfig cfg = read_checkpoint_config(dir);
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
  // The longest context a step reads: the instruction, then one frame of P rows per observation of
  // the history (every step's up to max_steps, or the window's). Its positions must be ones the
  // model was built for, as serve's are; checked here rather than after minutes of rollouts.
  const int64_t P = cfg.vision.tokens_per_frame();
  const int64_t instruction = (int64_t)data::NavEnv(spec, data::nav_layout_seed(opt.seed, 0)).instruction().size();
  const int64_t observed = window == 0 ? spec.max_steps : std::min<int64_t>(window, spec.max_steps);
  const int64_t context = instruction + observed * P;
  // With segments (the run trained with them; its config.yaml checked them against the model)
  // positions stay below the segment's, and a step adds one frame's rows and its action token.
  const model::SegmentConfig seg = checkpoint_segments(dir);
  if (!seg.enabled() && context > cfg.max_position_embeddings) {
    const int64_t fit = std::max<int64_t>(0, (cfg.max_position_embeddings - instruction) / P);
    const std::string win = opt.window >= 0 ? str("--window ", window)
                                            : str("the checkpoint's data.history window ", window, " (--window overrides it)");
    const std::string what = window == 0 ? str("--max-steps ", spec.max_steps, " with the full history")
                             : window < spec.max_steps ? win
                                                       : str("--max-steps ", spec.max_steps, " (within ", win, ")");
    const std::string fix = window == 0 ? str("--max-steps <= ", fit, " or --window W <= ", fit)
                            : window < spec.max_steps ? str("--window <= ", fit)
                                                      : str("--max-steps <= ", fit, " or --window <= ", fit);
    throw Error(str(what, ": the context of a step reaches ", instruction, " + ", observed, " x ", P, " = ", context,
                    " rows (the instruction, then ", P, " rows a frame), more than max_position_embeddings ",
                    cfg.max_position_embeddings, " of ", dir, "/config.json; expected ", fix));
  }
  const int64_t capacity = seg.enabled() ? P : context + 1;
  const std::unique_ptr<model::Decoder<model::CpuExec<float>>> model =
      load_inference_model<model::CpuExec<float>>(cfg, dir);
  model::Decoder<model::CpuExec<float>>& m = *model;
  NavEvalResult r;
  r.checkpoint = dir;
  r.episodes = opt.episodes;
  r.seed = opt.seed;
  r.window = window;
  spdlog::info("eval: {} nav episodes (seed {}, room {}x{}, {} landmarks, history {}{}) with {}", opt.episodes, opt.seed,
               spec.size, spec.size, spec.landmarks, window == 0 ? std::string("full") : str("window ", window),
               seg.enabled() ? str(", segments of ", seg.length, " tail ", seg.tail) : std::string(), dir);
  r.model = run_episodes(m, opt, spec, window, capacity, seg, Policy::kModel, &r.mean_steps);
  r.random = run_episodes(m, opt, spec, window, capacity, seg, Policy::kRandom, nullptr);
  r.zeroed = run_episodes(m, opt, spec, window, capacity, seg, Policy::kZeroed, nullptr);
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
