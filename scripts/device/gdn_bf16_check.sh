#!/usr/bin/env bash
# The delta rule's bf16 product mode (train.gdn_products) against a baseline build, in one device
# call: the newest build's gdn_test and hybrid_cuda_test, memcheck on its delta-rule tests and
# racecheck on its backward test, three interleaved rounds of `ops_bench gdn` (both modes) of each
# build, ncu per kernel of the newest build's bf16 launches (`ops_bench gdn bf16`), then
# `train_bench --model hybrid_2b` with exact and with bf16 products (24 layers where the GPU has
# over 100 GB, else 12: the 24-layer agent step needs more than 80 GB).
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
lim() { local l=$((585 - SECONDS)); [ $l -lt 1 ] && l=1; [ $l -gt $1 ] && l=$1; echo $l; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version,memory.total --format=csv,noheader
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
cat .device/gdn_variants/labels
B=/tmp/gb; mkdir -p $B
for f in .device/gdn_variants/v*_*.xz; do
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' $f $B/$(basename $f .xz); chmod +x $B/$(basename $f .xz); done
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$PWD/.device/gdn_variants/lib
for t in gdn_test hybrid_cuda_test; do T0=$SECONDS
  (timeout $(lim 150) $B/v2_$t --gtest_color=no) > $O/v2_$t.txt 2>&1; echo "v2 $t rc=$? $((SECONDS-T0))s"; grep -E "^\[  (PASSED|FAILED) |Failure" $O/v2_$t.txt | head; grep -E "bf16|4,096" $O/v2_$t.txt | head -8
done
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
T0=$SECONDS; timeout $(lim 150) $SAN --tool memcheck --error-exitcode 9 $B/v2_gdn_test --gtest_brief=1 --gtest_filter='*DeltaRule*' > $O/v2_memcheck.txt 2>&1; echo "v2 memcheck rc=$? $((SECONDS-T0))s"; grep -E "ERROR SUMMARY|PASSED|FAILED" $O/v2_memcheck.txt | head -3
T0=$SECONDS; timeout $(lim 150) $SAN --tool racecheck --error-exitcode 9 $B/v2_gdn_test --gtest_brief=1 --gtest_filter='*DeltaRuleBackward*' > $O/v2_racecheck.txt 2>&1; echo "v2 racecheck rc=$? $((SECONDS-T0))s"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" $O/v2_racecheck.txt | head -3
for r in 1 2 3; do for v in v1 v2; do T0=$SECONDS; timeout $(lim 120) $B/${v}_ops_bench gdn > $O/${v}_ops_$r.txt 2>&1; echo "$v round $r rc=$? $((SECONDS-T0))s"; done; done
python3 - $O <<'PY'
import sys, glob, re, statistics, collections
d = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + "/v*_ops_*.txt"):
    v = f.split("/")[-1].split("_")[0]
    for line in open(f):
        m = re.match(r"^(gdn_\w+ \(.*?\))\s+\S+\s+([\d.]+) ms", line)
        if m: d[(m.group(1), v)].append(float(m.group(2)))
names = sorted({k[0] for k in d}); vs = sorted({k[1] for k in d})
print(f"{'row':58s}" + "".join(f"{v+' ms':>22s}" for v in vs))
for n in names:
    row = f"{n:58s}"
    for v in vs:
        a = d.get((n, v), [])
        row += f"{(f'{statistics.median(a):.3f} ({min(a):.3f}-{max(a):.3f})' if a else '-'):>22s}"
    print(row)
PY
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
echo "----- ncu v2 one sequence, bf16: mean us a launch"
timeout $(lim 100) $NCU --clock-control none --metrics gpu__time_duration.sum --csv --print-units base -k regex:"rule_" --launch-count 49 $B/v2_ops_bench gdn bf16 2>/dev/null > $O/ncu_v2_bf16.csv
python3 scripts/device/ncu_kernel_means.py $O/ncu_v2_bf16.csv
LAYERS=""; [ "$MEM" -lt 100000 ] && LAYERS="--layers 12"  # the 24-layer hybrid's agent step needs > 80 GB
echo "train_bench layers: ${LAYERS:-24 (default)}"
for m in exact bf16; do T0=$SECONDS
  timeout $(lim 170) .device/tb/train_bench --model hybrid_2b $LAYERS --no-profile --steps 3 --warmup 1 --pp-steps 2 --pp-warmup 1 --gdn-products $m > $O/tb_$m.json 2> $O/tb_$m.err; echo "train_bench hybrid $m rc=$? $((SECONDS-T0))s"; tail -2 $O/tb_$m.err
  python3 -c "
import json; d=json.load(open('$O/tb_$m.json'))
for w, x in d.get('workloads', {}).items():
  t, p = x.get('tree', {}), x.get('per_path', {})
  print(w, 'tree', {k: v for k, v in t.items() if not isinstance(v, (dict, list))})
  print(w, 'per_path', {k: v for k, v in p.items() if not isinstance(v, (dict, list))})
  print(w, {k: v for k, v in x.items() if not isinstance(v, (dict, list))})
" 2>&1 | head -12
done
