#include "ops/cuda/tma.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "base/check.h"
#include "ops/cuda/check.h"

namespace tt::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    TT_CHECK(q == cudaDriverEntryPointSuccess && f != nullptr,
             "the driver has no cuTensorMapEncodeTiled (CUDA 12.0+ driver needed)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap tma_map_3d(CUtensorMapDataType dtype, int elem_bytes, const void* base, int64_t rows, int heads, int cols,
                       int box_cols, int box_rows, CUtensorMapSwizzle swizzle, const char* what) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)heads, (cuuint64_t)rows};
  const cuuint64_t strides[2] = {(cuuint64_t)cols * elem_bytes, (cuuint64_t)heads * cols * elem_bytes};
  const cuuint32_t box[3] = {(cuuint32_t)box_cols, 1, (cuuint32_t)box_rows};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode_tiled()(&m, dtype, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TT_CHECK(r == CUDA_SUCCESS, what, ": cuTensorMapEncodeTiled failed (error ", (int)r, ") for a (", rows, ", ", heads,
           ", ", cols, ") tensor of ", elem_bytes, "-byte elements, boxes of (", box_rows, ", 1, ", box_cols, ")");
  return m;
}

}  // namespace tt::cuda
