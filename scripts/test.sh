#!/usr/bin/env bash
# The test command of the README (and of CI): installs what is missing, builds everything
# (CUDA code included) and runs the test suite. Tests tagged "gpu" run only where a GPU is
# visible; elsewhere they are listed as skipped. Then scripts/sanitize.sh (ASan + UBSan tests and
# fuzzing).
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh || exit 1

filters="-gpu"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  filters=""
  echo "test: GPU found, GPU tests run too"
fi

log=$(mktemp)
bazel test //... --test_tag_filters="$filters" --test_summary=short "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' "$log")
skipped=0
if [ -n "$filters" ]; then
  gpu_tests=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
  if [ -n "$gpu_tests" ]; then
    echo "test: no GPU here; these GPU tests were built but skipped:"
    echo "$gpu_tests" | sed 's/^/  SKIPPED (gpu) /'
    skipped=$(echo "$gpu_tests" | wc -l)
  fi
fi
rm -f "$log"
# Sanitizers and fuzzing (scripts/sanitize.sh: an output base of its own, about 10 minutes on 2
# cores); SKIP_SANITIZE=1 leaves them out. A failure there counts as one failed test here.
if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
  if ! scripts/sanitize.sh; then
    failed=$((failed + 1))
    status=1
  fi
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  failed=1  # the build itself failed
fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit "$status"
