#!/usr/bin/env bash
# Shared pieces of the scripts/device/*_check.sh scripts (sourced, never run):
#   stage_binaries DIR FILE...   here: copy the built binaries to DIR (ignored by git, carried to
#                                the device run), strip them, add libgomp as a fallback library
#   device_setup DIR OUT_DEFAULT there: libgomp from DIR when the machine lacks it, $OUT (default
#                                OUT_DEFAULT), an empty $summary, the GPU's state in $OUT/tests.log
#   run_gtest T TIMEOUT [SAN_TIMEOUT]
#                                there: run $DIR/T into $OUT/tests.log and add a line to $summary
#                                (status, passed and failed cases, seconds); with SAN_TIMEOUT, the
#                                first failing case of the call is re-run under compute-sanitizer
#                                memcheck (once per call: it is slow)
#   print_test_report            there: $OUT/tests.log's failures, sanitizer findings and printed
#                                errors, then $summary

stage_binaries() {
  local dir=$1
  shift
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$@" "$dir/"
  chmod u+w "$dir"/* && strip "$dir"/*
  mkdir -p "$dir/lib" && cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$dir/lib/"  # fallback only
  du -sh "$dir"
}

device_setup() {
  local dir=$1
  if ! ldconfig -p | grep -q 'libgomp.so.1 '; then
    export LD_LIBRARY_PATH="$PWD/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  OUT=${OUT:-$2}
  mkdir -p "$OUT"
  summary="$OUT/summary.txt"
  : >"$summary"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,memory.used --format=csv \
    >"$OUT/tests.log" 2>&1
}

run_gtest() {
  local t=$1 limit=$2 san_limit=${3:-}
  echo "===== $t" >>"$OUT/tests.log"
  local start=$SECONDS
  timeout "$limit" "$DIR/$t" --gtest_color=no >>"$OUT/tests.log" 2>&1
  local rc=$?
  local section passed failed status=PASS first san
  section=$(sed -n "/^===== $t\$/,\$p" "$OUT/tests.log")
  passed=$(grep -c '^\[       OK \]' <<<"$section")
  failed=$(grep -c '^\[  FAILED  \].*(' <<<"$section")
  [ $rc -ne 0 ] && status="FAIL(rc=$rc)"
  printf "%-22s %-12s passed %3d failed %3d %4ds\n" "$t" "$status" "$passed" "$failed" $((SECONDS - start)) >>"$summary"
  [ -n "$san_limit" ] || return 0
  first=$(grep -m1 '^\[  FAILED  \].*(' <<<"$section" | sed 's/^\[  FAILED  \] \([^ ,]*\).*/\1/')
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -n "$first" ] && [ -x "$san" ] && [ -z "${memchecked:-}" ]; then
    memchecked=1
    echo "===== memcheck $t $first" >>"$OUT/tests.log"
    timeout "$san_limit" "$san" --tool memcheck --error-exitcode 9 "$DIR/$t" --gtest_brief=1 --gtest_filter="$first" \
      >>"$OUT/tests.log" 2>&1
    printf "%-22s memcheck rc=%s on %s\n" "$t" "$?" "$first" >>"$summary"
  fi
}

print_test_report() {
  echo "----- failures"
  grep -B2 -A12 'Failure$' "$OUT/tests.log" | head -60
  grep -E '^========= (Invalid|Race|Error|.*[Hh]azard|.*SUMMARY)' "$OUT/tests.log" | head -20
  grep -E '^\[ errors' "$OUT/tests.log" | head -60
  echo "----- summary"
  cat "$summary"
}
