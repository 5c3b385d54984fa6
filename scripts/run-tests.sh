#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the whole CTest suite
# (threads and MPI backends, the install/find_package check, the examples).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
