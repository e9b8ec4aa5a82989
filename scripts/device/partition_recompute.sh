#!/usr/bin/env bash
# partition.recompute on the GPU, through `treetrain train` with configs/qwen3_1p7b.yaml (all 28
# layers): single sequences cut into a chain of pieces, trained with and without recompute.
#  (1) a 16k-token sequence, capacity 4096 (4 pieces): both ways fit; step time, peak memory and
#      the loss side by side (recompute runs the first three pieces' forward twice);
#  (2) a 64k-token sequence, capacity 4096 (16 pieces): without recompute the chain's activations
#      do not fit (the error, with its hint, is kept); with it, the step trains;
#  (3) a 96k-token sequence (24 pieces) with recompute, to see where the K/V rows stop fitting.
# With HYBRID=1 instead: configs/qwen3_next_2b.yaml (3 Gated DeltaNet : 1 gated attention, the
# recurrent state and conv tail crossing every cut), 32k and 64k tokens, with and without.
# Stage here: scripts/device/partition_recompute.sh stage (treetrain into .device/partition_recompute);
# run there: run(command="scripts/device/partition_recompute.sh", carry=[".device"]).
set -uo pipefail
cd "$(dirname "$0")/../.."

. scripts/device/lib.sh

DIR=.device/partition_recompute
if [ "${1:-run}" = "stage" ]; then
  bazel build //trainer:treetrain || exit 1
  stage_binaries "$DIR" bazel-bin/trainer/treetrain
  exit 0
fi

device_setup "$DIR" /tmp/partition_recompute
tt=$DIR/treetrain
W=/tmp/partition_recompute_work
rm -rf "$W" && mkdir -p "$W"

chain() {  # FILE TOKENS SEED: one rollouts group of one sequence, every token a target
  python3 - "$@" <<'PY'
import json, random, sys
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
seq = {"tokens": [rng.randrange(151936) for _ in range(n)], "loss_mask": [1] * n, "weight": 1.0}
open(path, "w").write(json.dumps({"id": f"chain{n // 1024}k", "sequences": [seq]}) + "\n")
PY
}
chain "$W/c16k.jsonl" 16384 1
chain "$W/c64k.jsonl" 65536 2
chain "$W/c96k.jsonl" 98304 3

CONFIG=configs/qwen3_1p7b.yaml
run() {  # NAME DATA RECOMPUTE STEPS
  local name=$1 data=$2 rec=$3 steps=$4
  local t0=$SECONDS
  timeout 300 "$tt" train --config $CONFIG --set run_dir=$W/$name --set data.path=$data \
    --set data.max_tokens_per_batch=4096 --set partition.capacity_tokens=4096 --set partition.recompute=$rec \
    --set model.max_position_embeddings=131072 --set train.max_steps=$steps >"$OUT/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s" | tee -a "$summary"
  cp "$W/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}

if [ "${HYBRID:-0}" = 1 ]; then
  CONFIG=configs/qwen3_next_2b.yaml
  chain "$W/c32k.jsonl" 32768 4
  names="h32k_keep h32k_recompute h64k_keep h64k_recompute"
  run h32k_keep "$W/c32k.jsonl" false 3
  run h32k_recompute "$W/c32k.jsonl" true 3
  run h64k_keep "$W/c64k.jsonl" false 2
  run h64k_recompute "$W/c64k.jsonl" true 2
else
  names="c16k_keep c16k_recompute c64k_keep c64k_recompute c96k_recompute"
  run c16k_keep "$W/c16k.jsonl" false 4
  run c16k_recompute "$W/c16k.jsonl" true 4
  run c64k_keep "$W/c64k.jsonl" false 2
  run c64k_recompute "$W/c64k.jsonl" true 3
  run c96k_recompute "$W/c96k.jsonl" true 2
fi

grep -h "partition: tree" "$OUT"/*.log | sort -u | tee -a "$summary"
for f in "$OUT"/*64k_keep.log; do
  echo "--- tail of $(basename "$f")" | tee -a "$summary"
  tail -3 "$f" | cut -c1-1200 | tee -a "$summary"
done
python3 - "$OUT" $names <<'PY' | tee -a "$summary"
import json, sys
out, names = sys.argv[1], sys.argv[2:]
print(f"{'run':16} {'steps':>5} {'n_tree':>7} {'pieces':>6} {'step s (median)':>15} {'tok/s':>8} {'MFU':>6} "
      f"{'exec TFLOP':>10} {'peak GiB':>8}  losses")
for name in names:
    try:
        rows = [json.loads(l) for l in open(f"{out}/{name}.metrics.jsonl") if '"step"' in l]
    except OSError:
        rows = []
    if not rows:
        print(f"{name:16} no steps"); continue
    later = rows[1:] or rows
    st = sorted(r["step_s"] for r in later)[len(later) // 2]
    r = rows[-1]
    print(f"{name:16} {len(rows):>5} {r['n_tree']:>7} {r['pieces']:>6} {st:>15.3f} {r['tokens_per_s']:>8.0f} "
          f"{100 * r['mfu']:>5.1f}% {r.get('executed_flops', 0) / 1e12:>10.1f} "
          f"{max(x.get('device_peak_gib', 0) for x in rows):>8.1f}  "
          + " ".join(repr(x["loss"]) for x in rows))
PY
