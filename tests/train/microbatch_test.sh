#!/usr/bin/env bash
# Micro-batch invariance with dropout on: a two-stage run whose global batch
# of 8 is one micro-batch of 8 against the same run split into 4 micro-batches
# of 2. Dropout is keyed by (seed, step, sequence in the global batch), masks
# by (seed, epoch, sequence), and the loss is normalised by the global masked
# count, so the runs differ only in float summation order: the first loss
# must agree to 1e-5 relative and every logged loss to 2e-3.
# Usage: microbatch_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

mini_config "$work/mb.yaml" "run: {name: mb, dir: $work/run, seed: 11, threads: 2}" \
  "model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 128, hidden_dropout_prob: 0.1, attention_probs_dropout_prob: 0.1}" \
  "optim: {lr: 1.0e-3, warmup_steps: 2}" \
  "stages: [{max_seq_len: 64, batch_size: 8, micro_batch_size: 8, steps: 6}, {max_seq_len: 32, batch_size: 8, micro_batch_size: 8, steps: 4}]" \
  "checkpoint: {every_steps: 0}" \
  "log: {every_steps: 1, eval_every_steps: 0, eval_batches: 0, progress: never}"
"$roformer" prepare --config "$work/mb.yaml" >/dev/null

"$roformer" pretrain --config "$work/mb.yaml" "run.dir=$work/one" >/dev/null 2>&1
"$roformer" pretrain --config "$work/mb.yaml" "run.dir=$work/four" stages.0.micro_batch_size=2 \
  stages.1.micro_batch_size=2 >/dev/null 2>&1
losses "$work/one/metrics.jsonl" > "$work/one.txt"
losses "$work/four/metrics.jsonl" > "$work/four.txt"
[[ $(wc -l < "$work/one.txt") -eq 10 && $(wc -l < "$work/four.txt") -eq 10 ]] ||
  { echo "expected 10 logged steps in each run"; cat "$work/one.txt" "$work/four.txt"; exit 1; }

paste "$work/one.txt" "$work/four.txt" | awk '
  { if ($1 != $3) { print "step mismatch: " $1 " vs " $3; bad = 1; next }
    d = $2 - $4; if (d < 0) d = -d; rel = d / ($2 < 0 ? -$2 : $2)
    printf "step %2d  1x8 %.7f  4x2 %.7f  rel %.2e\n", $1, $2, $4, rel
    if (NR == 1 && rel > 1e-5) { print "first loss differs by more than 1e-5 relative"; bad = 1 }
    if (rel > 2e-3) { print "step " $1 " differs by more than 2e-3 relative"; bad = 1 } }
  END { exit bad }'
# Dropout is really on: the same run without it gives other losses.
"$roformer" pretrain --config "$work/mb.yaml" "run.dir=$work/nodrop" model.hidden_dropout_prob=0 \
  model.attention_probs_dropout_prob=0 >/dev/null 2>&1
losses "$work/nodrop/metrics.jsonl" > "$work/nodrop.txt"
[[ $(head -1 "$work/nodrop.txt") != $(head -1 "$work/one.txt") ]] ||
  { echo "dropout had no effect on the first loss"; exit 1; }
echo "micro-batch invariance: 1 x 8 and 4 x 2 agree with dropout on"
