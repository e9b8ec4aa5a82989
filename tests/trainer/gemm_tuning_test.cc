// The GEMM tuning table file (trainer/gemm_tuning.h) and the bucket rule (ops/cuda/gemm_tuned.h):
// a round trip, the error a bad file gets, and how ranks' tables merge.
#include "trainer/gemm_tuning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/check.h"

namespace tt::trainer {
namespace {

cuda::GemmTuned entry(int64_t n, uint64_t algo0) {
  cuda::GemmTuned e;
  e.key = {2048, n, 2048, 1, 0, 0, 256, 256, 256, 0};
  e.algo = {algo0, 0xffffffffffffffffULL, 0, 1, 2, 3, 4, 0x0123456789abcdefULL};
  return e;
}

TEST(GemmTuning, BucketsRoundUpToQuarterOctaves) {
  EXPECT_EQ(cuda::gemm_tune_bucket(1), 1);
  EXPECT_EQ(cuda::gemm_tune_bucket(8), 8);
  EXPECT_EQ(cuda::gemm_tune_bucket(9), 10);
  EXPECT_EQ(cuda::gemm_tune_bucket(16), 16);
  EXPECT_EQ(cuda::gemm_tune_bucket(17), 20);
  EXPECT_EQ(cuda::gemm_tune_bucket(1000), 1024);
  EXPECT_EQ(cuda::gemm_tune_bucket(1024), 1024);
  EXPECT_EQ(cuda::gemm_tune_bucket(1025), 1280);
  EXPECT_EQ(cuda::gemm_tune_bucket(14720), 16384);
  EXPECT_EQ(cuda::gemm_tune_bucket(12288), 12288);
  EXPECT_EQ(cuda::gemm_tune_bucket(12289), 14336);
  // Every value lies in its bucket, within 25% of its top.
  for (int64_t x = 1; x < 100000; x += 7) {
    const int64_t b = cuda::gemm_tune_bucket(x);
    ASSERT_GE(b, x);
    ASSERT_LE(b, x + x / 4 + 1) << x;
    ASSERT_EQ(cuda::gemm_tune_bucket(b), b) << x;
  }
}

TEST(GemmTuning, JsonRoundTrip) {
  GemmTuning t{"cublasLt 120900, NVIDIA H200, sm_90, 132 SMs", {entry(1024, 7), entry(16384, 9)}};
  t.entries[1].step = 12;  // the step that timed it
  const GemmTuning back = parse_gemm_tuning(gemm_tuning_json(t), "f");
  EXPECT_EQ(back.signature, t.signature);
  ASSERT_EQ(back.entries.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.entries[i].key, t.entries[i].key);
    EXPECT_EQ(back.entries[i].algo, t.entries[i].algo);
    EXPECT_EQ(back.entries[i].step, t.entries[i].step);
  }
}

std::string error_of(const std::string& text) {
  try {
    parse_gemm_tuning(text, "run/gemm_tuning.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GemmTuning, BadFilesNameTheField) {
  const std::string head = R"({"format": "treetrain-gemm-tuning", "version": 1, "signature": "s", )";
  const std::string algo(128, 'a');
  EXPECT_EQ(error_of(head + R"("entries": []})"), "");
  EXPECT_EQ(error_of("{"), error_of("{"));  // stable
  EXPECT_EQ(error_of("{").rfind("run/gemm_tuning.json: invalid JSON: ", 0), 0u) << error_of("{");
  EXPECT_EQ(error_of("[]"), "run/gemm_tuning.json: expected a JSON object, got array");
  EXPECT_EQ(error_of(R"({"format": "x"})"),
            "run/gemm_tuning.json: field \"format\": expected \"treetrain-gemm-tuning\", got \"x\"");
  EXPECT_EQ(error_of(R"({"format": "treetrain-gemm-tuning", "version": 2})"),
            "run/gemm_tuning.json: field \"version\": expected 1 (what this treetrain reads), got 2");
  EXPECT_EQ(error_of(R"({"format": "treetrain-gemm-tuning", "version": 1, "entries": []})"),
            "run/gemm_tuning.json: missing field \"signature\"");
  EXPECT_EQ(error_of(head + R"("entries": {}})"), "run/gemm_tuning.json: field \"entries\": expected an array, got {}");
  EXPECT_EQ(error_of(head + R"("entries": [{"algo": ")" + algo + R"("}]})"),
            "run/gemm_tuning.json: missing field \"entries[0].key\"");
  EXPECT_EQ(error_of(head + R"("entries": [{"key": [1, 2, 3], "algo": ")" + algo + R"("}]})"),
            "run/gemm_tuning.json: field \"entries[0].key\": expected 10 integers >= 0, got [1,2,3]");
  EXPECT_EQ(error_of(head + R"("entries": [{"key": [1, 2, 3, 4, 5, 6, 7, 8, 9, 0], "algo": "xyz"}]})"),
            "run/gemm_tuning.json: field \"entries[0].algo\": expected 128 lowercase hex digits, got \"xyz\"");
  EXPECT_EQ(error_of(head + R"("entries": [{"key": [1, 2, 3, 4, 5, 6, 7, 8, 9, 0], "algo": ")" + algo + R"(", "step": -1}]})"),
            "run/gemm_tuning.json: field \"entries[0].step\": expected an integer >= 0, got -1");
  EXPECT_EQ(parse_gemm_tuning(head + R"("entries": [{"key": [1, 2, 3, 4, 5, 6, 7, 8, 9, 0], "algo": ")" + algo + R"("}]})",
                              "f")
                .entries[0]
                .step,
            0)
      << "no step: 0";
}

TEST(GemmTuning, MergeTakesTheLowestRanksChoice) {
  const std::vector<cuda::GemmTuned> merged =
      merge_gemm_tuning({{entry(2048, 1)}, {entry(2048, 2), entry(1024, 3)}, {entry(1024, 4)}});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].key[1], 1024);  // sorted by key
  EXPECT_EQ(merged[0].algo[0], 3u);   // rank 1 before rank 2
  EXPECT_EQ(merged[1].key[1], 2048);
  EXPECT_EQ(merged[1].algo[0], 1u);   // rank 0 before rank 1
}

}  // namespace
}  // namespace tt::trainer
