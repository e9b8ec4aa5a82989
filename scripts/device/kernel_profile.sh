#!/usr/bin/env bash
# Per-kernel GPU time of one command on the device machine: ncu's gpu__time_duration of every
# launch (clocks not locked), summed by kernel name, largest first, with launch counts and the
# share of the total. For finding the slow kernels of a step, e.g.
#   scripts/device/kernel_profile.sh $OUT/prof .device/hybrid/train_bench --model hybrid_2b \
#     --layers 4 --workloads agent --steps 1 --warmup 0 --pp-steps 0 --pp-warmup 0 --no-profile
# Writes DIR/ncu.csv and DIR/kernels.txt (the table, also printed). TOP (default 40) rows.
set -uo pipefail
DIR=$1
shift
mkdir -p "$DIR"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
"$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base "$@" >"$DIR/ncu.csv" \
  2>"$DIR/ncu.log"
echo "ncu rc=$?"
python3 - "$DIR/ncu.csv" "${TOP:-40}" <<'PY' | tee "$DIR/kernels.txt"
import csv, sys, collections
rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
tot, cnt = collections.Counter(), collections.Counter()
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"].split("(")[0].replace("void ", "")[:90]
    tot[name] += float(r["Metric Value"].replace(",", "")) / 1e3  # ns -> us
    cnt[name] += 1
all_us = sum(tot.values())
print(f"{'us':>10} {'share':>6} {'launches':>8}  kernel   (total {all_us / 1e3:.2f} ms, {sum(cnt.values())} launches)")
for name, us in tot.most_common(int(sys.argv[2])):
    print(f"{us:10.1f} {us / all_us:6.1%} {cnt[name]:8d}  {name}")
PY
