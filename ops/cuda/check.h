// One family of check macros for CUDA, cuBLAS, cuDNN and NCCL. Each records the failed
// expression, file and line and throws tt::Error; only main() decides to exit.
// TT_CUDA_CHECK_LAUNCH() checks the last error after every kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "base/check.h"

namespace tt::cuda {

[[noreturn]] inline void fail_api(const char* lib, const char* expr, const char* file, int line,
                                  long code, const char* what) {
  throw ::tt::Error(::tt::str(lib, " error ", code, " (", what ? what : "?", ") in ", expr, " at ", file,
                              ":", line));
}

// Visible CUDA devices; `why` says why there are none (the runtime's error, or 0 devices). The
// failed query's error is cleared, so later calls do not see it.
inline int visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    *why = ::tt::str("cudaGetDeviceCount: ", cudaGetErrorString(err));
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount: 0 devices";
  return n;
}

}  // namespace tt::cuda

#define TT_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    cudaError_t tt_err_ = (expr);                                                             \
    if (tt_err_ != cudaSuccess)                                                               \
      ::tt::cuda::fail_api("CUDA", #expr, __FILE__, __LINE__, (long)tt_err_, cudaGetErrorString(tt_err_)); \
  } while (0)

#define TT_CUDA_CHECK_LAUNCH() TT_CUDA_CHECK(cudaGetLastError())

// cuBLASLt / cuDNN / NCCL status checks: include the library header before using these.
#define TT_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                        \
    cublasStatus_t tt_st_ = (expr);                                                           \
    if (tt_st_ != CUBLAS_STATUS_SUCCESS)                                                      \
      ::tt::cuda::fail_api("cuBLAS", #expr, __FILE__, __LINE__, (long)tt_st_, cublasLtGetStatusString(tt_st_)); \
  } while (0)

#define TT_CUDNN_CHECK(expr)                                                                  \
  do {                                                                                        \
    cudnnStatus_t tt_st_ = (expr);                                                            \
    if (tt_st_ != CUDNN_STATUS_SUCCESS)                                                       \
      ::tt::cuda::fail_api("cuDNN", #expr, __FILE__, __LINE__, (long)tt_st_, cudnnGetErrorString(tt_st_)); \
  } while (0)

#define TT_NCCL_CHECK(expr)                                                                   \
  do {                                                                                        \
    ncclResult_t tt_st_ = (expr);                                                             \
    if (tt_st_ != ncclSuccess)                                                                \
      ::tt::cuda::fail_api("NCCL", #expr, __FILE__, __LINE__, (long)tt_st_, ncclGetErrorString(tt_st_)); \
  } while (0)
