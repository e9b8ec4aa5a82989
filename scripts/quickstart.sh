#!/usr/bin/env bash
# The main job of the README: installs what is missing, builds treetrain, generates tree-structured
# rollout data with a learnable pattern and trains a small Qwen3 on it (configs/quickstart.yaml).
# device: auto trains on the GPU when one is visible and the CUDA backend is built, else on the
# CPU backend. Extra arguments go to `treetrain train` (e.g. --set train.max_steps=50).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
bazel build //:treetrain
bin=bazel-bin/trainer/treetrain

run_dir=runs/quickstart
rm -rf "$run_dir"   # the quickstart always starts fresh
mkdir -p "$run_dir"
"$bin" generate --kind rollouts --out "$run_dir/data.jsonl" --num-trees 256 --vocab-size 256 --seed 1
"$bin" stats --data "$run_dir/data.jsonl" --format rollouts
"$bin" train --config configs/quickstart.yaml "$@"
echo "quickstart: metrics in $run_dir/metrics.jsonl, checkpoints in $run_dir/checkpoints/"
