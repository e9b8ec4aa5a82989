"""The delta rule's backward walks in an nsys kernel trace of `ops_bench gdn`: per backward pass
(from a rule_prep_kernel launch to the next one that a reverse walk follows), the walk again's and
the reverse walk's kernel time, how much of it ran at the same time (the walk again beside the
reverse walk on a second stream), the span of both and the whole backward, in us; medians over the
passes of each layout (told apart by the walk again's launches and grids).

  nsys profile -o T -t cuda ops_bench gdn bf16
  nsys stats --report cuda_gpu_trace --format csv -o T T.nsys-rep
  python3 scripts/device/gdn_walk_overlap.py T_cuda_gpu_trace.csv
"""
import collections
import csv
import sys


def kind(name):
    if "rule_bwd_walk_wgmma_kernel" in name:
        return "reverse walk"
    if "rule_walk_wgmma_kernel" in name:  # <kOut, kCols>: the walk again writes no o
        return "walk out" if "<true" in name else "walk again"
    if "rule_prep_kernel" in name:
        return "prep"
    return "other"


def main(path):
    launches = []
    rows = csv.DictReader(open(path))
    need = {"Name", "Start (ns)", "Duration (ns)", "GrdX", "GrdY", "GrdZ"}
    if not need <= set(rows.fieldnames or []):
        sys.exit(f"{path}: expected nsys cuda_gpu_trace columns {sorted(need)}, got {rows.fieldnames}")
    for r in rows:
        name = r["Name"]
        if "rule_" not in name:
            continue
        start, dur = int(r["Start (ns)"]), int(r["Duration (ns)"])
        launches.append((start, start + dur, kind(name), (r["GrdX"], r["GrdY"], r["GrdZ"])))
    launches.sort()
    passes = []
    for k in launches:
        if k[2] == "prep":
            passes.append([])
        if passes:
            passes[-1].append(k)
    layouts = collections.defaultdict(list)
    for p in passes:
        again = [k for k in p if k[2] == "walk again"]
        rev = [k for k in p if k[2] == "reverse walk"]
        if not again or not rev:
            continue  # a forward pass
        both = sum(max(0, min(a[1], b[1]) - max(a[0], b[0])) for a in again for b in rev)
        walks = again + rev
        key = (len(again), tuple(sorted({k[3] for k in again})))
        layouts[key].append((sum(k[1] - k[0] for k in again), sum(k[1] - k[0] for k in rev), both,
                             max(k[1] for k in walks) - min(k[0] for k in walks),
                             max(k[1] for k in p) - p[0][0]))  # the last to end: two streams
    if not layouts:
        sys.exit(f"{path}: no backward pass with the bf16 walks (rule_walk_wgmma_kernel and rule_bwd_walk_wgmma_kernel)")
    for (n, grids), v in layouts.items():
        med = lambda i: sorted(x[i] for x in v)[len(v) // 2] / 1e3
        print(f"walk again {n} launch(es), grids {' '.join('x'.join(g) for g in grids[:3])}: {len(v)} passes; "
              f"median us: walk again {med(0):.0f}, reverse walk {med(1):.0f}, at the same time {med(2):.0f}, "
              f"both walks' span {med(3):.0f}, backward {med(4):.0f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gdn_walk_overlap.py TRACE_cuda_gpu_trace.csv")
    main(sys.argv[1])
