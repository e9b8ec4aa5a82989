#!/usr/bin/env bash
# Tree attention on the GPU machine: tests, sanitizers, benchmark, and the side-by-side comparison
# with PyTorch FlexAttention (tree mask) and dense causal SDPA on the same trees.
#
#   scripts/device/attention_check.sh stage   here (no GPU): bazel build the attention tests and
#                                             bench:attention_bench, copy the stripped binaries
#                                             (and libgomp, which the CPU reference links) to
#                                             .device/attention/ (ignored by git; carried)
#   scripts/device/attention_check.sh [run]   there: the benchmark on the public workloads (16
#                                             heads, head dim 128, 16 and 8 KV heads), then
#                                             attention_compare.py, the tests, compute-sanitizer
#                                             on small cases, ncu counters of one forward
#                                             and backward; logs in $OUT (tests.log,
#                                             sanitizer.log, bench.jsonl, causal.jsonl,
#                                             compare.jsonl, compare.log, ncu.txt, summary.txt);
#                                             a short table last.
# Device run:  run(command="scripts/device/attention_check.sh", carry=[".device"], timeout_s=300)
# Environment: QUICK=1 skips the comparison and ncu (tests, sanitizers and our timings only);
# HEAD_DIMS (default 128) the benchmark's head dims, e.g. "128 256"; WORKLOADS, KV_HEADS likewise;
# CHILD_ORDERS (default largest, what training packs) the layouts, e.g. "largest listed";
# SAN_FILTER the gtest filter of the sanitizer runs; SKIP_TESTS=1 skips the tests and sanitizers;
# SKIP_NCU=1 the counters;
# COMPARE_BUDGET_S (default 120) stops starting new comparison rows after that long;
# COMPARE_TIMEOUT_S (default 170) ends the comparison (the rows done so far are still tabled).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/attention

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/ops_cuda_attention:attention_test //tests/ops_cuda_attention:attention_decode_test \
    //bench:attention_bench || exit 1
  rm -rf "$DIR" && mkdir -p "$DIR/lib"
  cp bazel-bin/tests/ops_cuda_attention/attention_test bazel-bin/tests/ops_cuda_attention/attention_decode_test \
    bazel-bin/bench/attention_bench "$DIR/"
  cp "$(ldd "$DIR/attention_test" | awk '/libgomp/ {print $3}')" "$DIR/lib/"
  chmod u+w "$DIR"/* "$DIR"/lib/* && strip "$DIR/attention_test" "$DIR/attention_decode_test" "$DIR/attention_bench"
  du -sh "$DIR"
  exit 0
fi

OUT=${OUT:-/tmp/attention_check}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
summary="$OUT/summary.txt"
: >"$summary"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv \
  >"$OUT/tests.log" 2>&1

# 1. Our timings, dumping each layout for the comparison.
: >"$OUT/bench.jsonl"
for hd in ${HEAD_DIMS:-128}; do
  for order in ${CHILD_ORDERS:-largest}; do
  for wl in ${WORKLOADS:-comb rollout comb_short trunk}; do
    for kv in ${KV_HEADS:-16 8}; do
      timeout 60 "$DIR/attention_bench" --workload $wl --heads 16 --kv-heads $kv --head-dim $hd \
        --child-order $order --dump "/tmp/attn_${wl}_${order}_" >>"$OUT/bench.jsonl" 2>>"$OUT/tests.log" ||
        echo "bench $wl kv=$kv hd=$hd order=$order failed" >>"$summary"
    done
  done
  done
done
: >"$OUT/causal.jsonl"
for hd in ${HEAD_DIMS:-128}; do
  timeout 60 "$DIR/attention_bench" --workload causal --n 16384 --heads 16 --kv-heads 16 --head-dim $hd \
    >>"$OUT/causal.jsonl" 2>>"$OUT/tests.log" || echo "bench causal hd=$hd failed" >>"$summary"
done
# MHA rows first: each new shape recompiles FlexAttention; the listed layouts (comparisons) last.
{ grep '"kv_heads": 16' "$OUT/bench.jsonl" | grep -v ':listed'; grep -v '"kv_heads": 16' "$OUT/bench.jsonl" | grep -v ':listed'
  grep ':listed' "$OUT/bench.jsonl"; } >/tmp/attn_rows.jsonl

# 2. FlexAttention and SDPA on the same trees.
[ "${QUICK:-0}" = 1 ] || PYTHONUNBUFFERED=1 timeout -k 10 "${COMPARE_TIMEOUT_S:-170}" python3 scripts/device/attention_compare.py \
  --ours /tmp/attn_rows.jsonl --out "$OUT/compare.jsonl" --budget-s "${COMPARE_BUDGET_S:-120}" \
  --warmup 2 --iters 5 >"$OUT/compare.log" 2>&1
echo "attention_compare rc=$?" >>"$summary"

# 3. Correctness against the fp64 CPU reference.
: >"$OUT/sanitizer.log"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
failed_pat='^\[  FAILED  \].*[(]'  # the per-test lines (with their times), not the closing list
for t in attention_test attention_decode_test; do
  start=$SECONDS
  timeout 120 "$DIR/$t" --gtest_color=no >"$OUT/$t.log" 2>&1
  rc=$?
  cat "$OUT/$t.log" >>"$OUT/tests.log"
  printf "%-22s rc=%d passed %d failed %d (%ds)\n" $t $rc "$(grep -c '^\[       OK \]' "$OUT/$t.log")" \
    "$(grep -c "$failed_pat" "$OUT/$t.log")" $((SECONDS - start)) >>"$summary"
done

# 4. Out-of-bounds accesses and shared-memory races on small cases.
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
  start=$SECONDS
  timeout 60 "$SAN" --tool $tool --error-exitcode 9 "$DIR/attention_test" --gtest_color=no \
    --gtest_filter="${SAN_FILTER:-*chain97*:*wide_fan*:*comb_hs64*}" >>"$OUT/sanitizer.log" 2>&1
  printf "sanitizer %-9s rc=%d (%ds)\n" $tool $? $((SECONDS - start)) >>"$summary"
done
fi
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.log" | sort | uniq -c >>"$summary"

# 5. Hardware counters of one forward and one backward launch (comb, 16 heads).
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ "${QUICK:-0}" = 1 ] || [ "${SKIP_NCU:-0}" = 1 ] || timeout 60 "$NCU" --clock-control none -k regex:'attention_(fwd|bwd)_kernel' --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy --section WarpStateStats --section LaunchStats \
  "$DIR/attention_bench" --workload comb --iters 1 --warmup 0 >"$OUT/ncu.txt" 2>&1
echo "ncu rc=$?" >>"$summary"

echo "----- failures"
grep -B2 -A10 'Failure$' "$OUT/tests.log" | head -60
grep -E "Invalid|race|Race" "$OUT/sanitizer.log" | head -10
echo "----- accuracy (rel L2 vs fp64)"
grep -E '^[a-z_0-9]+ +N=' "$OUT/tests.log"
echo "----- ours (JSON)"
cat "$OUT/bench.jsonl" "$OUT/causal.jsonl"
echo "----- comparison"
grep -v Warning "$OUT/compare.log" | tail -16
echo "----- summary"
cat "$summary"
