#!/usr/bin/env bash
# Segments on the GPU machine (issue 18): the attention tests with per-prefix head sets (tree and
# decode kernels), the segment inference, training and retrieval tests, the tests the repeated
# backward and the fp32 RoPE touch (rope, decoder, backend, generation), then bench/segments_bench
# (segmented vs full-context prefill, time and peak memory) on the Qwen3-1.7B and LLaMA2-7B shapes,
# and its training mode (segmented vs full-context training steps, the longest trainable sequence)
# on the Qwen3-1.7B shape.
#
#   scripts/device/segments_check.sh stage   here (no GPU): bazel build, copy the stripped binaries
#                                            to .device/segments/ (ignored by git; carried)
#   scripts/device/segments_check.sh [run]   there: tests into $OUT/tests.log, the bench's JSON
#                                            into $OUT/segments_<shape>.json (log: .log), summary.txt
# Device run:  run(command="scripts/device/segments_check.sh", carry=[".device"])
# Environment: SKIP_TESTS=1, SKIP_BENCH=1, SKIP_TRAIN=1, SHAPES (default "qwen3_1_7b llama2_7b"),
# BENCH_ARGS, TRAIN_ARGS (extra flags of segments_bench --train), TESTS (default below).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/segments
TESTS=${TESTS:-"segments_cuda_test rope_test model_cuda_test backend_cuda_test generate_cuda_test attention_test attention_decode_test"}

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  bazel build //tests/ops_cuda_attention:attention_test //tests/ops_cuda_attention:attention_decode_test \
    //tests/model_cuda:segments_cuda_test //tests/ops_cuda:rope_test //tests/model_cuda:model_cuda_test \
    //tests/model_cuda:backend_cuda_test //tests/model_cuda:generate_cuda_test //bench:segments_bench || exit 1
  stage_binaries "$DIR" bazel-bin/tests/ops_cuda_attention/attention_test \
    bazel-bin/tests/ops_cuda_attention/attention_decode_test bazel-bin/tests/model_cuda/segments_cuda_test \
    bazel-bin/tests/ops_cuda/rope_test bazel-bin/tests/model_cuda/model_cuda_test \
    bazel-bin/tests/model_cuda/backend_cuda_test bazel-bin/tests/model_cuda/generate_cuda_test \
    bazel-bin/bench/segments_bench
  exit 0
fi

device_setup "$DIR" /tmp/segments_check

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in $TESTS; do run_gtest "$t" 120 60; done
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  for s in ${SHAPES:-qwen3_1_7b llama2_7b}; do
    timeout 300 "$DIR/segments_bench" --shape "$s" ${BENCH_ARGS:-} >"$OUT/segments_$s.json" 2>"$OUT/segments_$s.log"
    echo "segments_bench $s rc=$?" >>"$summary"
    cat "$OUT/segments_$s.log" >>"$summary"
  done
fi
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  timeout 420 "$DIR/segments_bench" --train --shape qwen3_1_7b ${TRAIN_ARGS:-} >"$OUT/segments_train_qwen3_1_7b.json" \
    2>"$OUT/segments_train_qwen3_1_7b.log"
  echo "segments_bench --train qwen3_1_7b rc=$?" >>"$summary"
  cat "$OUT/segments_train_qwen3_1_7b.log" >>"$summary"
fi
cat "$summary"
