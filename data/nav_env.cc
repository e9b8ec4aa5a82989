// The built-in navigation environment (see nav_env.h).
#include "data/nav_env.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "data/episodes.h"
#include "data/rng.h"

namespace tt::data {
namespace {

constexpr int kDx[4] = {0, 1, 0, -1};  // north, east, south, west (y grows southwards)
constexpr int kDy[4] = {-1, 0, 1, 0};
constexpr uint8_t kColour[4][3] = {{220, 40, 40}, {40, 200, 60}, {50, 80, 230}, {230, 210, 40}};

}  // namespace

const char* nav_action_name(int a) {
  static const char* const kNames[kNavActions] = {"stop", "forward", "left", "right"};
  return a >= 0 && a < kNavActions ? kNames[a] : "?";
}

void NavSpec::validate() const {
  auto range = [](const char* key, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) throw Error(str("nav: ", key, " = ", v, ", expected a value in [", lo, ", ", hi, "]"));
  };
  range("size", size, 3, 64);
  range("landmarks", landmarks, 3, 4);
  range("walls", walls, 0, size * size / 4);
  range("image_size", image_size, 4, 1024);
  range("max_steps", max_steps, 1, 100000);
  range("success_radius", success_radius, 1.0, size);
  range("action_base", action_base, 3 + landmarks, 1 << 24);
}

NavEnv::NavEnv(const NavSpec& spec, uint64_t seed) : spec_(spec) {
  spec_.validate();
  const int n = spec_.size;
  w_ = n + 2;
  SplitMix64 rng(mix64(seed) ^ 0x6e61760000ULL);
  for (int attempt = 0;; ++attempt) {
    if (attempt >= 1000)
      throw Error(str("nav: no solvable layout in 1000 draws (layout seed ", seed, ") for a room of size ", n, " with ",
                      spec_.walls, " walls and ", spec_.landmarks, " landmarks; use fewer walls (--walls) or a larger "
                      "room (--size)"));
    map_.assign(w_ * w_, 0);
    for (int i = 0; i < w_; ++i) map_[cell(i, 0)] = map_[cell(i, w_ - 1)] = map_[cell(0, i)] = map_[cell(w_ - 1, i)] = 1;
    auto free_cell = [&](int* x, int* y) {
      do {
        *x = 1 + (int)rng.below(n);
        *y = 1 + (int)rng.below(n);
      } while (map_[cell(*x, *y)] != 0);
    };
    lx_.assign(spec_.landmarks, 0);
    ly_.assign(spec_.landmarks, 0);
    for (int k = 0; k < spec_.landmarks; ++k) {
      free_cell(&lx_[k], &ly_[k]);
      map_[cell(lx_[k], ly_[k])] = 2 + k;
    }
    for (int k = 0; k < spec_.walls; ++k) {
      int x, y;
      free_cell(&x, &y);
      map_[cell(x, y)] = 1;
    }
    goal_ = (int)rng.below(spec_.landmarks);
    free_cell(&x_, &y_);
    h_ = (int)rng.below(4);
    dist_ = expert_distance();
    const int d = dist_[cell(x_, y_) * 4 + h_];
    // Solvable, and not already at the goal: every free cell reachable from the start keeps the
    // room one region (no sealed-off pockets).
    bool connected = d > 0;
    if (connected) {
      std::vector<char> seen(w_ * w_, 0);
      std::deque<int> q = {cell(x_, y_)};
      seen[q.front()] = 1;
      int reached = 1, free = 0;
      for (int c = 0; c < w_ * w_; ++c) free += map_[c] == 0;
      while (!q.empty()) {
        const int c = q.front();
        q.pop_front();
        for (int h = 0; h < 4; ++h) {
          const int nc = c + kDx[h] + kDy[h] * w_;
          if (map_[nc] == 0 && !seen[nc]) {
            seen[nc] = 1;
            ++reached;
            q.push_back(nc);
          }
        }
      }
      connected = reached == free && !at_goal();
    }
    if (connected) {
      shortest_ = d;
      break;
    }
  }
}

std::vector<int32_t> NavEnv::instruction() const { return {2, 3 + goal_}; }

bool NavEnv::solid(int x, int y) const { return x < 0 || y < 0 || x >= w_ || y >= w_ || map_[cell(x, y)] != 0; }

bool NavEnv::at_goal() const {
  const double dx = x_ - lx_[goal_], dy = y_ - ly_[goal_];
  return std::sqrt(dx * dx + dy * dy) <= spec_.success_radius + 1e-9;
}

std::vector<int> NavEnv::expert_distance() const {
  // Stop poses: a free cell next to the goal landmark, facing it. BFS backwards from them.
  std::vector<int> dist(w_ * w_ * 4, -1);
  std::deque<int> q;
  for (int h = 0; h < 4; ++h) {
    const int x = lx_[goal_] - kDx[h], y = ly_[goal_] - kDy[h];  // facing h, the landmark ahead
    if (!solid(x, y)) {
      dist[cell(x, y) * 4 + h] = 0;
      q.push_back(cell(x, y) * 4 + h);
    }
  }
  while (!q.empty()) {
    const int s = q.front();
    q.pop_front();
    const int c = s / 4, h = s % 4;
    const int x = c % w_, y = c / w_;
    // Predecessors: a left turn from heading h + 1, a right turn from h + 3, a step forward from behind.
    int pred[3] = {c * 4 + (h + 1) % 4, c * 4 + (h + 3) % 4, -1};
    if (!solid(x - kDx[h], y - kDy[h])) pred[2] = cell(x - kDx[h], y - kDy[h]) * 4 + h;
    for (int p : pred)
      if (p >= 0 && dist[p] < 0) {
        dist[p] = dist[s] + 1;
        q.push_back(p);
      }
  }
  return dist;
}

