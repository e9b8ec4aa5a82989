#!/usr/bin/env bash
# Where a tree's attention rate goes, against dense causal at the same length: attention_bench on
# the tree and on causal at its N (and at 16384), then ncu counters of one forward and backward of
# each (tensor-pipe activity, every SM's active cycles min / avg / max for load balance, L2 hit
# rate, DRAM bytes, the backward's dQ reductions).
#
#   scripts/device/attention_gap.sh stage   here: bazel build //bench:attention_bench, copy it to
#                                           .device/attention_gap/ (ignored by git, carried)
#   scripts/device/attention_gap.sh [run]   there: logs in $OUT (default /tmp/attention_gap):
#                                           bench.jsonl, ncu.txt; a short table last
# Device run:  run(command="scripts/device/attention_gap.sh", carry=[".device/attention_gap"])
# Environment: WORKLOAD (default rollout), N (its packed length, default 89684: the rollout's),
# HEADS (16), KV_HEADS ("16 8").
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=.device/attention_gap
. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //bench:attention_bench || exit 1
  stage_binaries "$DIR" bazel-bin/bench/attention_bench
  exit 0
fi

device_setup "$DIR" /tmp/attention_gap
B=$DIR/attention_bench
W=${WORKLOAD:-rollout} N=${N:-89684} H=${HEADS:-16}
: >"$OUT/bench.jsonl"
for w in "$W" "causal --n $N" "causal --n 16384"; do
  for kv in ${KV_HEADS:-16 8}; do
    timeout 120 $B --workload $w --heads "$H" --kv-heads "$kv" --iters 10 --warmup 3 >>"$OUT/bench.jsonl"
  done
done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
M=$M,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_red.sum
: >"$OUT/ncu.txt"
for w in "$W" "causal --n $N"; do
  echo "== ncu $w" >>"$OUT/ncu.txt"
  timeout 200 "$NCU" --clock-control none --metrics "$M" -k regex:"attention_(bwd|fwd)_kernel" --launch-count 2 \
    $B --workload $w --heads "$H" --kv-heads 16 --iters 1 --warmup 0 2>/dev/null |
    grep -E 'attention_|gpu__|sm__|lts__|dram__' >>"$OUT/ncu.txt"
done
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
print(f"{'workload':<16} {'N':>7} {'KV':>3} {'fwd TF/s':>9} {'bwd TF/s':>9} {'total TF/s':>10}")
for line in open(sys.argv[1]):
    if line.startswith("{"):
        j = json.loads(line)
        print(f"{j['workload']:<16} {j['n']:>7} {j['kv_heads']:>3} {j['fwd_tflops']:>9.0f} {j['bwd_tflops']:>9.0f} "
              f"{j['total_tflops']:>10.0f}")
PY
cat "$OUT/ncu.txt"
