// cuBLASLt, loaded on first use. libcublasLt's static initialisers take ~0.4 s and ~210 MB of
// memory at process start; a binary linked against it pays that for `--help`, a config error or
// a CPU run. So nothing links it: this file defines the cuBLASLt entry points treetrain calls,
// each resolving the library's own on its first call (dlopen by the soname of the headers we
// compiled against, found through the binary's runpath /usr/local/cuda/lib64 or
// LD_LIBRARY_PATH). The signatures are checked against <cublasLt.h>'s declarations, so a
// mismatch is a compile error; an entry point used but not listed here is a link error.
// A library that cannot be loaded, or lacks an entry point, is a tt::Error naming both.
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "base/check.h"

namespace {

#define TT_STR2(x) #x
#define TT_STR(x) TT_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." TT_STR(CUBLAS_VER_MAJOR);

void* library() {
  static void* handle = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      error = tt::str("cannot load cuBLASLt (", kSoname, "): ", why ? why : "unknown error",
                      "; the CUDA backend needs the CUDA toolkit's libraries in /usr/local/cuda/lib64 "
                      "or on LD_LIBRARY_PATH");
    }
  });
  if (handle == nullptr) throw tt::Error(error);
  return handle;
}

// The library's `name`, as a pointer to a function of the declared type F.
template <typename F>
F* entry(const char* name) {
  void* h = library();
  dlerror();
  void* p = dlsym(h, name);
  if (p == nullptr) throw tt::Error(tt::str("cuBLASLt (", kSoname, ") has no entry point ", name));
  return reinterpret_cast<F*>(p);
}

}  // namespace

// Each entry point resolves once (a function-local static) and forwards its arguments.
#define TT_LT_FORWARD(name, ...)                              \
  static auto* const fn = entry<decltype(name)>(#name);      \
  return fn(__VA_ARGS__)

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { TT_LT_FORWARD(cublasLtCreate, handle); }

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) { TT_LT_FORWARD(cublasLtDestroy, handle); }

size_t cublasLtGetVersion(void) { TT_LT_FORWARD(cublasLtGetVersion); }

const char* cublasLtGetStatusString(cublasStatus_t status) {
  TT_LT_FORWARD(cublasLtGetStatusString, status);
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  TT_LT_FORWARD(cublasLtMatmul, handle, desc, alpha, A, a, B, b, beta, C, c, D, d, algo, workspace,
                workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  TT_LT_FORWARD(cublasLtMatmulAlgoCheck, handle, desc, a, b, c, d, algo, result);
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                                                    size_t bytes, size_t* written) {
  TT_LT_FORWARD(cublasLtMatmulAlgoConfigGetAttribute, algo, attr, buf, bytes, written);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  TT_LT_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, desc, a, b, c, d, pref, requested, results,
                returned);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  TT_LT_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  TT_LT_FORWARD(cublasLtMatmulDescDestroy, desc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  TT_LT_FORWARD(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  TT_LT_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  TT_LT_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  TT_LT_FORWARD(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  TT_LT_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  TT_LT_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}

}  // extern "C"
