#!/usr/bin/env python3
"""The table of scripts/device/ops_ab.sh: each ops_bench row's median over the rounds, base and new.

  ops_ab_table.py OUT BASE_COMMIT NEW_COMMIT
reads OUT/base_*.txt and OUT/new_*.txt (ops_bench's output: one line per row as it is measured,
"NAME SHAPE MS ms ..."), prints one line per row: base ms, new ms, new/base, and the spread of
each side (min-max) so that a ratio inside the noise reads as such.
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
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out, base_c, new_c = sys.argv[1:4]
    runs = {v: [rows(f) for f in sorted(glob.glob(f"{out}/{v}_*.txt"))] for v in ("base", "new")}
    if not runs["base"] or not runs["new"]:
        sys.exit(f"ops_ab: no benchmark output in {out} (base {len(runs['base'])}, new {len(runs['new'])} runs)")
    names = [n for n in runs["new"][0] if all(n in r for v in runs for r in runs[v])]
    if not names:
        sys.exit("ops_ab: no row measured by both builds")
    print(f"base {base_c}, new {new_c}; {len(runs['base'])} / {len(runs['new'])} rounds; medians (min-max)")
    width = max(len(n) for n in names)
    print(f"{'row':{width}} {'base ms':>22} {'new ms':>22} {'new/base':>9}")
    for n in names:
        b = [r[n] for r in runs["base"]]
        w = [r[n] for r in runs["new"]]
        mb, mw = statistics.median(b), statistics.median(w)
        print(f"{n:{width}} {mb:8.3f} ({min(b):.3f}-{max(b):.3f}) {mw:8.3f} ({min(w):.3f}-{max(w):.3f}) "
              f"{mw / mb:9.4f}")


if __name__ == "__main__":
    main()
