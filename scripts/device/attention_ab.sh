#!/usr/bin/env bash
# A/B of the tree attention (bench/attention_bench) between a baseline binary and this tree's,
# interleaved in one device call (base new base new ...) on the workloads of issue 20, so both see
# the same machine state; medians over the rounds and new/base ratios last.
#
#   BASE_BIN=FILE scripts/device/attention_ab.sh stage   here: copy FILE (a baseline attention_bench,
#                                                        built from another commit) and this tree's
#                                                        //bench:attention_bench to .device/attention_ab/
#   scripts/device/attention_ab.sh [run]                 there: logs in $OUT (default /tmp/attention_ab)
# Device run:  run(command="scripts/device/attention_ab.sh", carry=[".device"])
# Environment: ROUNDS (default 3), WORKLOADS (default "rollout comb_short agent_short trunk").
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=.device/attention_ab
. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  [ -n "${BASE_BIN:-}" ] && [ -x "$BASE_BIN" ] ||
    { echo "attention_ab: set BASE_BIN to a baseline attention_bench binary" >&2; exit 1; }
  bazel build //bench:attention_bench || exit 1
  tmp=$(mktemp -d)
  cp "$BASE_BIN" "$tmp/base_attention_bench"
  cp bazel-bin/bench/attention_bench "$tmp/new_attention_bench"
  stage_binaries "$DIR" "$tmp"/*_attention_bench
  rm -rf "$tmp"
  git rev-parse --short HEAD >"$DIR/new_commit"
  exit 0
fi

device_setup "$DIR" /tmp/attention_ab
: >"$OUT/bench.jsonl"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for w in ${WORKLOADS:-rollout comb_short agent_short trunk}; do
    for v in base new; do
      line=$(timeout 120 "$DIR/${v}_attention_bench" --workload "$w" --heads 16 --kv-heads 8 --iters 10 --warmup 3)
      echo "{\"variant\": \"$v\", \"round\": $r, \"result\": ${line:-null}}" >>"$OUT/bench.jsonl"
    done
  done
done
python3 - "$OUT/bench.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    if r["result"] is None:
        continue
    by.setdefault((r["result"]["workload"], r["variant"]), []).append(r["result"])
print(f"{'workload':<14}{'base fwd':>10}{'new fwd':>10}{'base bwd':>10}{'new bwd':>10}{'total new/base':>16}")
for w in sorted({k[0] for k in by}):
    b, n = by.get((w, "base"), []), by.get((w, "new"), [])
    if not b or not n:
        print(f"{w:<14} missing runs")
        continue
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    print(f"{w:<14}{med(b, 'fwd_ms'):>10.3f}{med(n, 'fwd_ms'):>10.3f}{med(b, 'bwd_ms'):>10.3f}{med(n, 'bwd_ms'):>10.3f}"
          f"{med(n, 'total_ms') / med(b, 'total_ms'):>16.4f}")
PY
