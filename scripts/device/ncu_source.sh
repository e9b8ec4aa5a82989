#!/usr/bin/env bash
# Where one kernel's warps stall, instruction by instruction: `ncu --set full` of one launch (the
# first after SKIP, default 0) of the kernels whose function name (without template arguments)
# matches REGEX in a command; then the report's details (speed of light, memory, warp states) and
# its SASS with each instruction's stall samples, summarised: the samples by stall reason, and the
# TOP (default 40) instructions by samples. For a kernel bound by latency: where its warps wait.
#   scripts/device/ncu_source.sh DIR REGEX [SKIP] -- command...
# e.g. (binaries staged by gdn_variants.sh, unpacked to /tmp/gdn_variants_bin by its run; in
# `ops_bench gdn bf16` the eighth walk launch is the backward's)
#   scripts/device/ncu_source.sh $OUT/walk rule_walk_wgmma_kernel 7 -- /tmp/gdn_variants_bin/v2_ops_bench gdn bf16
# Writes DIR/prof.ncu-rep, DIR/details.txt, DIR/sass.csv and DIR/summary.txt (also printed).
set -uo pipefail
DIR=$1 REGEX=$2
shift 2
SKIP=0
[ "${1:-}" != "--" ] && { SKIP=$1; shift; }
[ "${1:-}" = "--" ] && shift
mkdir -p "$DIR"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 300 "$NCU" --set full --import-source no -k "regex:$REGEX" --launch-skip "$SKIP" --launch-count 1 -f \
  -o "$DIR/prof" "$@" >"$DIR/ncu.log" 2>&1
echo "ncu rc=$? ($(grep -c '==PROF== Profiling' "$DIR/ncu.log") launches profiled)"
"$NCU" -i "$DIR/prof.ncu-rep" --page details >"$DIR/details.txt" 2>&1
"$NCU" -i "$DIR/prof.ncu-rep" --page source --csv --print-source sass >"$DIR/sass.csv" 2>&1
python3 - "$DIR" "${TOP:-40}" <<'PY' | tee "$DIR/summary.txt"
import csv, re, sys, collections
d, top = sys.argv[1], int(sys.argv[2])
det = open(f"{d}/details.txt", errors="replace").read().splitlines()
keep = re.compile(r"^\s+(Duration|Registers Per Thread|Achieved Occupancy|Issued Warp Per Scheduler|No Eligible|"
                  r"Warp Cycles Per Issued Instruction|L2 Cache Throughput|DRAM Throughput|L1/TEX Cache Throughput|"
                  r"Compute \(SM\) Throughput|Executed Ipc Active|Active Warps Per Scheduler|Eligible Warps)\b")
for l in det:
    if keep.match(l):
        print(l.rstrip())
lines = [l for l in open(f"{d}/sass.csv", errors="replace") if l.startswith('"')]
lines = lines[next((i for i, l in enumerate(lines) if l.startswith('"Address"')), 0):]  # past the kernel's name
rows = list(csv.DictReader(lines))
if not rows:
    print("no SASS rows (see sass.csv)"); sys.exit(0)
cols = list(rows[0].keys())
allc = next((c for c in cols if "Warp Stall Sampling (All" in c), None)
src = next((c for c in cols if c.strip() == "Source"), cols[1])
reasons = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
def num(x):
    try: return float(str(x).replace(",", ""))
    except ValueError: return 0.0
tot = sum(num(r[allc]) for r in rows) if allc else 0
print(f"{len(rows)} SASS instructions, {tot:.0f} stall samples (column '{allc}')")
by = collections.Counter()
for r in rows:
    for c in reasons: by[c] += num(r[c])
for c, v in by.most_common(12):
    if v: print(f"  {v / max(tot, 1):6.1%}  {c}")
idx = sorted(range(len(rows)), key=lambda i: -num(rows[i][allc]))[:top]
for i in sorted(idx):
    r = rows[i]
    why = sorted(((num(r[c]), c) for c in reasons), reverse=True)[:2]
    top2 = " ".join(f"{c}={v:.0f}" for v, c in why if v)
    print(f"{i:5d} {num(r[allc]) / max(tot, 1):6.2%}  {r[src][:70]:70s} {top2}")
PY
