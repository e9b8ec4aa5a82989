#!/usr/bin/env bash
# Hybrid models on the GPU machine (issue 15): the CUDA decoder with Gated DeltaNet layers against
# the fp64 CPU decoder (tests/model_cuda/hybrid_cuda_test; generation with the recurrent state in
# the cache: generate_cuda_test), the ops the hybrid layers added or
# changed (the delta rule and the GDN row ops, gated attention, RMSNorm's weight offset, partial
# RoPE), the dense decoder and trainer backend tests those changes touch, then `ops_bench gdn` and
# `train_bench --model hybrid_2b` (the ~2B 3 : 1 hybrid's training step, tree vs per-path).
#
#   scripts/device/hybrid_check.sh stage   here (no GPU): bazel build, copy the stripped binaries
#                                          to .device/hybrid/ (ignored by git; carried)
#   scripts/device/hybrid_check.sh [run]   there: tests into $OUT/tests.log, the benchmark into
#                                          $OUT/bench.txt, summary.txt; a short table last
# Device run:  run(command="scripts/device/hybrid_check.sh", carry=[".device"])
# Environment: SKIP_BENCH=1, SKIP_TRAIN=1, TRAIN_ARGS (extra train_bench flags), TESTS (default below),
# COMPARE=1 (transformers' torch_chunk_gated_delta_rule timed too: scripts/device/gdn_compare.py).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/hybrid
TESTS=${TESTS:-"hybrid_cuda_test generate_cuda_test gdn_test gated_attention_test rmsnorm_test rope_test qk_norm_rope_test model_cuda_test backend_cuda_test"}

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/model_cuda:hybrid_cuda_test //tests/model_cuda:generate_cuda_test \
    //tests/model_cuda:model_cuda_test //tests/model_cuda:backend_cuda_test \
    //tests/ops_cuda:gdn_test //tests/ops_cuda:gated_attention_test //tests/ops_cuda:rmsnorm_test \
    //tests/ops_cuda:rope_test //tests/ops_cuda:qk_norm_rope_test //bench:ops_bench //bench:train_bench || exit 1
  stage_binaries "$DIR" bazel-bin/tests/model_cuda/hybrid_cuda_test bazel-bin/tests/model_cuda/generate_cuda_test \
    bazel-bin/tests/model_cuda/model_cuda_test \
    bazel-bin/tests/model_cuda/backend_cuda_test bazel-bin/tests/ops_cuda/gdn_test \
    bazel-bin/tests/ops_cuda/gated_attention_test bazel-bin/tests/ops_cuda/rmsnorm_test \
    bazel-bin/tests/ops_cuda/rope_test bazel-bin/tests/ops_cuda/qk_norm_rope_test bazel-bin/bench/ops_bench \
    bazel-bin/bench/train_bench
  exit 0
fi

device_setup "$DIR" /tmp/hybrid_check

for t in $TESTS; do run_gtest "$t" 200 90; done

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 200 "$DIR/ops_bench" gdn >"$OUT/bench.txt" 2>&1
  echo "ops_bench gdn rc=$?" >>"$summary"
fi

# transformers' torch_chunk_gated_delta_rule on the same shape, eager and torch.compile'd, in the
# same call as ops_bench gdn: off unless COMPARE=1 (up to 240 s + COMPILE_TIMEOUT_S, default 300:
# run it with TESTS=' ' SKIP_TRAIN=1 to stay within a device call).
if [ "${COMPARE:-0}" = 1 ]; then
  : >"$OUT/gdn_compare.jsonl"
  timeout 240 python3 scripts/device/gdn_compare.py --mode eager >>"$OUT/gdn_compare.jsonl" 2>"$OUT/gdn_compare.log"
  echo "gdn_compare eager rc=$?" >>"$summary"
  timeout "${COMPILE_TIMEOUT_S:-300}" python3 scripts/device/gdn_compare.py --mode compile \
    >>"$OUT/gdn_compare.jsonl" 2>>"$OUT/gdn_compare.log"
  echo "gdn_compare compile rc=$? (124: not done within ${COMPILE_TIMEOUT_S:-300} s)" >>"$summary"
fi

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  timeout 400 "$DIR/train_bench" --model hybrid_2b ${TRAIN_ARGS:-} >"$OUT/train_hybrid.json" 2>"$OUT/train_hybrid.log"
  echo "train_bench hybrid_2b rc=$?" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$\|error:' "$OUT/tests.log" | head -60
echo "----- errors"
grep '^\[ errors' "$OUT/tests.log" | head -30
echo "----- benchmark"
sed -n '/^op /,$p' "$OUT/bench.txt" 2>/dev/null
echo "----- transformers torch_chunk_gated_delta_rule"
cat "$OUT/gdn_compare.jsonl" 2>/dev/null
grep -iE "error|Traceback" "$OUT/gdn_compare.log" 2>/dev/null | tail -3
echo "----- train_bench hybrid_2b"
python3 - "$OUT/train_hybrid.json" <<'PY' 2>/dev/null || tail -5 "$OUT/train_hybrid.log" 2>/dev/null
import json, sys
j = json.load(open(sys.argv[1]))
for w, r in j["workloads"].items():
    t, p = r["tree"], r["per_path"]
    print(f"{w}: tree {t['step_s']*1e3:.0f} ms MFU {t['mfu']:.3f}; per-path {p['step_s']*1e3:.0f} ms MFU {p['mfu']:.3f}; "
          f"speedup {r['speedup']:.2f} vs executed FLOP ratio {r['executed_flop_ratio']:.2f} "
          f"({r['speedup_over_executed_flop_ratio']:.3f}); loss rel diff {r['loss_rel_diff']:.2e}")
for w, b in j.get("breakdown", {}).items():
    print(w, json.dumps(b["tree"]))
PY
echo "----- tests"
cat "$summary"
