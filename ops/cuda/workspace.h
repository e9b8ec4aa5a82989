// Scratch device memory handed to an op for one call. Ops that need scratch space (sorting,
// two-stage reductions) expose `<op>_workspace_bytes(shape)`; the caller passes at least that many
// bytes, stream-ordered like the op's other buffers (reusable once the op's stream has moved on).
#pragma once

#include <cstddef>

namespace tt::cuda {

struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

}  // namespace tt::cuda
