#!/usr/bin/env python3
"""Each kernel's mean GPU time a launch from an ncu CSV (`ncu --metrics gpu__time_duration.sum --csv
--print-units base ...`): one line a kernel, in order of first launch: mean us, launches, the
kernel's name with its template arguments (namespaces and parameters dropped).

    python3 scripts/device/ncu_kernel_means.py NCU_CSV
"""
import collections
import csv
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: ncu_kernel_means.py NCU_CSV")
    try:
        lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
    except OSError as e:
        sys.exit(f"ncu_kernel_means.py: {e}")
    tot, cnt = collections.Counter(), collections.Counter()
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = r["Kernel Name"].replace("void ", "").split("(")[0].split("::")[-1]
        tot[name] += float(r["Metric Value"].replace(",", "")) / 1e3  # ns -> us
        cnt[name] += 1
    if not tot:
        print(f"(no gpu__time_duration rows in {sys.argv[1]})")
    for name in tot:
        print(f"{tot[name] / cnt[name]:10.1f} us {cnt[name]:4d}  {name}")


if __name__ == "__main__":
    main()
