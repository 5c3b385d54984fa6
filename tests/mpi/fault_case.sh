#!/usr/bin/env bash
# One fault scenario of mpi_faults under mpirun, and how the job ended:
#   fault_case.sh SCENARIO NP MAX_SECONDS STATUS PATTERN [VAR=VALUE ...]
# STATUS: the exit status mpirun must return, or "nonzero". PATTERN: an extended
# regex the combined output must match ("-" for none); "!" before it: must not match.
# The job must end within MAX_SECONDS, and no process of it may outlive mpirun.
# SCENARIO kill9 runs the "loop" scenario and kill -9s rank 1 once it is reducing.
# Environment: MPI_FAULTS (the program), MPIEXEC (mpirun) and MPIEXEC_FLAGS.
set -u
scenario=$1 np=$2 max=$3 expect=$4 pattern=$5
shift 5
tag="dtensor-fault-case-$$-$RANDOM"
program_scenario=$scenario
[ "$scenario" = kill9 ] && program_scenario=loop
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s%N)
# A hung job is killed well past the bound, so the report below still comes.
env "$@" timeout -k 5 $((max + 60)) "$MPIEXEC" -np "$np" --oversubscribe $MPIEXEC_FLAGS \
  "$MPI_FAULTS" "$program_scenario" "$tag" >"$log" 2>&1 &
job=$!
if [ "$scenario" = kill9 ]; then
  victim=""
  for _ in $(seq 1 200); do
    victim=$(sed -n 's/^rank 1 pid \([0-9]*\)$/\1/p' "$log" | head -1)
    [ -n "$victim" ] && break
    sleep 0.05
  done
  [ -n "$victim" ] || { cat "$log"; echo "FAIL: rank 1 never started"; exit 1; }
  sleep 0.5  # well inside its all-reduces by now
  start=$(date +%s%N)
  kill -9 "$victim"
fi
wait "$job"
status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "$log"
echo "--- status $status after ${elapsed_ms} ms"

fail=0
if [ "$expect" = nonzero ]; then
  [ "$status" -ne 0 ] || { echo "FAIL: expected a non-zero status"; fail=1; }
else
  [ "$status" -eq "$expect" ] || { echo "FAIL: expected status $expect"; fail=1; }
fi
[ "$elapsed_ms" -le $((max * 1000)) ] || { echo "FAIL: took longer than $max s"; fail=1; }
if [ "$pattern" != - ]; then
  if [ "${pattern:0:1}" = "!" ]; then
    ! grep -Eq -- "${pattern:1}" "$log" || { echo "FAIL: output matches '${pattern:1}'"; fail=1; }
  else
    grep -Eq -- "$pattern" "$log" || { echo "FAIL: output does not match '$pattern'"; fail=1; }
  fi
fi
sleep 0.5
if pgrep -f -- "$tag" >/dev/null; then
  echo "FAIL: processes outlived the job:"
  pgrep -af -- "$tag"
  fail=1
fi
exit $fail
