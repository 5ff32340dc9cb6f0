#!/usr/bin/env bash
# End-to-end checks of `roformer pretrain` beyond exact resume:
#  1. the paper's config (configs/roformer_base_paper.yaml) runs every one of
#     its six stages for one step at a reduced model size, via overrides only;
#  2. SIGTERM finishes the step, writes a checkpoint and exits 0 with a hint;
#  3. resuming with a different model shape is refused with a message;
#  4. a run whose loss goes non-finite skips those updates, then stops with a
#     clear message after optim.max_nonfinite_in_a_row, saving no NaN;
#  5. predict (text and --json) and inspect work on the result.
# Usage: pretrain_cli_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
SRC=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$SRC/tests/train/mini_run.sh"

small=(run.device=cpu run.precision=f32 run.threads=2 model.vocab_size=30522 model.hidden_size=32
  model.num_hidden_layers=1 model.num_attention_heads=2 model.intermediate_size=64
  "data.vocab=$SRC/tests/fixtures/bert-base-uncased-vocab.txt"
  "data.inputs=[\"$SRC/tests/fixtures/corpus/*/*.txt\"]" "data.shard_dir=$work/shards"
  data.validation_fraction=0.2 log.progress=never log.eval_batches=1)

# 1. The paper's schedule, one step per stage.
paper=("${small[@]}" "run.dir=$work/paper")
for i in 0 1 2 3 4 5; do paper+=("stages.$i.steps=1" "stages.$i.batch_size=2" "stages.$i.micro_batch_size=1"); done
"$roformer" prepare --config "$SRC/configs/roformer_base_paper.yaml" "${paper[@]}" >/dev/null
"$roformer" pretrain --config "$SRC/configs/roformer_base_paper.yaml" "${paper[@]}" > "$work/paper.out" 2>&1 ||
  { cat "$work/paper.out"; fail "paper config at reduced size"; }
for len in 512 1536 256 128; do
  grep -q "max_seq_len $len" "$work/paper.out" || fail "stage at max_seq_len $len did not run"
done
[[ $(grep -c '"type":"stage"' "$work/paper/metrics.jsonl") -eq 6 ]] || fail "expected 6 stages"
echo "ok: the paper's six-stage config runs at reduced size"

# A tiny config for the rest.
mini_config "$work/t.yaml" "run: {dir: $work/run, seed: 3, threads: 2}" \
  "model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 128}" \
  "data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt, inputs: [\"$SRC/tests/fixtures/corpus/*/*.txt\"], shard_dir: $work/shards2, validation_fraction: 0.2}" \
  "stages: [{max_seq_len: 64, batch_size: 4, steps: 100000}]" "checkpoint: {every_steps: 0}"
"$roformer" prepare --config "$work/t.yaml" >/dev/null

# 2. SIGTERM: finish the step, checkpoint, exit 0.
"$roformer" pretrain --config "$work/t.yaml" > "$work/term.out" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  grep -q '"global_step":3,' "$work/run/metrics.jsonl" 2>/dev/null && break
  sleep 0.1
done
kill -TERM $pid
wait $pid || fail "SIGTERM: exit code $? (expected 0)"
grep -q "resume with" "$work/term.out" || fail "SIGTERM: no resume hint"
ls "$work/run/checkpoints"/ckpt-*.h5 >/dev/null || fail "SIGTERM: no checkpoint written"
echo "ok: SIGTERM writes a checkpoint and exits 0"

# 3. A different model shape on resume is refused.
set +e
"$roformer" pretrain --config "$work/t.yaml" model.hidden_size=64 > "$work/shape.out" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || fail "changed model: exit code $code (expected 2)"
# It names the key that differs (issue 17: it used to quote an unrelated line).
grep -q "model.hidden_size: 32 in the checkpoint, 64 in the config" "$work/shape.out" ||
  { cat "$work/shape.out"; fail "changed model: message"; }
echo "ok: resuming with another model shape is refused"

# 5. predict and inspect on the checkpoint.
"$roformer" predict --checkpoint "$work/run" --text "the [MASK] of the union" --top-k 3 > "$work/p.out"
grep -q "\[MASK\] at 2:" "$work/p.out" || { cat "$work/p.out"; fail "predict text"; }
"$roformer" predict --checkpoint "$work/run" --text "call me [MASK]." --json > "$work/p.json"
grep -q '"masks":\[{"index":3,"predictions":\[{"id":' "$work/p.json" || { cat "$work/p.json"; fail "predict --json"; }
"$roformer" inspect "$work/run" | grep "global step" > /dev/null || fail "inspect checkpoint"
echo "ok: predict and inspect"

# 4. Non-finite losses: skipped, then a clear stop.
set +e
"$roformer" pretrain --config "$work/t.yaml" "run.dir=$work/nan" optim.lr=1.0e+30 optim.clip_grad_norm=0 \
  optim.max_nonfinite_in_a_row=2 optim.warmup_steps=0 > "$work/nan.out" 2>&1
code=$?
set -e
[[ $code -eq 1 ]] || { tail -5 "$work/nan.out"; fail "non-finite: exit code $code (expected 1)"; }
grep -q "update skipped" "$work/nan.out" || fail "non-finite: no skipped-step warning"
grep -q "steps in a row had a non-finite loss or gradient" "$work/nan.out" || fail "non-finite: no stop message"
echo "ok: non-finite steps are skipped and stop the run"
