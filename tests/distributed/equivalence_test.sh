#!/usr/bin/env bash
# Same run at any size: 1 rank (one micro-batch of 8), 2 ranks (4 each) and
# 2 ranks x 2 micro-batches (2 + 2 each) give the same losses with dropout
# on, up to float summation order (docs/distributed.md: the tolerance).
# Usage: equivalence_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
ROFORMER=$1
SRC=$2
source "$SRC/tests/distributed/common.sh"
write_config

"$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/one" >"$work/one.log" 2>&1
launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/two" >"$work/two.log" 2>&1 ||
  { cat "$work/two.log"; exit 1; }
launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/twobytwo" \
  stages.0.micro_batch_size=2 stages.1.micro_batch_size=2 >"$work/twobytwo.log" 2>&1 ||
  { cat "$work/twobytwo.log"; exit 1; }
grep -q "2 rank(s) x 2 x 2" "$work/twobytwo.log" || { echo "no 2 x 2 x 2 split logged"; exit 1; }

for run in one two twobytwo; do losses "$work/$run/metrics.jsonl" > "$work/$run.txt"; done
[[ $(wc -l < "$work/one.txt") -eq 10 ]] || { echo "expected 10 logged steps"; exit 1; }
compare "$work/one.txt" "$work/two.txt" 1e-5 "1 rank vs 2 ranks"
compare "$work/one.txt" "$work/twobytwo.txt" 1e-5 "1 rank vs 2 ranks x 2 micro-batches"
# The first step sees identical weights: only summation order differs.
head -1 "$work/one.txt" > "$work/a" && head -1 "$work/two.txt" > "$work/b"
compare "$work/a" "$work/b" 1e-6 "first step"
# Only rank 0 writes metrics and checkpoints, and both runs write the same ones.
[[ $(ls "$work/one/checkpoints" | sort) == $(ls "$work/two/checkpoints" | sort) ]] ||
  { echo "checkpoint lists differ"; ls "$work/one/checkpoints" "$work/two/checkpoints"; exit 1; }
# Dropout is on: without it the first loss changes.
"$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/nodrop" model.hidden_dropout_prob=0 \
  model.attention_probs_dropout_prob=0 stages.0.steps=1 stages.1.steps=1 >/dev/null 2>&1
[[ $(losses "$work/nodrop/metrics.jsonl" | head -1) != $(head -1 "$work/one.txt") ]] ||
  { echo "dropout had no effect"; exit 1; }

# Fine-tuning too: a 2-label task of 20 examples, batch 8 (the last batch of
# each epoch holds 4 and reaches rank 0 only), 2 epochs.
for i in $(seq 1 20); do
  if ((i % 2)); then echo "{\"text\": \"the whale swam in the sea number $i\", \"label\": \"sea\"}"
  else echo "{\"text\": \"the nation and the congress met in year $i\", \"label\": \"state\"}"; fi
done > "$work/task.jsonl"
cat > "$work/ft.yaml" <<YAML
run: {name: ft, dir: $work/ft, seed: 5, threads: 1}
model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2,
        intermediate_size: 64, max_position_embeddings: 128}
data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt}
log: {every_steps: 1, progress: never}
finetune: {task: classification, train_file: $work/task.jsonl, validation_file: $work/task.jsonl,
           max_seq_len: 32, batch_size: 8, epochs: 2, lr: 1.0e-3}
YAML
"$ROFORMER" finetune --config "$work/ft.yaml" "run.dir=$work/ft1" >"$work/ft1.log" 2>&1 ||
  { cat "$work/ft1.log"; exit 1; }
launch 2 "$ROFORMER" finetune --config "$work/ft.yaml" "run.dir=$work/ft2" >"$work/ft2.log" 2>&1 ||
  { cat "$work/ft2.log"; exit 1; }
losses "$work/ft1/metrics.jsonl" > "$work/ft1.txt"
losses "$work/ft2/metrics.jsonl" > "$work/ft2.txt"
[[ $(wc -l < "$work/ft1.txt") -eq 6 ]] || { echo "fine-tuning: expected 6 logged steps"; cat "$work/ft1.txt"; exit 1; }
compare "$work/ft1.txt" "$work/ft2.txt" 1e-5 "fine-tuning: 1 rank vs 2 ranks"
echo "equivalence: 1 rank, 2 ranks and 2 ranks x 2 micro-batches agree with dropout on"
