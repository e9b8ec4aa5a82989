// The cuBLASLt loader (third_party/cuda/cublaslt.cc): no binary loads libcublasLt until it calls
// cuBLASLt, and then the entry points reach the toolkit's library. Host-only calls: no GPU needed.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

bool cublaslt_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream s;
  s << maps.rdbuf();
  return s.str().find("libcublasLt.so") != std::string::npos;
}

// In a fresh process (the threadsafe death-test style re-runs this binary for this test alone),
// whatever ran before here.
TEST(CublasLtLoader, LoadsOnFirstCallOnly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (cublaslt_mapped()) {
          std::fprintf(stderr, "libcublasLt was loaded at process start\n");
          std::exit(1);
        }
        const size_t version = cublasLtGetVersion();
        if (!cublaslt_mapped()) {
          std::fprintf(stderr, "libcublasLt is not mapped after a call\n");
          std::exit(2);
        }
        // The library found is of the major version the headers declare (the soname asked for).
        if (version / 10000 != size_t(CUBLAS_VER_MAJOR)) {
          std::fprintf(stderr, "version %zu, headers %d\n", version, CUBLAS_VER_MAJOR);
          std::exit(3);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CublasLtLoader, EntryPointsReachTheLibrary) {
  // A host-side descriptor round trip through four entry points, then the status strings.
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_NE(desc, nullptr);
  const cublasOperation_t t = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  // A bad argument gets the library's own status and message.
  EXPECT_EQ(cublasLtMatmulDescCreate(nullptr, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS), "success");
  EXPECT_STRNE(cublasLtGetStatusString(CUBLAS_STATUS_INVALID_VALUE), cublasLtGetStatusString(CUBLAS_STATUS_SUCCESS));
}

}  // namespace
