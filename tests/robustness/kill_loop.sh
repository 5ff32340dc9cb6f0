#!/usr/bin/env bash
# Kill loops: `roformer pretrain` is killed with SIGKILL at 20 random moments
# (every fourth one inside a checkpoint write, through the test hook
# ROFORMER_TEST_KILL_DURING_CHECKPOINT) and resumed each time. After every kill
# each named checkpoint must load, and every step's loss logged by the
# interrupted runs must equal, to the last printed digit, the loss of an
# uninterrupted run. A run that finishes between kills starts a new episode.
# Usage: kill_loop.sh ROFORMER_BINARY SOURCE_DIR [KILLS] [SEED]
set -euo pipefail
R=$(realpath "$1")
SRC=$(realpath "$2")
kills=${3:-20}
RANDOM=${4:-$$}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

steps=40
mini_config "$work/k.yaml" "run: {dir: $work/run, seed: 5, threads: 1}" \
  "data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt, inputs: [\"$SRC/tests/fixtures/corpus/moby-dick/*.txt\"], shard_dir: $work/shards, validation_fraction: 0.1}" \
  "optim: {lr: 1.0e-3, warmup_steps: 3}" \
  "stages: [{max_seq_len: 32, batch_size: 4, micro_batch_size: 2, steps: $((steps / 2))}, {max_seq_len: 64, batch_size: 2, steps: $((steps / 2))}]" \
  "checkpoint: {every_steps: 2, keep_last: 2}"
"$R" prepare --config "$work/k.yaml" > /dev/null 2>&1

start=$(date +%s.%N)
"$R" pretrain --config "$work/k.yaml" run.dir="$work/straight" > /dev/null 2>&1
wall=$(echo "$(date +%s.%N) - $start" | bc)
losses "$work/straight/metrics.jsonl" > "$work/straight.txt"
[[ $(wc -l < "$work/straight.txt") -eq $steps ]] || fail "uninterrupted run logged $(wc -l < "$work/straight.txt") steps"

# Compares every logged loss of run directory $1 with the uninterrupted run.
compare() { same_losses <(losses "$1/metrics.jsonl") "$work/straight.txt"; }

episode=1 in_checkpoint=0
for ((k = 1; k <= kills; k++)); do
  run=$work/run$episode
  if ((k % 4 == 0)); then
    # Die inside a checkpoint write: a few steps past the newest checkpoint.
    last=$({ checkpoint_steps "$run/checkpoints" 2> /dev/null || true; } | awk '{print $NF}')
    at=$(((${last:-0} / 2 + 1 + RANDOM % 3) * 2))
    ((at > steps)) && at=$steps
    set +e
    ROFORMER_TEST_KILL_DURING_CHECKPOINT=$at "$R" pretrain --config "$work/k.yaml" run.dir="$run" > /dev/null 2>&1
    code=$?
    set -e
    [[ $code -eq 137 ]] && in_checkpoint=$((in_checkpoint + 1))
  else
    # A random moment within an uninterrupted run's wall time.
    delay=$(echo "scale=3; $wall * $((RANDOM % 1000)) / 1000" | bc)
    "$R" pretrain --config "$work/k.yaml" run.dir="$run" > /dev/null 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 $pid 2> /dev/null || true
    set +e
    wait $pid 2> /dev/null
    code=$?
    set -e
  fi
  [[ $code -eq 0 || $code -eq 137 ]] || fail "kill $k: pretrain exited with $code"
  for f in "$run"/checkpoints/ckpt-*.h5; do
    [[ -e "$f" ]] || continue
    "$R" inspect "$f" > /dev/null 2>&1 || fail "kill $k: checkpoint $f does not load"
  done
  if [[ $code -eq 0 ]]; then  # finished before the kill: check it, start over
    compare "$run" || fail "episode $episode: losses differ"
    episode=$((episode + 1))
  fi
done
run=$work/run$episode
"$R" pretrain --config "$work/k.yaml" run.dir="$run" > /dev/null 2>&1 || fail "final resume failed"
compare "$run" || fail "episode $episode: losses differ"
covered=$(losses "$run/metrics.jsonl" | cut -d' ' -f1 | sort -un | wc -l)
[[ $covered -eq $steps ]] || fail "episode $episode logged $covered distinct steps, expected $steps"
echo "kill loop: $kills kills ($in_checkpoint inside checkpoint writes) over $episode episode(s); every checkpoint loads, every loss bit-identical"
