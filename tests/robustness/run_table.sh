#!/usr/bin/env bash
# The robustness table: bad inputs, faults and interruptions against the CLI.
# Each row of table.txt is "EXIT | PHRASE | COMMAND": the command (run by bash
# with $R = the roformer binary, $SRC = the source tree, $FX = the shared
# fixtures, $S = a fresh scratch folder for the row) must exit with EXIT and
# print PHRASE (stdout or stderr). No row may crash (signal, "internal
# error", "terminate called", sanitizer report) or hang (60 s); afterwards
# every file of the shared fixtures (a run directory with checkpoints, shards,
# a Hugging Face folder, task files) must be byte-identical.
# Usage: run_table.sh ROFORMER_BINARY SOURCE_DIR [ROW_FILTER_REGEX]
set -uo pipefail
R=$(realpath "$1")
SRC=$(realpath "$2")
filter=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
FX=$work/fx
export R SRC FX
"$here/make_fixtures.sh" "$R" "$SRC" "$FX" || { echo "FAIL: fixtures"; exit 1; }
(cd "$FX" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$work/before.sha"

rows=0 failed=0
while IFS= read -r line; do
  [[ -z "${line// /}" || "$line" =~ ^[[:space:]]*# ]] && continue
  want=$(sed -E 's/^ *([0-9]+) *\|.*/\1/' <<< "$line")
  phrase=$(sed -E 's/^[^|]*\| *([^|]*[^| ]) *\|.*/\1/' <<< "$line")
  cmd=$(sed -E 's/^[^|]*\|[^|]*\| *//' <<< "$line")
  [[ -n "$filter" && ! "$line" =~ $filter ]] && continue
  rows=$((rows + 1))
  S=$work/s$rows
  mkdir -p "$S"
  export S
  out=$(cd "$S" && timeout -s KILL 60 bash -c "$cmd" 2>&1)
  got=$?
  problem=""
  if [[ $got -eq 124 || $got -eq 137 ]]; then
    problem="hung (killed after 60 s)"
  elif [[ $got -ge 128 ]]; then
    problem="crashed (signal $((got - 128)))"
  elif grep -qE "internal error|terminate called|Sanitizer|runtime error:|Segmentation" <<< "$out"; then
    problem="crash report in the output"
  elif [[ $got -ne $want ]]; then
    problem="exit code $got, expected $want"
  elif ! grep -qF -- "$phrase" <<< "$out"; then
    problem="output lacks \"$phrase\""
  fi
  if [[ -n "$problem" ]]; then
    failed=$((failed + 1))
    echo "FAIL row $rows: $problem"
    echo "  command: $cmd"
    sed 's/^/  | /' <<< "$out" | tail -8
  fi
  rm -rf "$S"
done < "$here/table.txt"

(cd "$FX" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$work/after.sha"
if ! diff "$work/before.sha" "$work/after.sha" > "$work/diff.txt"; then
  echo "FAIL: the shared fixtures changed:"
  cat "$work/diff.txt"
  failed=$((failed + 1))
fi
echo "robustness table: $rows rows, $failed failed"
[[ -n "$filter" || $rows -ge 80 ]] || { echo "FAIL: fewer than 80 rows"; exit 1; }
[[ $failed -eq 0 ]]
