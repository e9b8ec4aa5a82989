#!/usr/bin/env bash
# Tree partitioning on the GPU with a Qwen3-1.7B-shaped model (configs/qwen3_1p7b.yaml):
#  (1) a tree that fits unpartitioned (14336 unique tokens), trained whole and partitioned
#      (capacity 4096): step time, tokens/s and peak device memory side by side;
#  (2) one rollout tree of about 1.2M unique tokens, partitioned (capacity 8192).
# Stage here: scripts/device/train_check.sh stage (it copies treetrain to .device/model_cuda);
# run there: run(command="scripts/device/partition_check.sh", carry=[".device"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/partition_check}
mkdir -p "$OUT"
tt=.device/model_cuda/treetrain
W=/tmp/partition_check_work
rm -rf "$W" && mkdir -p "$W"

"$tt" generate --kind rollouts --out "$W/small.jsonl" --num-trees 1 --vocab-size 151936 --seed 3 \
  --prompt-len 4096 --turns 3 --turn-len 1024 --branches 2 --branch-turns 2 >/dev/null
"$tt" generate --kind rollouts --out "$W/big.jsonl" --num-trees 1 --vocab-size 151936 --seed 4 \
  --prompt-len 4096 --turns 5 --turn-len 2048 --branches 4 --branch-turns 4 >/dev/null
"$tt" stats --data "$W/big.jsonl" --format rollouts --capacity 8192 >"$OUT/big_stats.json"

run() {  # NAME DATA EXTRA...
  local name=$1 data=$2
  shift 2
  timeout 240 "$tt" train --config configs/qwen3_1p7b.yaml --set run_dir=$W/$name --set data.path=$data "$@" \
    >"$OUT/$name.log" 2>&1
  echo "$name rc=$?"
  tail -1 "$W/$name/metrics.jsonl" >"$OUT/$name.last.json" 2>/dev/null
}

run small_whole "$W/small.jsonl" --set data.max_tokens_per_batch=16384
run small_partitioned "$W/small.jsonl" --set data.max_tokens_per_batch=4096 --set partition.capacity_tokens=4096
run big_partitioned "$W/big.jsonl" --set data.max_tokens_per_batch=8192 --set partition.capacity_tokens=8192 \
  --set train.max_steps=2

grep -h "partition: tree" "$OUT"/*.log | head -3
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(json.dumps(json.load(open(f"{out}/big_stats.json")).get("partition", {})))
print(f"{'run':18} {'n_tree':>8} {'pieces':>6} {'step s':>7} {'tok/s':>8} {'MFU':>6} {'peak GiB':>8} {'loss':>8}")
for name in ("small_whole", "small_partitioned", "big_partitioned"):
    try:
        r = json.load(open(f"{out}/{name}.last.json"))
    except Exception as e:
        print(f"{name:18} no metrics ({e})"); continue
    print(f"{name:18} {r['n_tree']:>8} {r['pieces']:>6} {r['step_s']:>7.2f} {r['tokens_per_s']:>8.0f} "
          f"{100*r['mfu']:>5.1f}% {r.get('device_peak_gib', 0):>8.1f} {r['loss']:>8.4f}")
PY
