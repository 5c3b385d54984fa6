#!/usr/bin/env bash
# Fails when lines changed since BASE are not formatted as .clang-format says. Only
# changed lines are checked (clang-format-diff on `git diff -M`, so a moved file
# counts only its edits). BASE: the first argument, else the merge base with main,
# else the previous commit.
#   scripts/check-format.sh [BASE]      # report and fail
#   git diff -M -U0 BASE | clang-format-diff -p1 -i   # fix them
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-}"
if [ -z "$base" ]; then
  if git rev-parse -q --verify main >/dev/null && [ "$(git rev-parse HEAD)" != "$(git rev-parse main)" ]; then
    base="$(git merge-base HEAD main)"
  else
    base="HEAD~1"
  fi
fi
out="$(git diff -M -U0 --no-color "$base" -- '*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh' |
       clang-format-diff -p1)"
case "$out" in
  "")
    echo "format: lines changed since $(git rev-parse --short "$base") are formatted"
    ;;
  *)
    echo "$out"
    echo "format: lines changed since $(git rev-parse --short "$base") are not formatted (fix: git diff -M -U0 $base | clang-format-diff -p1 -i)"
    exit 1
    ;;
esac
