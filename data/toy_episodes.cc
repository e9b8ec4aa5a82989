// Generated robot episodes with PNG frames (see toy_episodes.h).
#include "data/toy_episodes.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "data/episodes.h"
#include "data/image.h"
#include "data/rng.h"

namespace tt::data {

int64_t write_toy_episodes(const ToyEpisodeSpec& s, const std::string& path) {
  TT_CHECK(s.num_episodes >= 1 && s.steps >= 1 && s.square >= 1 && s.image_size > s.square, "toy episodes: ",
           s.num_episodes, " episodes of ", s.steps, " steps, ", s.image_size, "-pixel frames with a ", s.square,
           "-pixel square: expected at least one of each and a square smaller than the frame");
  GeneratedEpisodes gen(path);  // a failure below leaves an earlier dataset at `path` whole
  SplitMix64 rng(mix64(s.seed) ^ 0x7e1a0000ULL);
  const int span = s.image_size - s.square;  // top-left corners 0..span
  int64_t written = 0;
  for (int e = 0; e < s.num_episodes; ++e) {
    nlohmann::json ep;
    ep["id"] = str("toy-", e);
    ep["instruction"] = s.instruction;
    nlohmann::json steps = nlohmann::json::array();
    for (int t = 0; t < s.steps; ++t) {
      const int x0 = (int)rng.below((uint64_t)span + 1), y0 = (int)rng.below((uint64_t)span + 1);
      Image img;
      img.width = img.height = s.image_size;
      img.rgb.assign((size_t)s.image_size * s.image_size * 3, 16);
      for (int y = y0; y < y0 + s.square; ++y)
        for (int x = x0; x < x0 + s.square; ++x) {
          uint8_t* p = img.rgb.data() + ((size_t)y * s.image_size + x) * 3;
          p[0] = 240, p[1] = 200, p[2] = 40;
        }
      const std::string name = gen.frame_name(e, t);
      write_png(gen.frame_file(name), img);
      ++written;
      const double cx = 2.0 * x0 / span - 1.0, cy = 2.0 * y0 / span - 1.0;
      steps.push_back({{"images", {name}}, {"state", {(double)t / s.steps, 1.0}}, {"action", {cx, cy}}});
    }
    ep["steps"] = steps;
    gen.jsonl() << ep.dump() << "\n";
  }
  gen.commit();
  return written;
}

}  // namespace tt::data
