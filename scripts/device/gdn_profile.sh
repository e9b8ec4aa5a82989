#!/usr/bin/env bash
# Two builds of the delta rule's kernels in bf16 mode, and where the baseline's time goes, in one
# device call: gdn_variants.sh's run with v2's gdn_test and hybrid_cuda_test, three interleaved
# rounds of `ops_bench gdn bf16` and ncu of each build's bf16 launches; then `ncu --set full` of one
# launch of each bf16 kernel of v1 (walk, reverse walk, input gradients, state products, prep; one
# sequence), with the headline figures printed: throughputs, occupancy, issue rate, top stall.
#
#   scripts/device/gdn_variants.sh stage BASE NEW     here (v1 BASE, v2 NEW)
#   run(command="scripts/device/gdn_profile.sh", carry=[".device/gdn_variants"])   there; $OUT
set -uo pipefail
cd "$(dirname "$(realpath "$0")")/../.." || exit 1
O=${OUT:-/tmp/gdn_profile}
mkdir -p "$O"
OUT=$O/variants TEST_VARIANTS=v2 OPS_MODE=bf16 NCU_MODE=bf16 ROUNDS=${ROUNDS:-3} scripts/device/gdn_variants.sh

BIN=/tmp/gdn_variants_bin  # gdn_variants.sh's unpacked binaries
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/.device/gdn_variants/lib
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for k in rule_walk_mma_kernel rule_bwd_walk_mma_kernel rule_bwd_grad_kernel rule_bwd_state_kernel rule_prep_kernel; do
  start=$SECONDS
  timeout 150 "$NCU" --set full -k regex:"^$k" --launch-count 1 "$BIN/v1_ops_bench" gdn bf16 >"$O/full_$k.txt" 2>&1
  echo "===== $k rc=$? $((SECONDS - start))s"
  grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Shared Mem|Dynamic Shared Memory Per Block|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Executed Ipc Active|Grid Size)\b" \
    "$O/full_$k.txt" | head -24
  grep -iE "stall|bottleneck|bound" "$O/full_$k.txt" | grep -v "^==" | cut -c1-220 | head -8
done
