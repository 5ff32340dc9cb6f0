#!/usr/bin/env bash
# run.precision: bf16 (issue 12). A miniature pretraining run:
#   - f32 -> bf16 resume: killed in f32 after the step-4 checkpoint, resumed
#     with run.precision=bf16, finishes; its losses follow the f32 run's
#     (checkpoints are f32 whatever the precision) without being equal to them
#     (the bf16 products really ran);
#   - bf16 -> f32 resume: the reverse;
#   - a CPU without bf16 dot products (ROFORMER_TEST_CPU_BF16=0) is refused
#     with an error naming run.precision, before any step.
# Usage: precision_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[[ -n "${KEEP:-}" ]] && trap - EXIT && echo "work: $work"

cat > "$work/mini.yaml" <<YAML
run: {name: mini, dir: $work/run, seed: 7, threads: 2}
model:
  vocab_size: 30522
  hidden_size: 64
  num_hidden_layers: 2
  num_attention_heads: 2
  intermediate_size: 128
  max_position_embeddings: 128
data:
  vocab: $src/tests/fixtures/bert-base-uncased-vocab.txt
  inputs: ["$src/tests/fixtures/corpus/*/*.txt"]
  shard_dir: $work/shards
  validation_fraction: 0.2
optim: {lr: 1.0e-3, warmup_steps: 3}
stages:
  - {max_seq_len: 64, batch_size: 8, micro_batch_size: 4, steps: 8}
checkpoint: {every_steps: 4, keep_last: 2}
log: {every_steps: 1, eval_every_steps: 8, eval_batches: 2, progress: never}
YAML

"$roformer" prepare --config "$work/mini.yaml" >/dev/null
export ROFORMER_TEST_CPU_BF16=1  # the resume checks run whatever this CPU has

losses() { sed -n 's/.*"global_step":\([0-9]*\),.*"last_step_loss":"\([^"]*\)".*/\1 \2/p' "$1"; }

# Runs straight in precision $1 into $work/straight-$1.
straight() {
  "$roformer" pretrain --config "$work/mini.yaml" run.dir="$work/straight-$1" run.precision="$1" \
    > "$work/straight-$1.out" 2>&1 || { cat "$work/straight-$1.out"; exit 1; }
  losses "$work/straight-$1/metrics.jsonl" > "$work/straight-$1.txt"
  [[ $(wc -l < "$work/straight-$1.txt") -eq 8 ]] || { echo "$1: expected 8 steps"; exit 1; }
}
straight f32
straight bf16
grep -q "run.precision bf16" "$work/straight-bf16.out" || { echo "bf16 run did not say so"; exit 1; }
if cmp -s "$work/straight-f32.txt" "$work/straight-bf16.txt"; then
  echo "bf16 and f32 runs gave identical losses: bf16 did not run"; exit 1
fi

# Starts in precision $1, is killed before step 6 (checkpoint at 4), resumes in $2;
# steps 5..8 must be within 0.2% of the straight run in $2 (bf16 and f32 differ by
# ~1e-5 relative here; a run that ignored the checkpoint would be ~2% off).
switch() {
  local dir="$work/switch-$1-$2"
  set +e
  ROFORMER_TEST_KILL_AT_STEP=6 "$roformer" pretrain --config "$work/mini.yaml" run.dir="$dir" \
    run.precision="$1" >/dev/null 2>&1
  local killed=$?
  set -e
  [[ $killed -eq 137 ]] || { echo "$1 -> $2: expected SIGKILL, got $killed"; exit 1; }
  "$roformer" pretrain --config "$work/mini.yaml" run.dir="$dir" run.precision="$2" \
    > "$dir.out" 2>&1 || { echo "$1 -> $2: resume failed"; cat "$dir.out"; exit 1; }
  grep -qi "resum" "$dir.out" || { echo "$1 -> $2: did not resume"; cat "$dir.out"; exit 1; }
  # The last entry of each step (steps after the checkpoint ran twice).
  losses "$dir/metrics.jsonl" | awk '$1 >= 5 { l[$1] = $2 } END { for (s in l) print s, l[s] }' |
    sort -n > "$dir.txt"
  [[ $(wc -l < "$dir.txt") -eq 4 ]] || { echo "$1 -> $2: expected steps 5..8"; cat "$dir.txt"; exit 1; }
  while read -r step loss; do
    want=$(awk -v s="$step" '$1 == s {print $2}' "$work/straight-$2.txt")
    awk -v a="$loss" -v b="$want" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.002 * b) }' ||
      { echo "$1 -> $2: step $step loss $loss, straight $2 run $want"; exit 1; }
  done < "$dir.txt"
  echo "$1 -> $2 resume: steps 5..8 within 0.2% of the straight $2 run"
}
switch f32 bf16
switch bf16 f32

# No bf16 dot products: refused, naming the key, before training.
set +e
ROFORMER_TEST_CPU_BF16=0 "$roformer" pretrain --config "$work/mini.yaml" run.dir="$work/nobf16" \
  run.precision=bf16 > "$work/nobf16.out" 2>&1
code=$?
set -e
[[ $code -ne 0 ]] || { echo "bf16 on a CPU without bf16 was accepted"; exit 1; }
grep -q "run.precision" "$work/nobf16.out" && grep -q "AVX512-BF16" "$work/nobf16.out" ||
  { echo "unclear refusal:"; cat "$work/nobf16.out"; exit 1; }
[[ ! -e "$work/nobf16/metrics.jsonl" ]] || { echo "refused run still trained"; exit 1; }
echo "precision test passed"
