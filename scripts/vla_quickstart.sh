#!/usr/bin/env bash
# The VLA quickstart (configs/vla_quickstart.yaml): expert episodes of the built-in navigation
# environment, a tiny VLA trained on them as episode trees, then closed-loop evaluation on
# held-out layouts against a random policy and the same model with every frame black; it checks
# the targets (success >= 0.5, and >= 3x each baseline) and exits 1 when they are missed.
# SHORT=1 (CI): 40 episodes, 20 steps, 10 eval episodes, targets not checked. Extra arguments go
# to `treetrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
bazel build //:treetrain
bin=bazel-bin/trainer/treetrain

run_dir=runs/vla_quickstart
rm -rf "$run_dir"
mkdir -p "$run_dir"
episodes=400 steps=800 eval=100
if [ "${SHORT:-0}" = 1 ]; then episodes=40 steps=20 eval=10; fi
start=$(date +%s)
"$bin" generate --kind nav-episodes --out "$run_dir/episodes.jsonl" --num-episodes "$episodes" --seed 1
"$bin" train --config configs/vla_quickstart.yaml --set train.max_steps="$steps" "$@"
"$bin" eval --env nav --checkpoint "$run_dir" --episodes "$eval" --seed 7777 | tee "$run_dir/eval.json"
echo "vla quickstart: $(( $(date +%s) - start )) s for data, training and evaluation"
[ "${SHORT:-0}" = 1 ] && exit 0
python3 - "$run_dir/eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m, rnd, zero = r["model"]["success"], r["random"]["success"], r["zeroed_images"]["success"]
ok = m >= 0.5 and m >= 3 * rnd and m >= 3 * zero
print(f"success {m:.3f} (target >= 0.5), random {rnd:.3f}, zeroed images {zero:.3f} (targets: 3x each): "
      + ("met" if ok else "MISSED"))
sys.exit(0 if ok else 1)
PY
