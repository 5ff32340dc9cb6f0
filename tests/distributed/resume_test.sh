#!/usr/bin/env bash
# Resume across world sizes. A 2-rank run killed (every rank, SIGKILL) after
# its step-4 checkpoint resumes on 2 ranks bit-exactly, and on 1 rank with the
# same schedule and data order (losses within the equivalence tolerance); a
# 1-rank run killed the same way resumes on 2 ranks likewise.
# Usage: resume_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
ROFORMER=$1
SRC=$2
source "$SRC/tests/distributed/common.sh"
write_config

# The newest logged loss of each step (a resumed run logs its rerun steps again).
last_losses() { losses "$1" | awk '{ l[$1] = $2 } END { for (s in l) print s, l[s] }' | sort -n; }

launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/straight" >/dev/null 2>&1
last_losses "$work/straight/metrics.jsonl" > "$work/straight.txt"
[[ $(wc -l < "$work/straight.txt") -eq 10 ]] || { echo "expected 10 steps"; exit 1; }

# kill_then_resume NAME FIRST_RANKS THEN_RANKS: killed before global step 5
# (after the step-4 checkpoint), then resumed to the end.
kill_then_resume() {
  local dir=$work/$1
  if [[ $2 -eq 1 ]]; then
    ROFORMER_TEST_KILL_AT_STEP=5 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$dir" \
      >"$work/$1.first.log" 2>&1 && { echo "$1: the killed run exited 0"; exit 1; }
  else
    launch "$2" -x ROFORMER_TEST_KILL_AT_STEP=5 "$ROFORMER" pretrain --config "$work/dp.yaml" \
      "run.dir=$dir" >"$work/$1.first.log" 2>&1 && { echo "$1: the killed run exited 0"; exit 1; }
  fi
  [[ -f $dir/checkpoints/ckpt-00000004.h5 ]] || { echo "$1: no step-4 checkpoint"; ls "$dir/checkpoints"; exit 1; }
  if [[ $3 -eq 1 ]]; then
    "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$dir" >"$work/$1.log" 2>&1
  else
    launch "$3" "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$dir" >"$work/$1.log" 2>&1
  fi || { cat "$work/$1.log"; exit 1; }
  grep -q "resuming from .*ckpt-00000004.h5" "$work/$1.log" || { echo "$1: did not resume from step 4"; cat "$work/$1.log"; exit 1; }
  last_losses "$dir/metrics.jsonl" > "$work/$1.txt"
}

kill_then_resume same 2 2
cmp "$work/straight.txt" "$work/same.txt" ||
  { echo "resume on the same world size is not bit-exact"; diff "$work/straight.txt" "$work/same.txt"; exit 1; }
echo "2 -> 2: bit-exact"
kill_then_resume shrink 2 1
compare "$work/straight.txt" "$work/shrink.txt" 1e-5 "2 -> 1 ranks"
kill_then_resume grow 1 2
compare "$work/straight.txt" "$work/grow.txt" 1e-5 "1 -> 2 ranks"
