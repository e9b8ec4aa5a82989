// TMA descriptors (CUtensorMap) for the kernels that load tiles with cp.async.bulk.tensor: the
// tree attention's Q/K/V/dO tiles and the Gated DeltaNet walks' chunk stages.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace tt::cuda {

// A 3-D tiled map of a dense (rows, heads, cols) tensor at `base` (elements of `elem_bytes` bytes
// and type `dtype`): boxes of box_cols columns x 1 head x box_rows rows in shared memory with
// `swizzle`, zeros past the tensor's ends. Encoded through the runtime's driver entry point (no
// link against libcuda). `what` names the caller in the error a failed encoding gets.
CUtensorMap tma_map_3d(CUtensorMapDataType dtype, int elem_bytes, const void* base, int64_t rows, int heads, int cols,
                       int box_cols, int box_rows, CUtensorMapSwizzle swizzle, const char* what);

}  // namespace tt::cuda
