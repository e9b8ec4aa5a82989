// A packed batch's frames as the vision tower reads them (issue 16): PackedBatch::pixels
// (frames, 3, S, S), each frame decoded from its file (data/image.h: PNG or JPEG), resized to S x S
// and normalised with the tower's mean and std, or taken from its in-memory pixels
// (FrameRef::pixels, which must already be (3, S, S)). A file shown by several frames of the
// batch is decoded once. Errors name the file (or the frame) and what was expected.
#pragma once

#include <array>

#include "data/packing.h"

namespace tt::data {

struct FrameSpec {
  int image_size = 0;                       // S: the tower's image_size
  std::array<float, 3> mean{0.5f, 0.5f, 0.5f};  // SigLIP's processor: (x / 255 - 0.5) / 0.5
  std::array<float, 3> std{0.5f, 0.5f, 0.5f};
};

// Fills batch.pixels and batch.image_size (a batch without frames gets none).
void load_frames(PackedBatch& batch, const FrameSpec& spec);

}  // namespace tt::data
