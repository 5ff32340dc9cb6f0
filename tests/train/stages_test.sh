#!/usr/bin/env bash
# Per-stage overrides and the batch-size warm-up end to end (issue 16): a
# miniature run whose first stage warms its batch up (2 -> 8 sequences) and
# whose second stage is given in tokens and sets its own RoPE base, masking
# rate, weight decay and WSD schedule. It is killed with SIGKILL in the middle
# of the warm-up and again in the second stage; every resumed step's loss must
# equal the uninterrupted run's to the last digit. Also checks what the
# stage banner, --print-config and metrics.jsonl say.
# Usage: stages_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

# Stage 1: batch 2, 2, 2, 4, 4, 6, then 8 (levels worked out in
# test_config_stages.cpp). Stage 2: 1024 tokens at 4 x 64 per step, 4 steps.
mini_config "$work/mini.yaml" \
  "run: {name: mini, dir: $work/run, seed: 11, threads: 2}" \
  "model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 128}" \
  "optim: {lr: 1.0e-3, warmup_steps: 2}" \
  "stages: [{max_seq_len: 32, batch_size: 8, micro_batch_size: 2, steps: 9, batch_warmup_start: 2, batch_warmup_tokens: 512}, {max_seq_len: 64, batch_size: 4, tokens: 1024, rope_base: 160000, mask_prob: 0.25, weight_decay: 0.05, lr: 5.0e-4, schedule: wsd, warmup_steps: 1, decay_shape: 1-sqrt, decay_fraction: 0.5}]" \
  "checkpoint: {every_steps: 2, keep_last: 2}" \
  "log: {every_steps: 1, eval_every_steps: 0, eval_batches: 2, eval_every_length: true, progress: never}"

"$roformer" prepare --config "$work/mini.yaml" >/dev/null 2>&1

"$roformer" pretrain --config "$work/mini.yaml" --print-config > "$work/printed.yaml"
grep -q '^#   stage 1: max_seq_len 32, batch 8 (4 x 2), batch warm-up from 2 over 512 tokens (6 steps), 9 steps' "$work/printed.yaml" \
  || { echo "--print-config lacks the resolved stage 1"; cat "$work/printed.yaml"; exit 1; }
grep -q '^#   stage 2: .*4 steps (from 1024 tokens), lr 0.0005 (own schedule: wsd.*rope_base 160000' "$work/printed.yaml" \
  || { echo "--print-config lacks the resolved stage 2"; cat "$work/printed.yaml"; exit 1; }

"$roformer" pretrain --config "$work/mini.yaml" run.dir="$work/straight" > "$work/straight.out" 2>&1
losses "$work/straight/metrics.jsonl" > "$work/straight.txt"
[[ $(wc -l < "$work/straight.txt") -eq 13 ]] || { echo "expected 13 logged steps"; cat "$work/straight.txt"; exit 1; }
# The global batch of each step follows the warm-up.
batches=$(grep '"type":"train"' "$work/straight/metrics.jsonl" | sed -n 's/.*"batch_size":\([0-9]*\),.*/\1/p' | tr '\n' ' ')
[[ "$batches" == "2 2 2 4 4 6 8 8 8 4 4 4 4 " ]] || { echo "unexpected batch sizes: $batches"; exit 1; }
grep -q 'stage 2/2: .*rope_base 160000' "$work/straight.out" || { echo "no stage-2 banner"; cat "$work/straight.out"; exit 1; }
grep -q 'tokens 1.02k/1.02k' "$work/straight.out" || { echo "stage 2 progress not in tokens"; cat "$work/straight.out"; exit 1; }
# With log.eval_every_length, stage 2's end also validates at stage 1's length.
for len in 32 64; do
  grep '"type":"validation"' "$work/straight/metrics.jsonl" | grep '"global_step":13,' | grep "\"max_seq_len\":$len,.*\"perplexity\":[0-9]" > /dev/null \
    || { echo "no validation at length $len after stage 2"; grep validation "$work/straight/metrics.jsonl"; exit 1; }
done
# Telemetry fields on every train record.
for key in tokens_per_s mfu data_wait_s grad_norm grad_norm_clipped update_ratio packing_efficiency lr allocated_mb; do
  n=$(grep '"type":"train"' "$work/straight/metrics.jsonl" | grep -c "\"$key\":[0-9]")
  [[ $n -eq 13 ]] || { echo "$key missing from train records ($n of 13)"; exit 1; }
done

set +e
# Killed before step 5: mid-warm-up (resumes from the step-4 checkpoint, batch 4).
ROFORMER_TEST_KILL_AT_STEP=5 "$roformer" pretrain --config "$work/mini.yaml" >/dev/null 2>&1
first=$?
# Killed again in stage 2 (resumes from the step-10 checkpoint).
ROFORMER_TEST_KILL_AT_STEP=11 "$roformer" pretrain --config "$work/mini.yaml" > "$work/second.out" 2>&1
second=$?
set -e
[[ $first -eq 137 && $second -eq 137 ]] || { echo "expected two SIGKILLs, got $first and $second"; exit 1; }
grep -q 'stage 1/2 (resumed at step 4)' "$work/second.out" || { echo "no resumed banner"; cat "$work/second.out"; exit 1; }
"$roformer" pretrain --config "$work/mini.yaml" > "$work/resumed.out" 2>&1
grep -q 'stage 2/2 (resumed at step 1): .*rope_base 160000' "$work/resumed.out" \
  || { echo "stage 2 not resumed with its own values"; cat "$work/resumed.out"; exit 1; }

losses "$work/run/metrics.jsonl" > "$work/resumed.txt"
fail=0
same_losses "$work/resumed.txt" "$work/straight.txt" || fail=1
[[ $(sort -un "$work/resumed.txt" | awk '{print $1}' | sort -un | wc -l) -eq 13 ]] || { echo "resumed run did not log all 13 steps"; fail=1; }
[[ $fail -eq 0 ]] || exit 1
echo "per-stage overrides and batch warm-up: 13 steps bit-identical across two kills"
