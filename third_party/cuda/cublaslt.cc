// cuBLASLt, loaded on first use. libcublasLt's static initialisers take ~0.4 s and ~210 MB of
// memory at process start; a binary linked against it pays that for `--help`, a config error or
// a CPU run. So nothing links it: this file defines the cuBLASLt entry points treetrain calls,
// each forwarding to the library's own, all resolved when the first call loads it (dlopen by the
// soname of the headers we
// compiled against, found through the binary's runpath /usr/local/cuda/lib64 or
// LD_LIBRARY_PATH). The signatures are checked against <cublasLt.h>'s declarations, so a
// mismatch is a compile error; an entry point used but not listed here is a link error.
// A library that cannot be loaded, or lacks an entry point, is a tt::Error naming both, from the
// first cuBLASLt call on.
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "base/check.h"

namespace {

#define TT_STR2(x) #x
#define TT_STR(x) TT_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." TT_STR(CUBLAS_VER_MAJOR);

// Every entry point forwarded below: all are resolved when the library loads, so a library that
// lacks one fails at the first cuBLASLt call, never later (say in a destructor's Destroy call).
#define TT_CUBLASLT_ENTRIES(X)                                                                     \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion) X(cublasLtGetStatusString)            \
  X(cublasLtMatmul) X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoConfigGetAttribute)              \
  X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)        \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)                               \
  X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute)                        \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)

struct Entries {
#define TT_FIELD(name) decltype(&::name) name = nullptr;
  TT_CUBLASLT_ENTRIES(TT_FIELD)
#undef TT_FIELD
};

// The loaded library's entry points (loaded once, thread-safe); a tt::Error when it cannot be
// loaded or lacks one (the same error on every later call).
const Entries& lt() {
  static Entries entries;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      error = tt::str("cannot load cuBLASLt (", kSoname, "): ", why ? why : "unknown error",
                      "; the CUDA backend needs the CUDA toolkit's libraries in /usr/local/cuda/lib64 "
                      "or on LD_LIBRARY_PATH");
      return;
    }
    Entries e;
#define TT_RESOLVE(name)                                                                           \
  if (error.empty()) {                                                                             \
    dlerror();                                                                                     \
    e.name = reinterpret_cast<decltype(&::name)>(dlsym(h, #name));                                 \
    if (e.name == nullptr) {                                                                       \
      const char* why = dlerror();                                                                 \
      error = tt::str("cuBLASLt (", kSoname, ") has no entry point " #name, why ? ": " : "", why ? why : ""); \
    }                                                                                              \
  }
    TT_CUBLASLT_ENTRIES(TT_RESOLVE)
#undef TT_RESOLVE
    if (error.empty()) entries = e;
  });
  if (!error.empty()) throw tt::Error(error);
  return entries;
}

}  // namespace

#define TT_LT_FORWARD(name, ...) return lt().name(__VA_ARGS__)

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
