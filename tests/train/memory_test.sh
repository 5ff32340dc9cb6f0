#!/usr/bin/env bash
# Bounded memory across stages: a schedule that swings 128 -> 32 -> 64 -> 128
# -> 32 must peak no higher (within 15%) than its largest stage run alone.
# The allocator's cache is released at stage ends and batch lengths are
# bucketed; without that each stage's freed blocks of other sizes pile up.
# Peak RSS comes from the run's own metrics (getrusage), the last stage_end.
# Usage: memory_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
if [[ -n "${ROFORMER_SANITIZED:-}" ]]; then
  echo "skipped: peak RSS under AddressSanitizer measures its quarantine, not our allocator"
  exit 77
fi
roformer=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

# config NAME STAGE...: the mini config with the given stages.
config() {
  local name=$1 stages
  shift
  stages=$(IFS=,; echo "$*")
  mini_config "$work/$name.yaml" "run: {dir: $work/run, seed: 2, threads: 2}" \
    "model: {vocab_size: 30522, hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 512, max_position_embeddings: 128}" \
    "checkpoint: {every_steps: 0, keep_last: 1, keep_stage_ends: false}" \
    "log: {every_steps: 1, eval_every_steps: 0, eval_batches: 1, progress: never}" \
    "stages: [$stages]"
}
long="{max_seq_len: 128, batch_size: 32, steps: 3}"
short="{max_seq_len: 32, batch_size: 128, steps: 3}"
mid="{max_seq_len: 64, batch_size: 64, steps: 3}"
config m "$long" "$short" "$mid" "$long" "$short"
config largest "$long"
"$roformer" prepare --config "$work/m.yaml" >/dev/null
peak() { sed -n 's/.*"peak_rss_mb":\([0-9.]*\).*"type":"stage_end".*/\1/p' "$1" | tail -1; }
"$roformer" pretrain --config "$work/m.yaml" "run.dir=$work/all" >/dev/null 2>&1
"$roformer" pretrain --config "$work/largest.yaml" "run.dir=$work/one" >/dev/null 2>&1
all=$(peak "$work/all/metrics.jsonl")
one=$(peak "$work/one/metrics.jsonl")
[[ -n $all && -n $one ]] || { echo "no stage_end peak_rss_mb in metrics.jsonl"; exit 1; }
echo "peak RSS: five stages $all MB, the largest stage alone $one MB"
awk -v a="$all" -v o="$one" 'BEGIN { if (a > 1.15 * o) { print "the schedule peaks more than 15% above its largest stage"; exit 1 } }'
echo "memory across stages: bounded by the largest stage"