int NavEnv::expert_action() const {
  const int d = dist_[cell(x_, y_) * 4 + h_];
  if (d <= 0) return kNavStop;
  const int fx = x_ + kDx[h_], fy = y_ + kDy[h_];
  if (!solid(fx, fy) && dist_[cell(fx, fy) * 4 + h_] == d - 1) return kNavForward;
  if (dist_[cell(x_, y_) * 4 + (h_ + 3) % 4] == d - 1) return kNavLeft;
  return kNavRight;
}

void NavEnv::step(int action) {
  TT_CHECK(!done_, "nav: step after the episode ended");
  TT_CHECK(action >= 0 && action < kNavActions, "nav: action ", action, ", expected 0..3");
  ++steps_;
  if (action == kNavStop) {
    stopped_ = true;
    done_ = true;
    return;
  }
  if (action == kNavForward && !solid(x_ + kDx[h_], y_ + kDy[h_])) {
    x_ += kDx[h_];
    y_ += kDy[h_];
  }
  if (action == kNavLeft) h_ = (h_ + 3) % 4;
  if (action == kNavRight) h_ = (h_ + 1) % 4;
  if (steps_ >= spec_.max_steps) done_ = true;
}

double NavEnv::spl() const {
  if (!success()) return 0.0;
  const int taken = steps_ - 1;  // the stop is not a move
  return (double)shortest_ / std::max(shortest_, taken);
}

Image NavEnv::render() const {
  const int S = spec_.image_size;
  Image img;
  img.width = img.height = S;
  img.rgb.resize((size_t)S * S * 3);
  const double px = x_ + 0.5, py = y_ + 0.5;
  const double dx = kDx[h_], dy = kDy[h_], plx = -dy, ply = dx;  // camera plane: the heading's right
  for (int c = 0; c < S; ++c) {
    const double cam = 2.0 * (c + 0.5) / S - 1.0;
    const double rx = dx + plx * cam, ry = dy + ply * cam;
    int mx = (int)px, my = (int)py;
    const double ddx = rx == 0 ? 1e30 : std::fabs(1 / rx), ddy = ry == 0 ? 1e30 : std::fabs(1 / ry);
    const int sx = rx < 0 ? -1 : 1, sy = ry < 0 ? -1 : 1;
    double side_x = (rx < 0 ? px - mx : mx + 1.0 - px) * ddx, side_y = (ry < 0 ? py - my : my + 1.0 - py) * ddy;
    int side = 0;
    for (int guard = 0; guard < 4 * w_ && !solid(mx, my); ++guard) {
      if (side_x < side_y) {
        side_x += ddx;
        mx += sx;
        side = 0;
      } else {
        side_y += ddy;
        my += sy;
        side = 1;
      }
    }
    const double dist = std::max(1e-3, side == 0 ? side_x - ddx : side_y - ddy);
    const int kind = solid(mx, my) && mx >= 0 && my >= 0 && mx < w_ && my < w_ ? map_[cell(mx, my)] : 1;
    uint8_t base[3] = {150, 150, 150};
    if (kind >= 2) std::copy(kColour[kind - 2], kColour[kind - 2] + 3, base);
    const double shade = (side ? 0.8 : 1.0) / (1.0 + 0.2 * dist);
    const int height = (int)std::min<double>(S, S / dist);
    const int top = (S - height) / 2, bottom = top + height;
    for (int r = 0; r < S; ++r) {
      uint8_t* p = img.rgb.data() + ((size_t)r * S + c) * 3;
      if (r < top) {
        p[0] = 60, p[1] = 60, p[2] = 80;
      } else if (r >= bottom) {
        p[0] = 110, p[1] = 90, p[2] = 70;
      } else {
        for (int k = 0; k < 3; ++k) p[k] = (uint8_t)std::lround(base[k] * shade);
      }
    }
  }
  return img;
}

uint64_t nav_layout_seed(uint64_t seed, int64_t e) { return mix64(mix64(seed) + (uint64_t)e); }

int64_t write_nav_episodes(const NavSpec& spec, int64_t num_episodes, uint64_t seed, double noise,
                           const std::string& path) {
  spec.validate();
  TT_CHECK(num_episodes >= 1, "nav episodes: ", num_episodes, " episodes, expected >= 1");
  TT_CHECK(noise >= 0 && noise < 1, "nav episodes: noise ", noise, ", expected in [0, 1)");
  namespace fs = std::filesystem;
  GeneratedEpisodes gen(path);  // a failure below leaves an earlier dataset at `path` whole
  SplitMix64 rng(mix64(seed) ^ 0x6e6f697365ULL);
  int64_t frames = 0;
  for (int64_t e = 0; e < num_episodes; ++e) {
    NavEnv env(spec, nav_layout_seed(seed, e));
    nlohmann::json steps = nlohmann::json::array();
    for (int t = 0; !env.done(); ++t) {
      const std::string name = gen.frame_name(e, t);
      write_png(gen.frame_file(name), env.render());
      ++frames;
      const int label = env.expert_action();
      int move = label;
      if (label != kNavStop && noise > 0 && (double)(rng.next() >> 11) * 0x1.0p-53 < noise) move = 1 + (int)rng.below(3);
      steps.push_back({{"images", {name}}, {"action_ids", {spec.action_base + label}}});
      env.step(move);
    }
    nlohmann::json ep = {{"id", str("nav-", e)}, {"instruction", env.instruction()}, {"steps", steps}};
    gen.jsonl() << ep.dump() << "\n";
  }
  gen.commit();
  return frames;
}

}  // namespace tt::data
