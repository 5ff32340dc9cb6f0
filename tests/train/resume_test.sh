#!/usr/bin/env bash
# Kill-and-resume is bit-exact: a miniature two-stage pretraining run is
# killed with SIGKILL mid-stage, killed again while writing a checkpoint, and
# resumed each time; every step's loss must equal, to the last printed digit,
# the loss of an uninterrupted run with the same config.
# Usage: resume_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

mini_config "$work/mini.yaml" "run: {name: mini, dir: $work/run, seed: 7, threads: 2}" \
  "model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 128}" \
  "optim: {lr: 1.0e-3, warmup_steps: 3}" \
  "stages: [{max_seq_len: 32, batch_size: 8, micro_batch_size: 4, steps: 6}, {max_seq_len: 64, batch_size: 4, steps: 6}]" \
  "checkpoint: {every_steps: 4, keep_last: 2}" \
  "log: {every_steps: 1, eval_every_steps: 5, eval_batches: 2, progress: never}"

"$roformer" prepare --config "$work/mini.yaml" >/dev/null

"$roformer" pretrain --config "$work/mini.yaml" run.dir="$work/straight" >/dev/null 2>&1
losses "$work/straight/metrics.jsonl" > "$work/straight.txt"
[[ $(wc -l < "$work/straight.txt") -eq 12 ]] || { echo "expected 12 logged steps"; cat "$work/straight.txt"; exit 1; }

set +e
ROFORMER_TEST_KILL_AT_STEP=7 "$roformer" pretrain --config "$work/mini.yaml" >/dev/null 2>&1
first=$?
# Resumes from step 4; dies while writing the step-8 checkpoint (temp file only).
ROFORMER_TEST_KILL_DURING_CHECKPOINT=8 "$roformer" pretrain --config "$work/mini.yaml" >/dev/null 2>&1
second=$?
set -e
[[ $first -eq 137 && $second -eq 137 ]] || { echo "expected two SIGKILLs, got $first and $second"; exit 1; }
ls "$work/run/checkpoints" | grep '\.tmp' > /dev/null || { echo "expected a half-written temp checkpoint"; exit 1; }
"$roformer" pretrain --config "$work/mini.yaml" > "$work/resumed.out" 2>&1

losses "$work/run/metrics.jsonl" > "$work/resumed.txt"
# Every logged step (including steps run twice after a kill) matches the straight run.
bad=0
same_losses "$work/resumed.txt" "$work/straight.txt" || bad=1
covered=$(cut -d' ' -f1 "$work/resumed.txt" | sort -un | wc -l)
[[ $covered -eq 12 ]] || { echo "resumed runs logged $covered distinct steps, expected 12"; bad=1; }
ls "$work/run/checkpoints" | grep '\.tmp' > /dev/null && { echo "temp checkpoint left behind"; bad=1; }
[[ $bad -eq 0 ]] && echo "kill-and-resume: all 12 step losses bit-identical"
exit $bad
