#!/usr/bin/env bash
# A/B of one op's benchmark (bench/ops_bench OP) between a baseline build and this tree's,
# interleaved in one device call (base new base new ...), so both see the same machine state;
# with OP=gdn also the delta rule's GPU tests and its sanitizer runs on this tree's binaries.
#
#   BASE=DIR OP=gdn scripts/device/ops_ab.sh stage   here (no GPU): copy DIR/bazel-bin/bench/ops_bench
#                                                     (a checkout of the baseline commit, built there)
#                                                     and this tree's bench:ops_bench (built now), and
#                                                     for gdn this tree's gdn_test and hybrid_cuda_test,
#                                                     to .device/ops_ab/ (ignored; carried)
#   OP=gdn scripts/device/ops_ab.sh [run]            there: the tests first (gdn), then ROUNDS
#                                                     (default 2) rounds of base then new; logs in
#                                                     $OUT; a table of each row's median over the
#                                                     rounds and the new/base ratio last.
# Device run:  run(command="OP=gdn scripts/device/ops_ab.sh", carry=[".device"])
# Environment: OP (an ops_bench filter: gdn, rmsnorm, gemm, ...), ROUNDS, SKIP_TESTS=1,
# SKIP_SANITIZER=1.
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/ops_ab
OP=${OP:-gdn}
TESTS=""
[ "$OP" = gdn ] && TESTS="tests/ops_cuda:gdn_test tests/model_cuda:hybrid_cuda_test"

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  [ -n "${BASE:-}" ] && [ -x "$BASE/bazel-bin/bench/ops_bench" ] ||
    { echo "ops_ab: set BASE to a built checkout of the baseline (bazel build //bench:ops_bench there)" >&2; exit 1; }
  targets="//bench:ops_bench" files=""
  for t in $TESTS; do
    targets="$targets //$t"
    files="$files bazel-bin/${t/://}"
  done
  bazel build $targets || exit 1
  tmp=$(mktemp -d)
  cp "$BASE/bazel-bin/bench/ops_bench" "$tmp/base_ops_bench"
  cp bazel-bin/bench/ops_bench "$tmp/new_ops_bench"
  stage_binaries "$DIR" "$tmp"/*_ops_bench $files
  rm -rf "$tmp"
  (cd "$BASE" && git rev-parse --short HEAD) >"$DIR/base_commit" 2>/dev/null
  git rev-parse --short HEAD >"$DIR/new_commit"
  exit 0
fi

device_setup "$DIR" /tmp/ops_ab

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $TESTS; do run_gtest "${t#*:}" 200; done
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ "$OP" = gdn ] && [ -x "$san" ] && [ "${SKIP_SANITIZER:-0}" != 1 ]; then
    for tool in memcheck racecheck; do
      echo "===== sanitizer $tool gdn_test" >>"$OUT/tests.log"
      timeout 150 "$san" --tool "$tool" --error-exitcode 9 "$DIR/gdn_test" --gtest_brief=1 >>"$OUT/tests.log" 2>&1
      rc=$?
      status=PASS
      [ $rc -ne 0 ] && status="FAIL(rc=$rc)"
      printf "%-22s %-12s compute-sanitizer %s\n" gdn_test "$status" "$tool" >>"$summary"
    done
  fi
fi

for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in base new; do
    start=$SECONDS
    timeout 200 "$DIR/${v}_ops_bench" "$OP" >"$OUT/${v}_$r.txt" 2>&1
    echo "$v round $r rc=$? $((SECONDS - start))s" >>"$summary"
  done
done

print_test_report
echo "----- benchmark"
python3 scripts/device/ops_ab_table.py "$OUT" "base=$(cat $DIR/base_commit 2>/dev/null)" "new=$(cat $DIR/new_commit)"
