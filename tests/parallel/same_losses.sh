#!/usr/bin/env bash
# Runs train_gpt with the same flags on a reference mesh and on each other mesh given,
# and passes when every step's loss agrees within 1e-5 relative (the layouts are one
# rank's computation reordered; SAME_LOSSES_TOLERANCE sets another bound):
#   same_losses.sh TRAIN_GPT WORKDIR "--mesh dp=1" "--mesh dp=2,cp=2" ... -- COMMON FLAGS
set -euo pipefail
train_gpt=$1 work=$2 tolerance=${SAME_LOSSES_TOLERANCE:-1e-5}
shift 2
meshes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do meshes+=("$1"); shift; done
[ $# -gt 0 ] && shift
mkdir -p "$work"
status=0
for i in "${!meshes[@]}"; do
  # shellcheck disable=SC2086 # each mesh argument is a list of flags
  "$train_gpt" ${meshes[$i]} "$@" --log plain --out "$work/run$i.csv" > "$work/run$i.log" 2>&1 ||
    { echo "FAIL: ${meshes[$i]}: $(tail -1 "$work/run$i.log")"; exit 1; }
  [ -s "$work/run$i.csv" ] || { echo "FAIL: ${meshes[$i]} wrote no losses"; exit 1; }
  [ "$i" = 0 ] && continue
  # step,loss of each (the files go on with seconds and peak bytes)
  if ! paste -d, <(tail -n +2 "$work/run0.csv" | cut -d, -f1,2) <(tail -n +2 "$work/run$i.csv" | cut -d, -f1,2) |
    awk -F, -v what="${meshes[$i]}" -v tol="$tolerance" '{ d = $2 - $4; if (d < 0) d = -d;
      if (d > tol * $2) { print what ", step " $1 ": loss " $4 " vs " $2; bad = 1 } } END { exit bad }'; then
    status=1
  else
    echo "${meshes[$i]}: $(($(wc -l < "$work/run$i.csv") - 1)) losses equal to ${meshes[0]}'s"
  fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
