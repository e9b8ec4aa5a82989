#!/usr/bin/env bash
# Every GPU check of the repository in one device call, for a 2-GPU machine (nvidia-h200-x2):
# the CUDA decoder/backend tests + trainer runs + training-step benchmark (train_check.sh), the
# quickstart config under device: auto, the NCCL data-parallel checks (dp_check.sh), then the
# CUDA op tests and the tree attention tests. Stage here first:
#   scripts/device/all_checks.sh stage
# then run there with carry [".device"]: scripts/device/all_checks.sh
# Logs go to $OUT/<part>/; a short summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-run}" = "stage" ]; then
  scripts/device/ops_check.sh stage && scripts/device/attention_check.sh stage &&
    scripts/device/train_check.sh stage && scripts/device/dp_check.sh stage || exit 1
  du -sh .device
  exit 0
fi

export NCCL_NVLS_ENABLE=0
ROOT_OUT=${OUT:-/tmp/all_checks}
mkdir -p "$ROOT_OUT"/{ops,attention,train,dp,quickstart}
summary="$ROOT_OUT/summary.txt"
: >"$summary"
nvidia-smi -L | tee -a "$summary"

run_tests() {  # DIR LOG BINARY...: runs each gpu test binary, one summary line each
  local dir=$1 log=$2
  shift 2
  for t in "$@"; do
    start=$SECONDS
    timeout 120 "$dir/$t" --gtest_color=no >>"$log" 2>&1
    rc=$?
    printf "%-24s %s %4ds\n" "$t" "$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)")" $((SECONDS - start)) >>"$summary"
  done
}

for f in .device/*/lib; do export LD_LIBRARY_PATH="$PWD/$f${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done

OUT="$ROOT_OUT/train" SKIP_BENCH=${SKIP_BENCH:-0} timeout 240 scripts/device/train_check.sh >"$ROOT_OUT/train/stdout.txt" 2>&1
echo "train_check rc=$?" >>"$summary"

# The quickstart config as the README runs it: device auto must pick the GPU.
Q=/tmp/quickstart_gpu
rm -rf "$Q" && mkdir -p "$Q"
{
  .device/model_cuda/treetrain generate --kind rollouts --out "$Q/data.jsonl" --num-trees 256 --vocab-size 256 --seed 1 &&
    timeout 120 .device/model_cuda/treetrain train --config configs/quickstart.yaml --set run_dir=$Q/run \
      --set data.path=$Q/data.jsonl
} >"$ROOT_OUT/quickstart/log.txt" 2>&1
echo "quickstart rc=$? $(grep -o 'device: auto -> [a-z]*' "$ROOT_OUT/quickstart/log.txt" | head -1); $(grep -o 'done: .*' "$ROOT_OUT/quickstart/log.txt")" >>"$summary"

if [ -x scripts/device/dp_check.sh ]; then
  OUT="$ROOT_OUT/dp" timeout 240 scripts/device/dp_check.sh >"$ROOT_OUT/dp/stdout.txt" 2>&1
  echo "dp_check rc=$?" >>"$summary"
fi

run_tests .device/ops_cuda "$ROOT_OUT/ops/tests.log" memory_test gemm_test gemv_test embedding_test rmsnorm_test \
  rope_test swiglu_test cross_entropy_test adamw_test
run_tests .device/attention "$ROOT_OUT/attention/tests.log" attention_test

echo "===== train_check (tail)"
tail -40 "$ROOT_OUT/train/stdout.txt"
echo "===== dp_check (tail)"
tail -30 "$ROOT_OUT/dp/stdout.txt" 2>/dev/null
echo "===== summary"
cat "$summary"
# Only a few files come back from the device machine: pack the logs into one.
(cd "$ROOT_OUT" && tar czf logs.tar.gz ops attention train dp quickstart summary.txt && rm -rf ops attention train dp quickstart)
