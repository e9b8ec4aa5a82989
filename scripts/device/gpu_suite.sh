#!/usr/bin/env bash
# Every test tagged "gpu" (the ones CPU-only runs skip), in one device call on one GPU.
#
#   scripts/device/gpu_suite.sh stage   here: bazel build them, strip them and pack them into
#                                       .device/gpu_suite.tar.xz (xz finds the kernels the binaries
#                                       share: 94 MB of binaries carry as ~5 MB)
#   scripts/device/gpu_suite.sh [run]   there: unpack to /tmp, run each binary (a failing one is
#                                       re-run under compute-sanitizer memcheck on its first failing
#                                       case, once a call); logs in $OUT/tests.log, a table last
# Device run:  run(command="scripts/device/gpu_suite.sh", carry=[".device"])
# Environment: GPU_SUITE_FILTER (a regex of test names to run; default all).
set -uo pipefail
cd "$(dirname "$0")/../.."

. scripts/device/lib.sh

if [ "${1:-run}" = "stage" ]; then
  targets=$(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null) || exit 1
  bazel build $targets || exit 1
  staged=$(mktemp -d)
  for t in $targets; do
    p=${t#//}
    cp "bazel-bin/${p/://}" "$staged/"
  done
  chmod u+w "$staged"/* && strip "$staged"/*
  mkdir -p "$staged/lib" && cp -L /usr/lib/x86_64-linux-gnu/libgomp.so.1 "$staged/lib/"  # fallback only
  mkdir -p .device
  (cd "$staged" && tar cf - .) | xz -9e -T2 >.device/gpu_suite.tar.xz || exit 1
  rm -rf "$staged"
  ls -la .device/gpu_suite.tar.xz
  exit 0
fi

DIR=/tmp/gpu_suite
rm -rf "$DIR" && mkdir -p "$DIR"
xz -dc .device/gpu_suite.tar.xz | tar xf - -C "$DIR" || exit 1
device_setup "$DIR" /tmp/gpu_suite_out
export NCCL_NVLS_ENABLE=0
for t in $(cd "$DIR" && ls | grep -v '^lib$' | sort); do
  [[ "$t" =~ ${GPU_SUITE_FILTER:-.} ]] || continue
  run_gtest "$t" 300 300
done
print_test_report
