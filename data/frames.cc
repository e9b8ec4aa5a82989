// A packed batch's frames decoded into the tower's pixels (see frames.h).
#include "data/frames.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "base/check.h"
#include "data/image.h"

namespace tt::data {

void load_frames(PackedBatch& b, const FrameSpec& spec) {
  const int F = (int)b.frames.size();
  b.pixels.clear();
  b.image_size = 0;
  if (F == 0) return;
  TT_CHECK(spec.image_size >= 1, "load_frames: image_size ", spec.image_size, ", expected >= 1");
  const int S = spec.image_size;
  const size_t per = (size_t)3 * S * S;
  b.pixels.resize(per * F);
  std::map<std::string, int> decoded;  // path -> the frame that holds its pixels
  for (int f = 0; f < F; ++f) {
    const FrameRef& r = b.frames[f];
    float* out = b.pixels.data() + per * f;
    if (r.pixels) {
      TT_CHECK(r.pixels->size() == per, "frame (episode ", r.episode, ", step ", r.step, ", camera ", r.camera,
               "): ", r.pixels->size(), " in-memory pixel values, expected 3 x ", S, " x ", S, " = ", per);
      for (float v : *r.pixels)
        TT_CHECK(std::isfinite(v), "frame (episode ", r.episode, ", step ", r.step, ", camera ", r.camera,
                 "): a non-finite pixel value");
      std::copy(r.pixels->begin(), r.pixels->end(), out);
      continue;
    }
    auto it = decoded.find(r.path);
    if (it != decoded.end()) {
      const float* from = b.pixels.data() + per * it->second;
      std::copy(from, from + per, out);
      continue;
    }
    std::vector<float> px;
    try {
      px = tower_pixels(decode_image(r.path), S, spec.mean, spec.std);
    } catch (const Error& e) {  // images are decoded as batches need them: say whose frame it is
      throw Error(str("the frame of the data file's episode ", r.episode, " (counting from 0), step ", r.step,
                      ", camera ", r.camera, ": ", e.what()));
    }
    std::copy(px.begin(), px.end(), out);
    decoded[r.path] = f;
  }
  b.image_size = S;
}

}  // namespace tt::data
