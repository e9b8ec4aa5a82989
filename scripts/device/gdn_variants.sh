#!/usr/bin/env bash
# The delta rule's kernels, several builds side by side in one device call: ROUNDS rounds of
# `ops_bench gdn` over all variants in turn (each round every variant once, so all see the same
# machine state; first, so that a call cut short keeps the comparison), then each tested variant's
# GPU tests (gdn_test, hybrid_cuda_test) and memcheck, then each variant's per-kernel times by ncu
# (one sequence). The first variant is the baseline.
#
#   scripts/device/gdn_variants.sh stage REV...   here (no GPU, a clean tree): for each git revision
#                                                  (a commit or branch), check it out, build
#                                                  //bench:ops_bench and the two tests, copy them to
#                                                  .device/gdn_variants/ as vN_* (N: its place in the
#                                                  list); then back to the branch it started on
#   scripts/device/gdn_variants.sh stage-add REV... the same, keeping what is staged: the new
#                                                  variants numbered after the highest staged one
#   scripts/device/gdn_variants.sh [run]          there: the rounds, the tests, ncu; logs in $OUT
#                                                  (default /tmp/gdn_variants), the summary and a
#                                                  table of each ops_bench row's figures to stdout
# Device run:  run(command="scripts/device/gdn_variants.sh", carry=[".device/gdn_variants"])
# Environment: ROUNDS (2), SKIP_TESTS=1, SKIP_NCU=1, TRACE (variants to trace with nsys: the backward
# walks' overlap, gdn_walk_overlap.py), VARIANTS (e.g. "v2 v4"; default all staged),
# TEST_VARIANTS (the variants whose tests run; default VARIANTS), RACECHECK=1 (racecheck on each
# tested variant's delta-rule backward test and its bf16 long-sequence test, the bf16 kernels',
# too), OPS_MODE and NCU_MODE (exact or bf16: the rounds' `ops_bench gdn` and ncu take only that
# product mode; default both, exact's first). The unpacked
# binaries stay in /tmp/gdn_variants_bin for what a caller runs after.
set -uo pipefail
self=$(realpath "$0") || exit 1
cd "$(dirname "$self")/../.." || exit 1
if [ "${1:-run}" != "run" ] && [ -z "${GDN_VARIANTS_COPY:-}" ]; then  # checkouts below may rewrite this file
  copy=$(mktemp) && cp "$self" "$copy" || { echo "gdn_variants: cannot copy $self" >&2; exit 1; }
  GDN_VARIANTS_COPY=$PWD exec bash "$copy" "$@"
fi
[ -n "${GDN_VARIANTS_COPY:-}" ] && { cd "$GDN_VARIANTS_COPY" || exit 1; }
case "${1:-run}" in
  stage | stage-add | run) ;;
  *) echo "gdn_variants: expected 'stage REV...', 'stage-add REV...' or 'run', got '$1'" >&2; exit 1 ;;
esac

DIR=.device/gdn_variants
TESTS="tests/ops_cuda:gdn_test tests/model_cuda:hybrid_cuda_test"

. scripts/device/lib.sh

