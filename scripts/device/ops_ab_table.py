#!/usr/bin/env python3
"""The table of scripts/device/ops_ab.sh and gdn_variants.sh: each ops_bench row's median over the
rounds for every build, and its ratio to the first build's.

  ops_ab_table.py OUT NAME=LABEL [NAME=LABEL ...]
reads OUT/NAME_*.txt for each build NAME (ops_bench's output: one line per row as it is measured,
"NAME SHAPE MS ms ..."; one file per round), prints one line per row: each build's median ms with
its spread (min-max), so that a ratio inside the noise reads as such, and its ratio to the first.
LABEL (a commit, a branch) names the build in the header.
"""
import glob
import re
import statistics
import sys

ROW = re.compile(r"^(?P<name>.*\S)\s+(?P<ms>[0-9]+\.[0-9]+) ms\b")


def rows(path):
    out = {}
    for line in open(path, errors="replace"):
        m = ROW.match(line.rstrip())
        if m:  # the first report of a row (the closing table repeats it without "ms")
            out.setdefault(" ".join(m.group("name").split()), float(m.group("ms")))
    return out


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        sys.exit(__doc__)
    out = sys.argv[1]
    builds = [a.split("=", 1) for a in sys.argv[2:]]
    runs = {v: [rows(f) for f in sorted(glob.glob(f"{out}/{v}_*.txt"))] for v, _ in builds}
    missing = [v for v, _ in builds if not runs[v]]
    if missing:
        sys.exit(f"ops_ab: no benchmark output in {out} for {', '.join(missing)}")
    first = builds[0][0]
    names = [n for n in runs[first][0] if all(n in r for v in runs for r in runs[v])]
    if not names:
        sys.exit("ops_ab: no row measured by every build")
    print("; ".join(f"{v} {label} ({len(runs[v])} rounds)" for v, label in builds) + "; medians (min-max)")
    width = max(len(n) for n in names)
    print(f"{'row':{width}} " + " ".join(f"{v + ' ms':>22} {v + '/' + first:>9}" for v, _ in builds))
    for n in names:
        base = statistics.median(r[n] for r in runs[first])
        cells = []
        for v, _ in builds:
            x = [r[n] for r in runs[v]]
            m = statistics.median(x)
            cells.append(f"{m:8.3f} ({min(x):.3f}-{max(x):.3f}) {m / base:9.4f}")
        print(f"{n:{width}} " + " ".join(cells))


if __name__ == "__main__":
    main()
