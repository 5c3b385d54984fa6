#!/usr/bin/env bash
# Installs missing dependencies, configures dtensor into build/ (Release, Ninja),
# prints the configure summary (backends, GEMM engines, CUDA) and builds.
#   scripts/build.sh [--target NAME]... [CMake configure arguments...]
# With --target only those targets (and what they need) are built; without, all.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
while [ $# -gt 0 ] && [ "$1" = "--target" ]; do
  targets+=(--target "$2")
  shift 2
done
bash scripts/install-deps.sh
# The full configure log stays in build/configure.log; the summary lines are shown
# (CMake's warnings and errors go to stderr and are always shown).
mkdir -p build
if ! cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > build/configure.log; then
  cat build/configure.log
  exit 1
fi
sed -n 's/^-- dtensor/dtensor/p' build/configure.log
cmake --build build -j "$(nproc)" "${targets[@]}"