if [ "${1:-run}" != "run" ]; then
  mode=$1
  shift
  [ $# -ge 1 ] || { echo "gdn_variants: $mode needs one or more git revisions" >&2; exit 1; }
  n=0 labels=""  # stage-add: after the highest variant staged, its labels kept
  if [ "$mode" = stage-add ]; then
    n=$(ls "$DIR" 2>/dev/null | sed -n 's/^v\([0-9]*\)_ops_bench\.xz$/\1/p' | sort -n | tail -1)
    [ -n "$n" ] || { echo "gdn_variants: stage-add: nothing staged in $DIR (use stage)" >&2; exit 1; }
    labels=$(cat "$DIR/labels" 2>/dev/null)
  fi
  [ -z "$(git status --porcelain --untracked-files=no)" ] ||
    { echo "gdn_variants: the tree has uncommitted changes; commit or stash them first" >&2; exit 1; }
  start=$(git symbolic-ref --quiet --short HEAD || git rev-parse HEAD)
  # Every revision resolved before the first checkout (HEAD~1, @{-1} ... name the starting point).
  hashes=() names=()
  for rev in "$@"; do
    h=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "gdn_variants: no revision '$rev'" >&2; exit 1; }
    hashes+=("$h") names+=("$rev")
  done
  trap 'git checkout --quiet "$start"' EXIT  # back where it started, whatever happens
  tmp=$(mktemp -d)
  for i in "${!hashes[@]}"; do
    n=$((n + 1))
    git checkout --quiet "${hashes[$i]}" || exit 1
    targets="//bench:ops_bench"
    for t in $TESTS; do targets="$targets //$t"; done
    bazel build $targets || { echo "gdn_variants: ${names[$i]} does not build" >&2; exit 1; }
    cp bazel-bin/bench/ops_bench "$tmp/v${n}_ops_bench" || exit 1
    for t in $TESTS; do cp "bazel-bin/${t/://}" "$tmp/v${n}_${t#*:}" || exit 1; done
    labels="$labels v$n=$(git rev-parse --short HEAD)(${names[$i]})"
  done
  git checkout --quiet "$start"
  new="$DIR.new"
  stage_binaries "$new" "$tmp"/*
  rm -rf "$tmp"
  xz -6 -T2 "$new"/v*_*  # ~3 MB a variant instead of ~20: the carry holds 64 MiB with the tree
  if [ "$mode" = stage ]; then
    rm -rf "$DIR" && mv "$new" "$DIR"
  else
    mv "$new"/v*_*.xz "$DIR"/ && rm -rf "$new"
  fi
  du -sh "$DIR"
  echo "$labels" >"$DIR/labels"
  echo "staged:$labels"
  exit 0
fi

device_setup "$DIR" /tmp/gdn_variants
BIN=/tmp/gdn_variants_bin  # the binaries, unpacked (stage packs them with xz); none left from an earlier call
rm -rf "$BIN" && mkdir -p "$BIN"
for f in "$DIR"/v*_*.xz; do
  [ -e "$f" ] || continue
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$f" "$BIN/$(basename "$f" .xz)" && chmod +x "$BIN/$(basename "$f" .xz)"
done
cp "$DIR"/labels "$BIN"/ 2>/dev/null
DIR=$BIN
variants=$(ls "$DIR" | sed -n 's/^\(v[0-9]*\)_ops_bench$/\1/p' | sort -V)
[ -n "${VARIANTS:-}" ] && variants=$VARIANTS  # a subset, e.g. VARIANTS="v2 v4" (the first is the baseline)
[ -n "$variants" ] || { echo "gdn_variants: nothing staged in $DIR (run the stage step here first)" >&2; exit 1; }
echo "variants: $(cat "$DIR/labels" 2>/dev/null)"

for r in $(seq 1 "${ROUNDS:-2}"); do
  for v in $variants; do
    start=$SECONDS
    timeout 200 "$DIR/${v}_ops_bench" gdn ${OPS_MODE:-} >"$OUT/${v}_$r.txt" 2>&1
    echo "$v round $r rc=$? $((SECONDS - start))s" >>"$summary"
  done
done

# The rounds' table, as soon as the rounds are done and again at the end, to stdout and to
# $OUT/0_table.txt: a call cut short in its tests keeps it (only 8 files come back from $OUT, the
# first by name, and a killed pipe prints nothing).
ops_table() {
  local labels=()
  for v in $variants; do labels+=("$v=$(sed -n "s/.* $v=\([^ ]*\).*/\1/p" "$DIR/labels")"); done
  { echo "----- ops_bench gdn (each build's median over the rounds, and its ratio to v1's)"
    python3 scripts/device/ops_ab_table.py "$OUT" "${labels[@]}"; } | tee "$OUT/0_table.txt"
}
ops_table

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for v in ${TEST_VARIANTS:-$variants}; do
    for t in $TESTS; do run_gtest "${v}_${t#*:}" 300; done
    if [ -x "$san" ]; then
      checks=("memcheck:*DeltaRule*")  # tool:gtest filter
      [ "${RACECHECK:-0}" = 1 ] && checks+=("racecheck:*DeltaRuleBackward*:*Bf16Products*")
      for check in "${checks[@]}"; do
        echo "===== ${check%%:*} ${v}_gdn_test" >>"$OUT/tests.log"
        timeout 200 "$san" --tool "${check%%:*}" --error-exitcode 9 "$DIR/${v}_gdn_test" --gtest_brief=1 \
          --gtest_filter="${check#*:}" >>"$OUT/tests.log" 2>&1
        printf "%-28s %s rc=%s\n" "${v}_gdn_test" "${check%%:*}" "$?" >>"$summary"
      done
    fi
  done
fi

NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ "${SKIP_NCU:-0}" != 1 ] && [ -x "$NCU" ]; then
  # The one-sequence layout's launches: every forward call, then the backward's first calls (49
  # rule_* launches; a variant whose forward launches two kernels instead of three reaches a little
  # further into the backward). Each kernel's mean time a launch, in us.
  for v in $variants; do
    echo "----- ncu $v (one sequence: each rule_* kernel's mean us a launch, launches)"
    timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
      -k regex:"rule_" --launch-count 49 "$DIR/${v}_ops_bench" gdn ${NCU_MODE:-} 2>/dev/null >"$OUT/ncu_$v.csv"
    python3 scripts/device/ncu_kernel_means.py "$OUT/ncu_$v.csv"
  done
fi

# TRACE="v2 ...": an nsys kernel trace of each named variant's `ops_bench gdn`, and how much of its
# backward's walk again ran beside its reverse walk (gdn_walk_overlap.py).
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
for v in ${TRACE:-}; do
  echo "----- nsys $v (the backward's walks: time, overlap)"
  [ -n "$NSYS" ] || { echo "gdn_variants: no nsys on this machine"; break; }
  rm -f "$OUT/trace_$v".* "$OUT/trace_${v}_"*  # an earlier call's report, export or csv on a warm machine
  timeout 200 "$NSYS" profile -o "$OUT/trace_$v" --force-overwrite true -t cuda "$DIR/${v}_ops_bench" gdn \
    ${OPS_MODE:-} >"$OUT/trace_$v.log" 2>&1 &&
    timeout 200 "$NSYS" stats --force-export true --report cuda_gpu_trace --format csv -o "$OUT/trace_$v" \
      "$OUT/trace_$v.nsys-rep" >>"$OUT/trace_$v.log" 2>&1 &&
    python3 scripts/device/gdn_walk_overlap.py "$OUT/trace_${v}_cuda_gpu_trace.csv" ||
    { echo "gdn_variants: $v's trace failed ($OUT/trace_$v.log):"; tail -5 "$OUT/trace_$v.log"; }
done

print_test_report
ops_table
