// A small built-in navigation environment (issue 17), for the VLA quickstart, closed-loop
// evaluation and CI: a square room of `size` x `size` cells inside a border wall, a few interior
// wall blocks, `landmarks` coloured landmark blocks (red, green, blue, yellow), and an agent on a
// cell facing one of four headings. The R2R-CE action space: stop, forward (one cell, when it is
// free), turn left, turn right (90 degrees). The instruction names one landmark; an episode
// succeeds when the agent stops within `success_radius` cells (centre to centre) of it. SPL =
// success x shortest / max(shortest, taken), path lengths counted in actions before the stop.
//
// Frames are first-person RGB at the tower's resolution, ray cast per column (90 degree field of
// view, one DDA ray a column: walls grey, landmarks in their colour, both darker with distance;
// ceiling and floor flat). The expert follows a shortest path (BFS over cell x heading) to a cell
// next to the landmark, facing it, then stops; the layout, goal and start pose come from the seed.
//
// Token ids (a small fixed vocabulary): 0 the image placeholder, 1 the state placeholder, 2 "go
// to", 3 + k landmark k's colour; actions are action_base + NavAction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"

namespace tt::data {

enum NavAction : int { kNavStop = 0, kNavForward = 1, kNavLeft = 2, kNavRight = 3 };
constexpr int kNavActions = 4;
const char* nav_action_name(int a);

struct NavSpec {
  int size = 5;         // interior cells per side
  int landmarks = 3;    // 3 or 4
  int walls = 2;        // interior wall blocks
  int image_size = 16;  // frames are image_size x image_size
  int max_steps = 24;   // an episode stops (unsuccessfully unless at the goal) after this many actions
  double success_radius = 1.0;
  int32_t action_base = 8;  // token id of NavAction 0
  // Throws tt::Error naming the field for a value out of range.
  void validate() const;
};

class NavEnv {
 public:
  // The layout, the goal and the start pose of `seed` (every seed gives a solvable episode).
  NavEnv(const NavSpec& spec, uint64_t seed);

  const NavSpec& spec() const { return spec_; }
  int goal() const { return goal_; }
  std::vector<int32_t> instruction() const;  // {2, 3 + goal}
  Image render() const;
  // Takes one action (stop ends the episode; so does the max_steps-th action).
  void step(int action);
  bool done() const { return done_; }
  bool at_goal() const;  // within success_radius of the goal landmark
  bool success() const { return stopped_ && at_goal(); }
  int steps_taken() const { return steps_; }
  int shortest() const { return shortest_; }  // actions from the start to the nearest expert stop pose
  double spl() const;
  // The expert's next action from the current pose: a shortest path's, stop once there.
  int expert_action() const;

 private:
  bool solid(int x, int y) const;
  int cell(int x, int y) const { return y * w_ + x; }
  std::vector<int> expert_distance() const;  // BFS distance to a stop pose, per (cell, heading)

  NavSpec spec_;
  int w_ = 0;                  // size + 2 (border)
  std::vector<int> map_;       // (w x w) 0 free, 1 wall, 2 + k landmark k
  std::vector<int> lx_, ly_;   // landmark cells
  int goal_ = 0;
  int x_ = 0, y_ = 0, h_ = 0;  // agent cell and heading (0 north, 1 east, 2 south, 3 west)
  int steps_ = 0, shortest_ = 0;
  bool done_ = false, stopped_ = false;
  std::vector<int> dist_;  // expert_distance(), computed once
};

// Layout seed of episode e of a stream `seed` (generate and eval draw from different streams).
uint64_t nav_layout_seed(uint64_t seed, int64_t e);

// Expert episodes in the `episodes` format (data/episodes.h): per step the frame (PNG, frames/
// beside `path`) and the expert's action as action_ids [action_base + a]. With noise > 0 the
// executed move is a random non-stop action with that probability (the label stays the expert's
// from the state reached), so the data covers states off the shortest path. Returns the frames.
int64_t write_nav_episodes(const NavSpec& spec, int64_t num_episodes, uint64_t seed, double noise,
                           const std::string& path);

}  // namespace tt::data
