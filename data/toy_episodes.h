// Generated robot episodes with PNG frames (issue 16), for configs/vla_tiny.yaml and the tests:
// every step's frame is a dark image with one bright square at a random place; the step's
// continuous action is the square's centre, normalised to [-1, 1] per axis, so only a policy that
// reads the frame predicts it (the state holds the step's progress t / T and a constant, which say
// nothing about the square). Written as the `episodes` format (data/episodes.h): one JSONL line an
// episode, frames as frames/<episode>_<step>.png beside the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tt::data {

struct ToyEpisodeSpec {
  int num_episodes = 32;
  int steps = 8;
  int image_size = 16;  // frames are image_size x image_size
  int square = 4;       // side of the square
  uint64_t seed = 1;
  std::vector<int32_t> instruction = {2, 3, 4};
};

// Writes `path` and its frames/ folder (created); returns the number of frames written.
int64_t write_toy_episodes(const ToyEpisodeSpec& spec, const std::string& path);

}  // namespace tt::data
