#!/usr/bin/env bash
# The main example, data-parallel GPT training (examples/train_gpt.cpp): installs
# what is missing, builds the library and the example only, runs it. Arguments go to
# the example (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh --target train_gpt
./build/examples/train_gpt "$@"
