#!/usr/bin/env bash
# A/B of the Qwen3-1.7B-shaped training step (bench/train_bench) between a baseline build and this
# tree's, interleaved in one device call (B A B A ...), so both see the same machine state.
#
#   BASE=DIR scripts/device/step_ab.sh stage   here (no GPU): copy DIR/bazel-bin/bench/train_bench
#                                               (a checkout of the baseline commit, built there) and
#                                               this tree's bench:train_bench (built now) to
#                                               .device/ab/{base,new}_train_bench (ignored; carried)
#   scripts/device/step_ab.sh [run]            there: ROUNDS (default 2) rounds of base then new,
#                                               each a full train_bench run without the profile;
#                                               JSON per run in $OUT; a table of medians and the
#                                               new/base ratio per workload and packing last.
# Environment: ROUNDS, BENCH_ARGS (extra train_bench flags for both).
set -uo pipefail
cd "$(dirname "$0")/../.."

DIR=.device/ab

if [ "${1:-run}" = "stage" ]; then
  [ -n "${BASE:-}" ] && [ -x "$BASE/bazel-bin/bench/train_bench" ] ||
    { echo "step_ab: set BASE to a built checkout of the baseline (bazel build //bench:train_bench there)" >&2; exit 1; }
  bazel build //bench:train_bench || exit 1
  rm -rf "$DIR" && mkdir -p "$DIR/lib"
  cp "$BASE/bazel-bin/bench/train_bench" "$DIR/base_train_bench"
  cp bazel-bin/bench/train_bench "$DIR/new_train_bench"
  (cd "$BASE" && git rev-parse --short HEAD) >"$DIR/base_commit" 2>/dev/null
  git rev-parse --short HEAD >"$DIR/new_commit"
  chmod u+w "$DIR"/*_train_bench && strip "$DIR"/*_train_bench
  cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$DIR/lib/"  # fallback only
  du -sh "$DIR"
  exit 0
fi

if ! ldconfig -p | grep -q 'libgomp.so.1 '; then
  export LD_LIBRARY_PATH="$PWD/$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
OUT=${OUT:-/tmp/step_ab}
mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in base new; do
    start=$SECONDS
    timeout 150 "$DIR/${v}_train_bench" --no-profile ${BENCH_ARGS:-} >"$OUT/${v}_$r.json" 2>"$OUT/${v}_$r.log"
    echo "$v round $r rc=$? $((SECONDS - start))s"
  done
done
python3 - "$OUT" "$(cat $DIR/base_commit 2>/dev/null)" "$(cat $DIR/new_commit)" <<'EOF'
import glob, json, statistics, sys
out, base_c, new_c = sys.argv[1:4]
runs = {"base": [], "new": []}
for v in runs:
    for f in sorted(glob.glob(f"{out}/{v}_*.json")):
        try:
            runs[v].append(json.load(open(f)))
        except Exception as e:
            print(f"{f}: unreadable ({e})")
if not runs["base"] or not runs["new"]:
    sys.exit("step_ab: missing runs")
print(f"{runs['new'][0]['device']}; base {base_c}, new {new_c}; {len(runs['new'])} rounds; step medians of all timed steps")
print(f"{'workload':8} {'packing':8} {'base s':>8} {'new s':>8} {'new/base':>9} {'base MFU':>9} {'new MFU':>8}")
for w in runs["new"][0]["workloads"]:
    for p in ("tree", "per_path"):
        med = {}
        mfu = {}
        for v in runs:
            steps = [s for j in runs[v] for s in j["workloads"][w][p]["step_s_all"]]
            med[v] = statistics.median(steps)
            mfu[v] = statistics.median([j["workloads"][w][p]["mfu"] for j in runs[v]])
        print(f"{w:8} {p:8} {med['base']:8.4f} {med['new']:8.4f} {med['new']/med['base']:9.4f} "
              f"{100*mfu['base']:8.2f}% {100*mfu['new']:7.2f}%")
    for v in runs:
        j = runs[v][-1]["workloads"][w]
        print(f"{w:8} {v:4} speedup/FLOP ratio {j['speedup_over_flop_ratio']:.3f}, speedup/executed ratio "
              f"{j['speedup_over_executed_flop_ratio']:.3f}, loss rel diff {j['loss_rel_diff']:.2e}")
EOF
