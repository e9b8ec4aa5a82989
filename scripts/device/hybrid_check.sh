#!/usr/bin/env bash
# Hybrid models on the GPU machine (issue 15): the CUDA decoder with Gated DeltaNet layers against
# the fp64 CPU decoder (tests/model_cuda/hybrid_cuda_test), the ops the hybrid layers added or
# changed (the delta rule and the GDN row ops, gated attention, RMSNorm's weight offset, partial
# RoPE), the dense decoder and trainer backend tests those changes touch, then `ops_bench gdn`.
#
#   scripts/device/hybrid_check.sh stage   here (no GPU): bazel build, copy the stripped binaries
#                                          to .device/hybrid/ (ignored by git; carried)
#   scripts/device/hybrid_check.sh [run]   there: tests into $OUT/tests.log, the benchmark into
#                                          $OUT/bench.txt, summary.txt; a short table last
# Device run:  run(command="scripts/device/hybrid_check.sh", carry=[".device"])
# Environment: SKIP_BENCH=1, TESTS (default below).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/hybrid
TESTS=${TESTS:-"hybrid_cuda_test gdn_test gated_attention_test rmsnorm_test rope_test qk_norm_rope_test model_cuda_test backend_cuda_test"}

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/model_cuda:hybrid_cuda_test //tests/model_cuda:model_cuda_test //tests/model_cuda:backend_cuda_test \
    //tests/ops_cuda:gdn_test //tests/ops_cuda:gated_attention_test //tests/ops_cuda:rmsnorm_test \
    //tests/ops_cuda:rope_test //tests/ops_cuda:qk_norm_rope_test //bench:ops_bench || exit 1
  stage_binaries "$DIR" bazel-bin/tests/model_cuda/hybrid_cuda_test bazel-bin/tests/model_cuda/model_cuda_test \
    bazel-bin/tests/model_cuda/backend_cuda_test bazel-bin/tests/ops_cuda/gdn_test \
    bazel-bin/tests/ops_cuda/gated_attention_test bazel-bin/tests/ops_cuda/rmsnorm_test \
    bazel-bin/tests/ops_cuda/rope_test bazel-bin/tests/ops_cuda/qk_norm_rope_test bazel-bin/bench/ops_bench
  exit 0
fi

device_setup "$DIR" /tmp/hybrid_check

for t in $TESTS; do run_gtest "$t" 200 90; done

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 200 "$DIR/ops_bench" gdn >"$OUT/bench.txt" 2>&1
  echo "ops_bench gdn rc=$?" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$\|error:' "$OUT/tests.log" | head -60
echo "----- errors"
grep '^\[ errors' "$OUT/tests.log" | head -30
echo "----- benchmark"
sed -n '/^op /,$p' "$OUT/bench.txt" 2>/dev/null
echo "----- tests"
cat "$summary"
