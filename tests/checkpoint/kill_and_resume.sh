#!/usr/bin/env bash
# train_gpt killed (SIGKILL) in the middle of a save, then resumed: the interrupted
# save leaves the previous checkpoint, and the resumed run gives the uninterrupted
# run's losses bit for bit; then the restart loop (scripts/train-with-restarts.sh)
# brings a run whose rank fails mid-run to the uninterrupted run's final loss, and its
# fallback finishes on fewer ranks.
#   kill_and_resume.sh TRAIN_GPT SOURCE_DIR WORK_DIR
set -euo pipefail
train_gpt="$1"
source_dir="$2"
work="$3"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--steps 8 --log plain --save-every 2)
# Bit for bit across processes needs one GEMM engine: the per-shape choice among the
# engines is measured in each process, and engines round differently.
export DTENSOR_GEMM_ENGINE=openblas
fail() { echo "FAIL: $*" >&2; exit 1; }
# The loss column of steps FIRST.. of a loss CSV.
losses_from() { awk -F, -v first="$2" 'NR > 1 && $1 >= first { print $1 "," $2 }' "$1"; }

echo "== the uninterrupted run"
"$train_gpt" --mesh dp=2 "${common[@]}" --save-dir ref --out ref.csv > ref.log

# rank 1 while writing its data file; rank 0 after the manifest, before the rename.
for fault in rank:1,point:written rank:0,point:manifest; do
  echo "== killed at $fault during the second save (step 4)"
  rm -rf run
  set +e
  DTENSOR_CHECKPOINT_FAULT="$fault,kind:kill,count:2" \
    "$train_gpt" --mesh dp=2 "${common[@]}" --save-dir run --out run.csv > run.log 2>&1
  status=$?
  set -e
  [ "$status" -eq 137 ] || { cat run.log; fail "expected death by SIGKILL (137), got status $status"; }
  [ -f run/step-00000002/manifest.json ] || fail "the step-2 checkpoint is gone"
  [ ! -e run/step-00000004 ] || fail "a step-4 checkpoint appeared although its save was killed"
  echo "== resumed"
  "$train_gpt" --mesh dp=2 "${common[@]}" --save-dir run --resume run --out resumed.csv > resumed.log
  grep -q "resumed from run/step-00000002: 2 of 8 steps done" resumed.log || { cat resumed.log; fail "did not resume from step 2"; }
  grep -q "^step 3/8" resumed.log || fail "the resumed run does not continue at step 3"
  diff <(losses_from ref.csv 3) <(losses_from resumed.csv 3) || fail "the resumed losses differ from the uninterrupted run's"
done

# Losses of steps FIRST.. of two CSVs within 1e-5 relative.
close_losses() {
  paste -d, <(losses_from "$1" "$3") <(losses_from "$2" "$3") |
    awk -F, '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "step " $1 ": " $4 " vs " $2; bad = 1 } }
             END { exit bad }'
}

echo "== saved at step 4 on dp=2, resumed on dp=4"
"$train_gpt" --mesh dp=4 "${common[@]}" --resume ref/step-00000004 --save-dir dp4 --out dp4.csv > dp4.log
grep -q "^step 5/8" dp4.log || { cat dp4.log; fail "the dp=4 run does not continue at step 5"; }
close_losses ref.csv dp4.csv 5 || fail "dp=4 after dp=2: losses differ by more than 1e-5"

echo "== saved at step 4 on pp=2 (4 micro-batches), resumed on one rank (4 accumulated micro-batches)"
"$train_gpt" --mesh pp=2 --schedule gpipe --microbatches 4 "${common[@]}" --save-dir pp --out pp.csv > pp.log
"$train_gpt" --mesh dp=1 --grad-accum 4 "${common[@]}" --resume pp/step-00000004 --save-dir one --out one.csv > one.log
close_losses pp.csv one.csv 5 || fail "one rank after pp=2: losses differ by more than 1e-5"

echo "== the restart loop: rank 1 fails mid-run on the first attempt"
rm -rf loop
# The first attempt runs with a communication fault; later ones without.
cat > attempt.sh <<INNER
#!/usr/bin/env bash
if [ ! -e first_attempt_done ]; then
  touch first_attempt_done
  export DTENSOR_FAULT="rank:1,call:50,kind:throw"
fi
exec "$train_gpt" --mesh dp=2 ${common[*]} --save-dir loop --resume loop --out loop.csv
INNER
chmod +x attempt.sh
bash "$source_dir/scripts/train-with-restarts.sh" --max-restarts 2 -- ./attempt.sh > loop.log 2>&1 || { cat loop.log; fail "the restart loop failed"; }
grep -q "restart 1/2" loop.log || { cat loop.log; fail "the first attempt did not fail"; }
diff <(losses_from ref.csv 8) <(losses_from loop.csv 8) || fail "the final loss differs from the uninterrupted run's"

echo "== the fallback: dp=2 keeps failing, dp=1 finishes"
rm -rf fallback
# Every dp=2 attempt fails after about two steps (it checkpoints before).
DTENSOR_FAULT="rank:1,call:40,kind:throw" bash "$source_dir/scripts/train-with-restarts.sh" --max-restarts 1 \
  --fallback "env -u DTENSOR_FAULT $train_gpt --mesh dp=1 ${common[*]} --save-dir fallback --resume fallback --out fallback.csv" \
  -- "$train_gpt" --mesh dp=2 "${common[@]}" --save-dir fallback --resume fallback --out fallback.csv > fallback.log 2>&1 ||
  { cat fallback.log; fail "the fallback did not finish"; }
grep -q "switching to the fallback" fallback.log || { cat fallback.log; fail "no switch to the fallback"; }
paste -d, <(losses_from ref.csv 8) <(losses_from fallback.csv 8) |
  awk -F, '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "final loss " $4 " vs " $2; exit 1 } }' ||
  fail "the fallback's final loss is not within 1e-5 of the uninterrupted run's"
echo "PASS"
