#!/usr/bin/env bash
# A full disk while logging: metrics.jsonl of a resumed run points at
# /dev/full, where every write fails with "No space left on device" while the
# checkpoints (another directory) can still be written. The run must stop at
# the first failed record with exit 1 AFTER saving a checkpoint of that step,
# say so, leave no partial line, and resuming from that checkpoint must give
# the losses of an uninterrupted run.
# Usage: log_full.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
R=$(realpath "$1")
SRC=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"
[[ -w /dev/full ]] || { echo "SKIP: no /dev/full"; exit 77; }

mini_config "$work/l.yaml" "stages: [{max_seq_len: 32, batch_size: 2, steps: 8}]" \
  "checkpoint: {every_steps: 4, keep_last: 0}"
"$R" prepare --config "$work/l.yaml" > /dev/null 2>&1
"$R" pretrain --config "$work/l.yaml" run.dir="$work/straight" > /dev/null 2>&1
losses "$work/straight/metrics.jsonl" > "$work/straight.txt"

# Killed before step 6: the step-4 checkpoint is the newest.
set +e
ROFORMER_TEST_KILL_AT_STEP=5 "$R" pretrain --config "$work/l.yaml" > /dev/null 2>&1
set -e
[[ $(checkpoint_steps "$work/run/checkpoints") == "4 " ]] || fail "expected one checkpoint at step 4"
mv "$work/run/metrics.jsonl" "$work/metrics.kept"
ln -s /dev/full "$work/run/metrics.jsonl"

# Resumed: step 5's record fails; a checkpoint of step 5 is saved, then it stops.
set +e
"$R" pretrain --config "$work/l.yaml" > "$work/full.out" 2>&1
code=$?
set -e
[[ $code -ge 128 ]] && { cat "$work/full.out"; fail "pretrain crashed (signal $((code - 128)))"; }
[[ $code -eq 1 ]] || { cat "$work/full.out"; fail "exit code $code, expected 1"; }
grep -q "stopping after global step 5: cannot write metrics file $work/run/metrics.jsonl: No space left on device" \
  "$work/full.out" || { cat "$work/full.out"; fail "the error does not name the file and the full disk"; }
ckpt=$(ls "$work"/run/checkpoints/ckpt-*5.h5)
grep -q "saved $ckpt" "$work/full.out" || { cat "$work/full.out"; fail "the saved checkpoint is not named"; }
grep -q "resume with: roformer pretrain --config $work/l.yaml" "$work/full.out" || fail "no resume advice"
[[ $(checkpoint_steps "$work/run/checkpoints") == "4 5 " ]] || fail "expected checkpoints at steps 4 and 5"
"$R" inspect "$ckpt" | grep -E "global step +5$" > /dev/null || fail "$ckpt does not load as global step 5"

# Space again: the run continues from step 5, and every logged loss (steps 1
# to 5 by the killed run, 6 to 8 after) is the uninterrupted run's.
rm "$work/run/metrics.jsonl"
mv "$work/metrics.kept" "$work/run/metrics.jsonl"
"$R" pretrain --config "$work/l.yaml" > "$work/resumed.out" 2>&1 || { cat "$work/resumed.out"; fail "resume failed"; }
grep -q "resuming from $ckpt" "$work/resumed.out" || { head "$work/resumed.out"; fail "did not resume from $ckpt"; }
grep -qv '^{.*}$' "$work/run/metrics.jsonl" && fail "metrics.jsonl holds a partial line"
losses "$work/run/metrics.jsonl" | sort -n -u > "$work/resumed.txt"
diff "$work/straight.txt" "$work/resumed.txt" ||
  fail "the resumed run's losses differ from the uninterrupted run's"
echo "log full: stopped after saving the step-5 checkpoint (exit 1); resuming from it matches an uninterrupted run"
