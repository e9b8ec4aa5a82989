#!/usr/bin/env bash
# Sanitizers and fuzzing, bounded in time; scripts/test.sh (and so CI) runs it after the main
# suite.
#  1. Every CPU test (--test_tag_filters=-gpu,-no_sanitize) built by clang-14 with ASan + UBSan
#     and run (.bazelrc, --config=asan), in a Bazel output base of its own (the main one's path +
#     "-sanitize") so the main build's cache survives. A sanitizer report or a leak fails its test.
#     CUDA code is compiled by nvcc without instrumentation and links beside the sanitized host
#     code. Three tests are left out, tagged no_sanitize with their reasons in their BUILD files:
#     the emulated attention and Gated DeltaNet kernels (tests/ops_cuda_attention, tests/ops_cuda),
#     whose emulator switches stacks under ASan's feet, and for time; tests/trainer's
#     segments_capability_test, for time.
#  2. The libFuzzer targets of tests/fuzz (JSONL readers, YAML config, safetensors, rendezvous
#     wire format), built in the same output base, each run over its committed seed corpus
#     (tests/fuzz/<name>/corpus) for FUZZ_RUNS inputs (default 20000) with libFuzzer's seed
#     FUZZ_SEED (default 1, so that CI runs differ little), inputs of at most 4 KiB and 10 s each: a
#     crash, an uncaught exception, a sanitizer report, a leak or a hang fails. A failing input is
#     kept as $FUZZ_OUT/<name>/crash-* (default /tmp/treetrain-fuzz) and can be replayed with
#     `bazel-bin/tests/fuzz/<name> FILE` from the sanitize output base's bazel-bin.
# Its time on 2 cores is recorded in docs/CONVENTIONS.md ("Sanitizers and fuzzing").
# Environment: FUZZ_RUNS, FUZZ_SEED, FUZZ_OUT, SANITIZE_SKIP_TESTS=1, SANITIZE_SKIP_FUZZ=1.
set -uo pipefail
cd "$(dirname "$0")/.."

FUZZ_RUNS=${FUZZ_RUNS:-20000}
FUZZ_SEED=${FUZZ_SEED:-1}
FUZZ_OUT=${FUZZ_OUT:-/tmp/treetrain-fuzz}
FUZZERS="jsonl_reader config safetensors rendezvous image episodes"

main_base=$(bazel info output_base 2>/dev/null) || { echo "sanitize: bazel info failed" >&2; exit 1; }
sbazel() { bazel --output_base="${main_base}-sanitize" "$@"; }

status=0
summary=()
t0=$SECONDS

if [ "${SANITIZE_SKIP_TESTS:-0}" != 1 ]; then
  start=$SECONDS
  log=$(mktemp)
  # //... without the workspace's bazel-* links: they lead into the main build's output base,
  # which this Bazel server does not know as its own, so //... would read the BUILD files there
  # (and a negative pattern does not stop that): every top-level folder with packages that is
  # not a link.
  patterns=(//:all)
  for d in */; do
    d=${d%/}
    [ -L "$d" ] || [ -z "$(find "$d" \( -name BUILD.bazel -o -name BUILD \) -print -quit)" ] || patterns+=("//$d/...")
  done
  sbazel test --config=asan --test_tag_filters=-gpu,-no_sanitize --build_tests_only --test_summary=short \
    "${patterns[@]}" 2>&1 | tee "$log" |
    grep -E '^//|^INFO: Elapsed|^ERROR|^FAIL'
  rc=${PIPESTATUS[0]}
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
  failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log")
  rm -f "$log"
  [ "$rc" -ne 0 ] && status=1
  summary+=("sanitize: ASan+UBSan tests: ${passed} passed, ${failed} failed (rc ${rc}) in $((SECONDS - start)) s")
fi

if [ "${SANITIZE_SKIP_FUZZ:-0}" != 1 ]; then
  start=$SECONDS
  targets=""
  for f in $FUZZERS; do targets+=" //tests/fuzz:${f}_fuzz"; done
  sbazel build --config=asan $targets 2>&1 | grep -E '^ERROR|error:' || true
  bin=$(sbazel info --config=asan bazel-bin 2>/dev/null)
  summary+=("sanitize: fuzz targets built in $((SECONDS - start)) s")
  for f in $FUZZERS; do
    start=$SECONDS
    exe="$bin/tests/fuzz/${f}_fuzz"
    work="$FUZZ_OUT/$f"
    rm -rf "$work" && mkdir -p "$work/corpus"
    if [ ! -x "$exe" ]; then
      status=1
      summary+=("sanitize: fuzz ${f}: FAILED TO BUILD")
      continue
    fi
    # The first folder collects new inputs; the committed seeds are only read.
    timeout 600 "$exe" -runs="$FUZZ_RUNS" -seed="$FUZZ_SEED" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "tests/fuzz/$f/corpus" >"$work/log.txt" 2>&1
    rc=$?
    done_runs=$(grep -oE '^Done [0-9]+ runs' "$work/log.txt" | grep -oE '[0-9]+' | tail -1)
    if [ "$rc" -ne 0 ] || [ "${done_runs:-0}" -lt "$FUZZ_RUNS" ]; then
      status=1
      summary+=("sanitize: fuzz ${f}: FAILED (rc ${rc}, ${done_runs:-0} runs; log ${work}/log.txt) in $((SECONDS - start)) s")
      tail -40 "$work/log.txt"
      ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null
    else
      cov=$(grep -oE 'cov: [0-9]+' "$work/log.txt" | tail -1)
      summary+=("sanitize: fuzz ${f}: ${done_runs} inputs, no crash, leak or hang (${cov}) in $((SECONDS - start)) s")
    fi
  done
fi

printf '%s\n' "${summary[@]}"
echo "sanitize: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
exit $status
