#!/usr/bin/env bash
# Tree vs per_path training through `treetrain train` as a user runs it (issue 20), on the GPU
# machine: configs/qwen3_1p7b.yaml on GRPO groups (bench/grpo_groups.py: 1536-token prompts, 12
# responses of 256..1536 tokens, seed 1) and on navigation combs (`generate --kind comb`, prefix
# 512, 40 steps of 128 + 256 tokens, seed 1), the same data.max_tokens_per_batch (32768) for both
# packings (per_path spreads a tree's paths over micro-batches of one step), then the config as
# shipped (16384) on the GRPO groups. Needs .device/model_cuda/treetrain (train_check.sh stage).
#   run(command="scripts/device/cli_speed.sh", carry=[".device"])
# Logs stay in /tmp/cli_speed_runs/NAME.log, metrics are copied to $OUT. Prints per run: steps,
# flattened tokens/s, executed TFLOP/s, MFU; per workload: the tree's speedup in flattened
# tokens/s over per_path against the executed-FLOP ratio (per_path's executed FLOPs per flattened
# token over the tree's), both over the steady steps: after the first, and not timing GEMMs of a
# new token-count bucket (those are counted and printed apart).
# Env: STEPS_TREE (12), STEPS_PP (8), OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
tt=${TT:-.device/model_cuda/treetrain}
OUT=${OUT:-/tmp/cli_speed}
T=/tmp/cli_speed_runs
rm -rf "$T" && mkdir -p "$T" "$OUT"
for f in .device/*/lib; do export LD_LIBRARY_PATH="$PWD/$f${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
nt=${STEPS_TREE:-12}
np=${STEPS_PP:-8}
python3 bench/grpo_groups.py --out "$T/grpo.jsonl" --groups 24 --seed 1
"$tt" generate --kind comb --out "$T/nav.jsonl" --num-trees 12 --vocab-size 151936 --seed 1 \
  --prefix-len 512 --steps 40 --history-len 128 --leaf-len 256 >/dev/null
run() {  # NAME --set ...: one training run, its log in $OUT/NAME.log
  local name=$1
  shift
  local start=$SECONDS
  timeout 200 "$tt" train --config configs/qwen3_1p7b.yaml --set run_dir="$T/$name" "$@" >"$T/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - start))s"
}
grpo="--set data.path=$T/grpo.jsonl --set data.max_tokens_per_batch=32768"
nav="--set data.path=$T/nav.jsonl --set data.format=tree --set data.max_tokens_per_batch=32768"
run grpo_tree $grpo --set train.max_steps=$nt
run grpo_per_path $grpo --set data.packing=per_path --set train.max_steps=$np
run nav_tree $nav --set train.max_steps=$nt
run nav_per_path $nav --set data.packing=per_path --set train.max_steps=$np
run shipped --set data.path="$T/grpo.jsonl" --set train.max_steps=$nt
for r in grpo_tree grpo_per_path nav_tree nav_per_path shipped; do cp "$T/$r/metrics.jsonl" "$OUT/$r.metrics.jsonl" 2>/dev/null; done
python3 - "$T" <<'PY'
import json, sys
T = sys.argv[1]
def load(name):
    try:
        return [json.loads(l) for l in open(f"{T}/{name}/metrics.jsonl")]
    except Exception as e:
        print(f"{name}: no metrics ({e})"); return None
def summary(name, rows):
    # Steady state: the steps after the first that timed no GEMM (a step of a new token-count
    # bucket times its candidates; that cost is printed apart).
    use = [r for r in rows[1:] if r.get("gemm_tune_s", 0) == 0]
    tuned = [r for r in rows if r.get("gemm_tune_s", 0) > 0]
    t = sum(r["step_s"] for r in use)
    flat = sum(r["n_flat"] for r in use)
    ex = sum(r["executed_flops"] for r in use)
    mfu = sum(r["mfu"] * r["step_s"] for r in use) / t
    print(f"{name:14} steps {len(rows)} (steady {len(use)}), step {t/len(use):.3f} s, n_flat/s {flat/t:,.0f}, "
          f"executed {ex/t/1e12:.1f} TFLOP/s, MFU {100*mfu:.1f}%; {len(tuned)} steps timed GEMMs "
          f"({sum(r['gemm_tune_s'] for r in tuned):.2f} s), the first {rows[0]['step_s']:.2f} s "
          f"(tuning {rows[0].get('gemm_tune_s', 0):.2f} s)")
    return flat / t, ex / flat
res = {}
for name in ("grpo_tree", "grpo_per_path", "nav_tree", "nav_per_path", "shipped"):
    rows = load(name)
    if rows: res[name] = summary(name, rows)
for w in ("grpo", "nav"):
    if f"{w}_tree" in res and f"{w}_per_path" in res:
        (rt, ft), (rp, fp) = res[f"{w}_tree"], res[f"{w}_per_path"]
        speedup, ratio = rt / rp, fp / ft
        print(f"{w}: tree speedup {speedup:.3f}x in flattened tokens/s, executed-FLOP ratio {ratio:.3f}, "
              f"speedup / ratio {speedup/ratio:.3f} (target >= 0.95)")
PY
