#!/usr/bin/env bash
# The main example: installs what is missing, builds, runs it. Arguments go to the
# example.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/examples/quickstart "$@"
