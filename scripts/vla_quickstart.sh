#!/usr/bin/env bash
# The VLA quickstart: expert episodes of the built-in navigation environment, a tiny VLA trained
# on them as episode trees, then closed-loop evaluation on held-out layouts against a random
# policy and the same model with every frame black; it checks the targets (success >= 0.5, and
# >= 3x each baseline) and exits 1 when they are missed.
# Two recipes of the same task (the same environment, data format and evaluation):
#  - GPU (configs/vla_quickstart_gpu.yaml, device: cuda): when `nvidia-smi -L` succeeds and a GPU
#    reports compute capability 9.0 (the CUDA backend is built for Hopper, sm_90a). Heads of 64
#    (what the CUDA attention takes), a wider model, 3200 episodes, 3000 steps of 8192 tokens.
#  - CPU (configs/vla_quickstart.yaml, device: auto -> cpu with its heads of 32): otherwise.
#    400 episodes, 800 steps of 2048 tokens; about 4 minutes on 2 cores.
# VLA_DEVICE=cpu or VLA_DEVICE=cuda forces a recipe. SHORT=1 (CI): 40 episodes, 20 steps, 10 eval
# episodes, targets not checked. TREETRAIN=path/to/treetrain runs that binary instead of building
# one (setup and build are skipped). Extra arguments go to `treetrain train`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${TREETRAIN:-}" ]; then
  bin=$TREETRAIN
else
  scripts/setup.sh
  bazel build //:treetrain
  bin=bazel-bin/trainer/treetrain
fi

hopper_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' ' | grep -qx '9.0'
}
device=${VLA_DEVICE:-auto}
if [ "$device" = auto ]; then
  if hopper_gpu; then device=cuda; else device=cpu; fi
fi
case "$device" in
  cuda) config=configs/vla_quickstart_gpu.yaml episodes=3200 steps=3000 ;;
  cpu) config=configs/vla_quickstart.yaml episodes=400 steps=800 ;;
  *) echo "VLA_DEVICE: expected auto, cpu or cuda, got '$device'" >&2; exit 2 ;;
esac
echo "vla quickstart: the $device recipe ($config)"

run_dir=runs/vla_quickstart
rm -rf "$run_dir"
mkdir -p "$run_dir"
eval=100
if [ "${SHORT:-0}" = 1 ]; then episodes=40 steps=20 eval=10; fi
start=$(date +%s)
"$bin" generate --kind nav-episodes --out "$run_dir/episodes.jsonl" --num-episodes "$episodes" --seed 1
train_start=$(date +%s)
"$bin" train --config "$config" --set train.max_steps="$steps" "$@"
train_s=$(( $(date +%s) - train_start ))
"$bin" eval --env nav --checkpoint "$run_dir" --episodes "$eval" --seed 7777 | tee "$run_dir/eval.json"
echo "vla quickstart ($device): $(( $(date +%s) - start )) s for data, training ($train_s s) and evaluation"
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
