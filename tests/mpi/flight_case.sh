#!/usr/bin/env bash
# The flight recorder on the mpi backend: rank 2 of 4 stalls in its 5th all-reduce
# with DTENSOR_FLIGHT_RECORDER set. The first rank whose watchdog fires dumps its
# record and asks the others for theirs (the stalled rank's watchdog answers) before
# the job is aborted; dtensor-flight then names rank 2 as the one that never arrived.
# Environment: MPI_FAULTS, MPIEXEC, MPIEXEC_FLAGS (as fault_case.sh) and DTENSOR_FLIGHT.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
env DTENSOR_TIMEOUT_S=2 DTENSOR_FAULT=rank:2,call:5,kind:stall DTENSOR_FLIGHT_RECORDER="$dir/records" \
  timeout -k 5 60 "$MPIEXEC" -np 4 --oversubscribe $MPIEXEC_FLAGS "$MPI_FAULTS" loop "dtensor-flight-case-$$" \
  >"$dir/job.log" 2>&1
status=$?
cat "$dir/job.log"
echo "--- job status $status; records: $(ls "$dir/records" 2>/dev/null | tr '\n' ' ')"
"$DTENSOR_FLIGHT" "$dir/records" >"$dir/report" 2>&1
analysis=$?
cat "$dir/report"
fail=0
[ "$status" -eq 124 ] || { echo "FAIL: expected the watchdog's status 124"; fail=1; }
[ "$analysis" -eq 1 ] || { echo "FAIL: expected dtensor-flight to name a problem (status 1), got $analysis"; fail=1; }
for pattern in "flight records of 4 of 4 ranks" "suspect: rank 2," \
               "rank 2 never arrived at call #4 of group 'world' \(ranks 0,1,2,3\)"; do
  grep -Eq -- "$pattern" "$dir/report" || { echo "FAIL: the report does not match '$pattern'"; fail=1; }
done
[ "$fail" -eq 0 ] && echo PASS
exit $fail
