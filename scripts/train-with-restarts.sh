#!/usr/bin/env bash
# Runs a training command until it succeeds, relaunching it after each failure; the
# command resumes from its newest checkpoint (give it --save-dir D --resume D, as
# examples/train_gpt takes them). After --max-restarts failed relaunches of the command,
# the --fallback command (the same run on fewer ranks, say) takes over for as many more.
#
#   scripts/train-with-restarts.sh --max-restarts 3 \
#       --fallback "build/examples/train_gpt --mesh dp=2 --steps 1000 --save-dir ckpt --resume ckpt --save-every 50" \
#       -- build/examples/train_gpt --mesh dp=4 --steps 1000 --save-dir ckpt --resume ckpt --save-every 50
#
# Exit status: 0 when a run finished, the last failure's status otherwise. Each attempt
# is announced on stderr ("restart 2/3: ...").
set -uo pipefail
max_restarts=3
fallback=""
while [ $# -gt 0 ]; do
  case "$1" in
    --max-restarts) max_restarts="$2"; shift 2 ;;
    --fallback) fallback="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "train-with-restarts: unknown option $1 (usage: [--max-restarts N] [--fallback CMD] -- CMD...)" >&2; exit 2 ;;
  esac
done
if [ $# -eq 0 ]; then
  echo "train-with-restarts: no command given (usage: [--max-restarts N] [--fallback CMD] -- CMD...)" >&2
  exit 2
fi

# attempt CMD...: runs it once; prints nothing of its own.
status=0
run_until_done() {
  local label="$1"; shift
  local attempt=0
  while true; do
    "$@"
    status=$?
    [ "$status" -eq 0 ] && return 0
    if [ "$attempt" -ge "$max_restarts" ]; then
      echo "train-with-restarts: $label failed $((attempt + 1)) times (last status $status)" >&2
      return 1
    fi
    attempt=$((attempt + 1))
    echo "train-with-restarts: status $status, restart $attempt/$max_restarts of the $label from its last checkpoint" >&2
  done
}

run_until_done "command" "$@" && exit 0
if [ -n "$fallback" ]; then
  echo "train-with-restarts: switching to the fallback command: $fallback" >&2
  # shellcheck disable=SC2086  # the fallback is one string of words
  run_until_done "fallback" $fallback && exit 0
fi
exit "$status"
