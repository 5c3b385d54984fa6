#!/usr/bin/env bash
# Fuzzes every libFuzzer target of tests/fuzz for SECONDS (default 60) each, two at a
# time, starting from its seed corpus (read only; new inputs go to a scratch dir).
#   run-fuzzers.sh BUILD_DIR [SECONDS]
# BUILD_DIR: a build with -DDTENSOR_BUILD_FUZZERS=ON (scripts/run-sanitizers.sh makes one).
# A crash, a sanitizer report or a failed check fails the run; the reproducer is
# left in BUILD_DIR/fuzz-artifacts.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$1
seconds=${2:-60}
artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
targets=(fuzz_placements fuzz_mesh_spec fuzz_config fuzz_redistribute fuzz_checkpoint)
run() {
  local target=$1 scratch
  scratch=$(mktemp -d)
  "$build/tests/fuzz/$target" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/$target-" \
    "$scratch" "tests/fuzz/corpus/$target" >"$artifacts/$target.log" 2>&1
  local status=$?
  rm -rf "$scratch"
  echo "$target: $(grep -E '^stat::number_of_executed_units' "$artifacts/$target.log" | awk '{print $2}') inputs in ${seconds} s, status $status"
  [ $status -eq 0 ] || tail -40 "$artifacts/$target.log"
  return $status
}
fail=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run "${targets[i]}" &
  first=$!
  second=""
  if [ $((i + 1)) -lt ${#targets[@]} ]; then
    run "${targets[i + 1]}" &
    second=$!
  fi
  wait $first || fail=1
  [ -z "$second" ] || wait $second || fail=1
done
exit $fail
