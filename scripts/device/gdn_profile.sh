#!/usr/bin/env bash
# Two builds of the delta rule's kernels in bf16 mode, and where the newer one's time goes, in one
# device call: v2's gdn_test and hybrid_cuda_test, three interleaved rounds of `ops_bench gdn bf16`
# for v1 and v2, ncu per kernel of v2's bf16 launches, then `ncu --set full` of one launch of each
# bf16 kernel of v1 (walk, reverse walk, input gradients, state products, prep; one sequence),
# with the headline figures printed: throughputs, occupancy, issue rate, top stall.
#
#   scripts/device/gdn_variants.sh stage BASE NEW     here (v1 BASE, v2 NEW)
#   run(command="scripts/device/gdn_profile.sh", carry=[".device/gdn_variants"])   there; $OUT
set -uo pipefail
cd "$(dirname "$(realpath "$0")")/../.." || exit 1
O=${OUT:-/tmp/gdn_profile}
mkdir -p "$O"
lim() { local l=$((585 - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=/tmp/gb; mkdir -p $B
cat .device/gdn_variants/labels
for f in .device/gdn_variants/v*_*.xz; do
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' $f $B/$(basename $f .xz); chmod +x $B/$(basename $f .xz); done
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/.device/gdn_variants/lib
for t in gdn_test hybrid_cuda_test; do (timeout 120 $B/v2_$t --gtest_color=no) > $O/v2_$t.txt 2>&1; echo "v2 $t rc=$?"; grep -E "^\[  (PASSED|FAILED) |Failure" $O/v2_$t.txt | head -4; grep -E "bf16 products\)|bf16 products:" $O/v2_$t.txt | head -3; done
for r in 1 2 3; do for v in v1 v2; do timeout 120 $B/${v}_ops_bench gdn bf16 > $O/${v}_ops_$r.txt 2>&1; done; done
grep -h "^gdn_" $O/v1_ops_*.txt | sed 's/^/v1 /' | sort | head -12; grep -h "^gdn_" $O/v2_ops_*.txt | sed 's/^/v2 /' | sort | head -12
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 100 $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base -k regex:"rule_" --launch-count 49 $B/v2_ops_bench gdn bf16 2>/dev/null > $O/ncu_v2.csv
python3 scripts/device/ncu_kernel_means.py $O/ncu_v2.csv
cp $B/v1_ops_bench $B/ops_bench
for k in rule_walk_mma_kernel rule_bwd_walk_mma_kernel rule_bwd_grad_kernel rule_bwd_state_kernel rule_prep_kernel; do
  T0=$SECONDS
  timeout $(lim 150) $NCU --set full -k regex:"^$k" --launch-count 1 $B/ops_bench gdn bf16 > $O/full_$k.txt 2>&1
  echo "===== $k rc=$? $((SECONDS-T0))s"
  grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Shared Mem|Dynamic Shared Memory Per Block|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Executed Ipc Active|Grid Size)\b" $O/full_$k.txt | head -24
  grep -iE "stall|bottleneck|bound" $O/full_$k.txt | grep -v "^==" | cut -c1-220 | head -8
done
