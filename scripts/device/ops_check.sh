#!/usr/bin/env bash
# CUDA op tests and benchmark on the GPU machine.
#
#   scripts/device/ops_check.sh stage   here (no GPU): bazel build the gpu tests of tests/ops_cuda
#                                       and bench:ops_bench, copy the stripped binaries to
#                                       .device/ops_cuda/ (ignored by git; carried by the device run)
#   scripts/device/ops_check.sh [run]   there: run every test binary, then the benchmark; logs go
#                                       to $OUT (tests.log, bench.txt, summary.txt); a short table
#                                       is printed last.
# Device run:  run(command="scripts/device/ops_check.sh", carry=[".device"])
# Environment: SKIP_BENCH=1 (tests only), SKIP_SANITIZER=1, TESTS (default below).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/ops_cuda
TESTS=${TESTS:-"memory_test gemm_test gemv_test embedding_test rmsnorm_test rope_test qk_norm_rope_test swiglu_test cross_entropy_test adamw_test vision_test gdn_test gated_attention_test"}

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  targets="" files=""
  for t in $TESTS; do
    targets="$targets //tests/ops_cuda:$t"
    files="$files bazel-bin/tests/ops_cuda/$t"
  done
  bazel build $targets //bench:ops_bench || exit 1
  stage_binaries "$DIR" $files bazel-bin/bench/ops_bench
  exit 0
fi

device_setup "$DIR" /tmp/ops_check

for t in $TESTS; do run_gtest "$t" 150; done

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 200 "$DIR/ops_bench" >"$OUT/bench.txt" 2>&1
  echo "ops_bench rc=$?" >>"$summary"
fi

# Memory errors and shared-memory races of the kernels, on the smaller cases.
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ] && [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  set -f  # the gtest filters are patterns, not file globs
  for spec in "memcheck cross_entropy_test" "racecheck cross_entropy_test" \
              "memcheck rmsnorm_test:-*many_rows*:*rows_over_chunks*" \
              "racecheck rmsnorm_test:-*many_rows*:*rows_over_chunks*" "memcheck qk_norm_rope_test" \
              "racecheck qk_norm_rope_test" "memcheck embedding_test" \
              "memcheck adamw_test:-*SumSquares*" "memcheck gdn_test" "racecheck gdn_test"; do
    set -- $spec
    tool=$1 bin=${2%%:*} filter=""
    case " $TESTS " in *" $bin "*) ;; *) continue ;; esac  # only the tests of this call
    [ "$bin" != "$2" ] && filter="--gtest_filter=${2#*:}"
    echo "===== sanitizer $tool $bin $filter" >>"$OUT/tests.log"
    timeout 60 "$san" --tool "$tool" --error-exitcode 9 "$DIR/$bin" --gtest_brief=1 $filter \
      >>"$OUT/tests.log" 2>&1
    rc=$?
    status=PASS
    [ $rc -ne 0 ] && status="FAIL(rc=$rc)"
    printf "%-22s %-12s compute-sanitizer %s\n" "$bin" "$status" "$tool" >>"$summary"
  done
  set +f
fi


echo "----- failures"
grep -B2 -A12 'Failure$\|error:' "$OUT/tests.log" | head -80
grep -E '^========= (Invalid|Race|Error|.*[Hh]azard|.*SUMMARY)' "$OUT/tests.log" | head -30
echo "----- benchmark"
sed -n '/^op /,$p' "$OUT/bench.txt"
tail -3 "$OUT/bench.txt" | grep -i "ops_bench:" || true
echo "----- tests"
cat "$summary"
