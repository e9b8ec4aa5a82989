#!/usr/bin/env bash
# The delta rule's bf16 product mode (train.gdn_products) against a baseline build, in one device
# call: gdn_variants.sh's run with the newest build's gdn_test and hybrid_cuda_test under memcheck
# and racecheck, three interleaved rounds of `ops_bench gdn` (both modes) for each build and ncu of
# each build's bf16 launches; then `train_bench --model hybrid_2b` with exact and with bf16
# products (24 layers where the GPU has over 100 GB, else 12: the 24-layer agent step needs more
# than 80 GB).
#
#   scripts/device/gdn_bf16_check.sh stage BASE NEW   here (a clean tree): gdn_variants.sh's stage
#                                                     of the two revisions (v1 BASE, v2 NEW), and
#                                                     the current tree's //bench:train_bench in
#                                                     .device/tb (build it at NEW)
#   scripts/device/gdn_bf16_check.sh                  there; logs in $OUT (default /tmp/gdn_bf16)
# Device run:  run(command="scripts/device/gdn_bf16_check.sh", carry=[".device"])
set -uo pipefail
cd "$(dirname "$(realpath "$0")")/../.." || exit 1
if [ "${1:-run}" = "stage" ]; then
  [ $# -eq 3 ] || { echo "gdn_bf16_check: expected 'stage BASE NEW', got $*" >&2; exit 1; }
  scripts/device/gdn_variants.sh stage "$2" "$3" || exit 1
  bazel build //bench:train_bench || exit 1
  mkdir -p .device/tb && cp -f bazel-bin/bench/train_bench .device/tb/ && chmod u+w .device/tb/train_bench &&
    strip .device/tb/train_bench || exit 1
  exit 0
fi
O=${OUT:-/tmp/gdn_bf16}
mkdir -p "$O"
OUT=$O/variants TEST_VARIANTS=v2 RACECHECK=1 NCU_MODE=bf16 ROUNDS=${ROUNDS:-3} scripts/device/gdn_variants.sh

MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
LAYERS=""; [ "${MEM:-0}" -lt 100000 ] && LAYERS="--layers 12"  # the 24-layer hybrid's agent step needs > 80 GB
echo "----- train_bench --model hybrid_2b, layers: ${LAYERS:-24 (default)}"
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for m in exact bf16; do
  start=$SECONDS
  timeout 200 .device/tb/train_bench --model hybrid_2b $LAYERS --no-profile --steps 3 --warmup 1 --pp-steps 2 \
    --pp-warmup 1 --gdn-products $m >"$O/tb_$m.json" 2>"$O/tb_$m.err"
  echo "train_bench $m rc=$? $((SECONDS - start))s"
  tail -2 "$O/tb_$m.err"
  python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for w, x in d.get('workloads', {}).items():
    t, p = x['tree'], x['per_path']
    print(f\"{w}: tree {t['step_s']:.3f} s MFU {100 * t['mfu']:.1f}% | per_path {p['step_s']:.3f} s | speedup \"
          f\"{x['speedup']:.2f}, executed-FLOP ratio {x['executed_flop_ratio']:.2f}: \"
          f\"{x['speedup_over_executed_flop_ratio']:.3f}; loss rel diff {x['loss_rel_diff']:.1e}\")
" "$O/tb_$m.json"
done
