#!/usr/bin/env bash
# The VLA path on the GPU (issue 16): the vision ops and the bidirectional tree attention against
# the CPU reference, the VLA decoder against the fp64 CPU decoder, a `treetrain` VLA run on cuda
# next to the same run on the cpu, then the Robostral-shaped benchmark (bench/vla_bench.cc).
#
#   scripts/device/vla_check.sh stage   here (no GPU): bazel build, copy the stripped binaries to
#                                       .device/vla/ (ignored by git; carried by the device run)
#   scripts/device/vla_check.sh [run]   there: tests (the first failing case re-run under
#                                       compute-sanitizer memcheck), the CLI runs, the benchmark;
#                                       logs under $OUT (tests.log, cli.log, bench.json, bench.log,
#                                       summary.txt); a short table is printed last.
# Device run:  run(command="scripts/device/vla_check.sh", carry=[".device"])
# Environment: BENCH_ARGS (extra vla_bench flags), SKIP_BENCH=1, SKIP_TESTS=1, SKIP_CLI=1.
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/vla
TESTS="vision_test attention_test vla_cuda_test model_cuda_test"

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/ops_cuda:vision_test //tests/ops_cuda_attention:attention_test //tests/model_cuda:vla_cuda_test \
    //tests/model_cuda:model_cuda_test //bench:vla_bench //trainer:treetrain || exit 1
  stage_binaries "$DIR" bazel-bin/tests/ops_cuda/vision_test bazel-bin/tests/ops_cuda_attention/attention_test \
    bazel-bin/tests/model_cuda/vla_cuda_test bazel-bin/tests/model_cuda/model_cuda_test \
    bazel-bin/bench/vla_bench bazel-bin/trainer/treetrain
  exit 0
fi

device_setup "$DIR" /tmp/vla_check
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $TESTS; do run_gtest "$t" 150 60; done
  if [ -x "$san" ]; then  # the new kernels' memory accesses, on their smaller cases
    set -f
    for spec in "vision_test" "attention_test:*frames16*:*bidirectional_tree_hs64*"; do
      bin=${spec%%:*} filter=""
      [ "$bin" != "$spec" ] && filter="--gtest_filter=${spec#*:}"
      echo "===== memcheck $bin $filter" >>"$OUT/tests.log"
      timeout 120 "$san" --tool memcheck --error-exitcode 9 "$DIR/$bin" --gtest_brief=1 $filter >>"$OUT/tests.log" 2>&1
      printf "%-22s memcheck rc=%d %s\n" "$bin" $? "$filter" >>"$summary"
    done
    set +f
  fi
fi

if [ "${SKIP_CLI:-0}" != 1 ]; then
  # The tiny VLA with CUDA-sized heads (64), trained through the CLI on cuda and on cpu from the
  # same seed: both must finish, and the cuda losses track the cpu ones (bf16 vs fp32).
  tt="$DIR/treetrain"
  W=$OUT/cli
  rm -rf "$W" && mkdir -p "$W"
  sets="--set model.head_dim=64 --set model.hidden_size=128 --set vision.hidden_size=128 --set train.max_steps=30"
  sets="$sets --set train.checkpoint_every=30 --set data.path=$W/episodes.jsonl"
  {
    "$tt" generate --kind toy-episodes --out "$W/episodes.jsonl" &&
    for dev in cuda cpu; do
      "$tt" --config configs/vla_tiny.yaml $sets --set device=$dev --set run_dir=$W/$dev || exit 1
    done
  } >"$OUT/cli.log" 2>&1
  printf "%-20s rc=%d\n" "cli vla_tiny" $? >>"$summary"
  for dev in cuda cpu; do
    grep -h '"loss"' "$W/$dev/metrics.jsonl" 2>/dev/null | tail -1 | cut -c1-200 | sed "s/^/$dev: /" >>"$summary"
  done
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 420 "$DIR/vla_bench" ${BENCH_ARGS:-} >"$OUT/bench.json" 2>"$OUT/bench.log"
  echo "vla_bench rc=$?" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$\|error:' "$OUT/tests.log" | head -60
grep -E '^========= (Invalid|Error|.*SUMMARY)' "$OUT/tests.log" | head -20
tail -5 "$OUT/cli.log" 2>/dev/null
echo "----- benchmark"
python3 - "$OUT/bench.json" <<'PY' 2>/dev/null || tail -20 "$OUT/bench.log"
import json, sys
d = json.load(open(sys.argv[1]))
for name, h in d["histories"].items():
    t, p = h.get("tree", {}), h.get("per_timestep", {})
    print(f"{name}: tokens {h['tokens_tree']} vs {h['tokens_per_timestep']} ({h['token_ratio']:.1f}x), "
          f"frames {h['tower_frames_tree']} vs {h['tower_frames_per_timestep']}, reuse {h['frame_reuse_tree']:.2f}, "
          f"step {t.get('step_s', 0):.3f} vs {p.get('step_s', 0):.3f} s, speedup {h.get('speedup', 0):.2f} "
          f"/ executed {h['executed_flop_ratio']:.2f} = {h.get('speedup_over_executed_flop_ratio', 0):.3f}, "
          f"MFU {t.get('mfu', 0):.3f} vs {p.get('mfu', 0):.3f}")
b = d.get("breakdown_full_tree")
if b: print(f"vision share of the tree step's GPU time: {b['vision_share']:.3f} ({b['vision_ms']:.1f} of {b['total_ms']:.1f} ms)")
PY
echo "----- tests"
cat "$summary"
