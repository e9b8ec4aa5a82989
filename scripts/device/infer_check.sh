#!/usr/bin/env bash
# Inference on the GPU machine: the decode-mode attention and generation tests, generation
# against transformers, `treetrain sample` end to end, and the inference benchmark.
#
#   scripts/device/infer_check.sh stage   here (no GPU): bazel build the gpu tests
#                                         (attention_decode_test, sampling_test, generate_cuda_test), bench:infer_bench,
#                                         tests/hf:hf_parity_tool and treetrain; copy the stripped
#                                         binaries to .device/infer/ (ignored by git; carried)
#   scripts/device/infer_check.sh [run]   there: the tests, scripts/device/hf_parity.py and
#                                         hf_generate_parity.py (transformers), a tiny train + sample
#                                         + train-on-the-samples round trip on the GPU, then
#                                         infer_bench; logs in $OUT (tests.log, hf.log, sample.log,
#                                         infer.json, infer.log, summary.txt); a table last.
# Device run:  run(command="scripts/device/infer_check.sh", carry=[".device"])
# Environment: SKIP_BENCH=1, SKIP_HF=1, BENCH_ARGS (extra infer_bench flags).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/infer
TESTS="attention_decode_test sampling_test generate_cuda_test"

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/ops_cuda_attention:attention_decode_test //tests/ops_cuda:sampling_test \
    //tests/model_cuda:generate_cuda_test \
    //bench:infer_bench //tests/hf:hf_parity_tool //trainer:treetrain || exit 1
  rm -rf "$DIR" && mkdir -p "$DIR/lib"
  cp bazel-bin/tests/ops_cuda_attention/attention_decode_test bazel-bin/tests/ops_cuda/sampling_test \
    bazel-bin/tests/model_cuda/generate_cuda_test \
    bazel-bin/bench/infer_bench bazel-bin/tests/hf/hf_parity_tool bazel-bin/trainer/treetrain "$DIR/"
  chmod u+w "$DIR"/* && strip "$DIR"/* 2>/dev/null
  cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$DIR/lib/"  # fallback only
  du -sh "$DIR"
  exit 0
fi

if ! ldconfig -p | grep -q 'libgomp.so.1 '; then
  export LD_LIBRARY_PATH="$PWD/$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
OUT=${OUT:-/tmp/infer_check}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv >"$OUT/tests.log" 2>&1

for t in $TESTS; do
  echo "===== $t" >>"$OUT/tests.log"
  start=$SECONDS
  timeout 120 "$DIR/$t" --gtest_color=no >>"$OUT/tests.log" 2>&1
  rc=$?
  section=$(sed -n "/^===== $t\$/,\$p" "$OUT/tests.log")
  printf "%-22s %-12s passed %3d failed %3d %4ds\n" "$t" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)")" \
    "$(grep -c '^\[       OK \]' <<<"$section")" "$(grep -c '^\[  FAILED  \].*(' <<<"$section")" \
    $((SECONDS - start)) >>"$summary"
done
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$san" ]; then
  for tool in memcheck racecheck; do
    timeout 60 "$san" --tool $tool --error-exitcode 9 "$DIR/attention_decode_test" --gtest_brief=1 \
      >>"$OUT/tests.log" 2>&1
    printf "%-22s %-12s compute-sanitizer %s\n" attention_decode_test "$([ $? -eq 0 ] && echo PASS || echo FAIL)" \
      $tool >>"$summary"
  done
fi

if [ "${SKIP_HF:-0}" != 1 ]; then
  { timeout 120 python3 scripts/device/hf_parity.py "$DIR/hf_parity_tool" /tmp/hf_parity &&
    timeout 150 python3 scripts/device/hf_generate_parity.py "$DIR/hf_parity_tool" /tmp/hf_generate; } \
    >"$OUT/hf.log" 2>&1
  echo "hf parity rc=$?" >>"$summary"
fi

# Train a tiny model on the GPU, sample 4 per prompt from its checkpoint, train on the samples.
T=/tmp/infer_check_cli
rm -rf "$T" && mkdir -p "$T"
tt="$DIR/treetrain"
common="--config configs/quickstart.yaml --set device=cuda --set model.head_dim=64 --set schedule.warmup_steps=0"
{
  "$tt" generate --kind rollouts --out "$T/data.jsonl" &&
    timeout 60 "$tt" train $common --set data.path=$T/data.jsonl --set run_dir=$T/run --set train.max_steps=40 &&
    printf '{"id": "a", "tokens": [1, 2, 3, 4, 5]}\n{"id": "b", "tokens": [9, 8, 7]}\n' >"$T/prompts.jsonl" &&
    timeout 60 "$tt" sample --checkpoint "$T/run" --prompts "$T/prompts.jsonl" --num-samples 4 --max-new-tokens 24 \
      --temperature 1 --seed 3 --device cuda --out "$T/samples.jsonl" &&
    timeout 60 "$tt" train $common --set data.path=$T/samples.jsonl --set run_dir=$T/rl --set train.max_steps=5 \
      --set model.init_from=$T/run/checkpoints/step_40 --set train.loss_norm=path_mean &&
    timeout 60 "$tt" train $common --set data.path=$T/samples.jsonl --set run_dir=$T/rl_pp --set train.max_steps=5 \
      --set model.init_from=$T/run/checkpoints/step_40 --set data.packing=per_path --set train.loss_norm=path_mean
} >"$OUT/sample.log" 2>&1
echo "train + sample + train on samples rc=$?" >>"$summary"
python3 - "$T" >>"$summary" <<'PY' || true
import json, sys
t = sys.argv[1]
for run in ("rl", "rl_pp"):
    try:
        rows = [json.loads(l) for l in open(f"{t}/{run}/metrics.jsonl")]
        print(f"{run:6} step 1 loss {rows[0]['loss']:.6f} step 5 loss {rows[-1]['loss']:.6f} por {rows[0]['por']:.3f}")
    except Exception as e:
        print(f"{run}: no metrics ({e})")
PY

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  start=$SECONDS
  timeout 240 "$DIR/infer_bench" ${BENCH_ARGS:-} >"$OUT/infer.json" 2>"$OUT/infer.log"
  echo "infer_bench rc=$? $((SECONDS - start))s" >>"$summary"
fi

echo "----- failures"
grep -B2 -A12 'Failure$' "$OUT/tests.log" | head -60
grep -E '^========= (Invalid|Race|Error|.*SUMMARY)' "$OUT/tests.log" | head -10
grep -i "error" "$OUT/sample.log" | head -10
echo "----- measured"
grep -hE '^\[ (errors|greedy) |^[a-z_0-9]+ +N=' "$OUT/tests.log" | head -30
tail -12 "$OUT/hf.log" 2>/dev/null
cat "$OUT/infer.log" 2>/dev/null
echo "----- summary"
cat "$summary"
