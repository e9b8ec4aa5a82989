#!/usr/bin/env bash
# Installs what treetrain builds with, from Debian packages, idempotently: Bazel (bazel-bootstrap),
# a C++ toolchain, the libraries wrapped in third_party/ and clang for the sanitizers and fuzzers.
# The CUDA toolkit is expected in /usr/local/cuda (nvcc, cuBLAS, cuDNN, NCCL); without it the
# build fails with a message.
set -euo pipefail

packages=(bazel-bootstrap build-essential libyaml-cpp-dev libspdlog-dev libfmt-dev
          libgtest-dev libgmock-dev nlohmann-json3-dev libprotobuf-dev protobuf-compiler
          libpng-dev libjpeg62-turbo-dev zlib1g-dev  # camera frames (data/image.h) and checkpoint CRC-32s
          # (base/crc.h), linked statically
          nettle-dev  # the rendezvous's job secret (distributed/auth.h), linked statically
          python3  # scripts/nav_client.py (its test) and scripts/vla_quickstart.sh's target check
          clang-14 libclang-rt-14-dev lld-14 llvm-14)  # the last four: scripts/sanitize.sh

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: the CUDA toolkit is missing: expected nvcc at /usr/local/cuda/bin/nvcc" >&2
  exit 1
fi
