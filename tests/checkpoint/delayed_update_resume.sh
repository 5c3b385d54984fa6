#!/usr/bin/env bash
# The delayed update and checkpoints: a run saved at step 4 lands its update in flight
# first, so the run that goes on and the run resumed from that checkpoint take the same
# steps after it, bit for bit (the resumed run's warm-up counts the run's own steps).
#   delayed_update_resume.sh TRAIN_GPT WORK_DIR
set -euo pipefail
train_gpt="$1"
work="$2"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--mesh dp=2 --fsdp 3 --offload --delayed-update 2 --steps 8 --log plain)
export DTENSOR_GEMM_ENGINE=openblas  # bit for bit across processes: one GEMM engine
fail() { echo "FAIL: $*" >&2; exit 1; }
losses_from() { awk -F, -v first="$2" 'NR > 1 && $1 >= first { print $1 "," $2 }' "$1"; }

"$train_gpt" "${common[@]}" --save-dir ref --save-every 4 --out ref.csv > ref.log
grep -q "delayed update: 6 of 8 steps one step stale" ref.log || { cat ref.log; fail "expected 6 delayed steps"; }
"$train_gpt" "${common[@]}" --resume ref/step-00000004 --out resumed.csv > resumed.log
grep -q "^step 5/8" resumed.log || { cat resumed.log; fail "the resumed run does not continue at step 5"; }
grep -q "delayed update: 4 of 4 steps one step stale" resumed.log || { cat resumed.log; fail "expected 4 delayed steps"; }
diff <(losses_from ref.csv 5) <(losses_from resumed.csv 5) || fail "the resumed losses differ from the run that went on"
echo "PASS: steps 5-8 of the resumed run equal the run that went on"
