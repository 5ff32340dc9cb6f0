#!/usr/bin/env bash
# The trainer's side of issue 17 (faults that lost data or misled):
#  1. during a non-finite streak no checkpoint is saved or pruned; the stop
#     names the last checkpoint before the streak, and its advice (resume with
#     a lower lr) works;
#  2. a run directory whose checkpoints all fail to load is refused, naming
#     each file and why, unless --restart (which keeps them as *.unreadable);
#  3. a second run on the same run directory is refused, naming the holder's PID;
#  4. the resume hint after SIGINT keeps the command-line overrides;
#  5. a refused resume names the model key that differs.
# Usage: trainer_faults_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
roformer=$1
SRC=$2
work=$(mktemp -d)
source "$SRC/tests/train/mini_run.sh"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

mini_config "$work/f.yaml" "run: {dir: $work/run, seed: 5, threads: 2}" \
  "model: {vocab_size: 30522, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 128}" \
  "optim: {lr: 1.0e-3, warmup_steps: 0, clip_grad_norm: 0, max_nonfinite_in_a_row: 3}" \
  "stages: [{max_seq_len: 32, batch_size: 4, steps: 4}, {max_seq_len: 32, batch_size: 4, steps: 20, lr: 1.0e+30}]" \
  "checkpoint: {every_steps: 3, keep_last: 1, keep_stage_ends: false}" \
  "log: {every_steps: 1, eval_every_steps: 0, eval_batches: 1, progress: never}"
"$roformer" prepare --config "$work/f.yaml" >/dev/null

# 1. Stage 2's lr of 1e30 diverges. The step-4 stage-end checkpoint is the
# last healthy one; every_steps=3 with keep_last=1 would have replaced it
# during the streak.
set +e
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/nan" > "$work/nan.out" 2>&1
code=$?
set -e
[[ $code -eq 1 ]] || { tail -5 "$work/nan.out"; fail "divergence: exit code $code (expected 1)"; }
grep -q "update skipped" "$work/nan.out" || { cat "$work/nan.out"; fail "divergence: no skipped step"; }
first_bad=$(sed -n 's/.*step \([0-9]*\): non-finite.*/\1/p' "$work/nan.out" | head -1)
left=$(checkpoint_steps "$work/nan/checkpoints")
for s in $left; do
  [[ $s -lt $first_bad ]] || fail "divergence: checkpoint at step $s written during the streak (from step $first_bad): $left"
done
named=$(sed -n 's/.*the last checkpoint before them is \(.*\.h5\): resume.*/\1/p' "$work/nan.out")
[[ -n $named && -f $named ]] || { cat "$work/nan.out"; fail "divergence: advice names no existing checkpoint"; }
grep -q "stages.1.lr=1e+29" "$work/nan.out" || { cat "$work/nan.out"; fail "divergence: advice names no lower lr"; }
"$roformer" inspect "$named" >/dev/null || fail "divergence: $named does not load"
# The advice works: the same command with a sane lr for the stage resumes
# from the named checkpoint and finishes.
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/nan" stages.1.lr=1e-3 > "$work/nan2.out" 2>&1 ||
  { tail -5 "$work/nan2.out"; fail "divergence: resuming with a lower lr failed"; }
grep -q "resuming from $named" "$work/nan2.out" || { head "$work/nan2.out"; fail "divergence: did not resume from $named"; }
echo "ok: a non-finite streak keeps the last checkpoint before it, and the advice works"

# 2. Every checkpoint unreadable: refuse without --restart.
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/bad" stages.1.lr=1e-3 stages.1.steps=2 >/dev/null 2>&1
for f in "$work/bad/checkpoints"/ckpt-*.h5; do head -c 100 "$f" > "$f.cut" && mv "$f.cut" "$f"; done
n_before=$(ls "$work/bad/checkpoints" | wc -l)
set +e
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/bad" stages.1.lr=1e-3 stages.1.steps=2 > "$work/bad.out" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$work/bad.out"; fail "unreadable checkpoints: exit code $code (expected 2)"; }
grep -q "none of the $n_before checkpoint(s)" "$work/bad.out" || { cat "$work/bad.out"; fail "unreadable: message"; }
for f in "$work/bad/checkpoints"/ckpt-*.h5; do
  grep -q "$(basename "$f")" "$work/bad.out" || fail "unreadable: $f not named"
done
grep -q -- "--restart" "$work/bad.out" || fail "unreadable: --restart not suggested"
[[ $(ls "$work/bad/checkpoints" | wc -l) -eq $n_before ]] || fail "unreadable: files changed"
"$roformer" pretrain --restart --config "$work/f.yaml" "run.dir=$work/bad" stages.1.lr=1e-3 stages.1.steps=2 > "$work/restart.out" 2>&1 ||
  { tail "$work/restart.out"; fail "--restart failed"; }
[[ $(ls "$work/bad/checkpoints"/*.unreadable | wc -l) -eq $n_before ]] || fail "--restart: old files not kept"
echo "ok: unreadable checkpoints are refused unless --restart, which keeps them"

# 3 and 4. A long run holds the lock; a second is refused with its PID; SIGINT
# then stops the first with a resume hint that keeps the overrides.
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/lock" stages.1.lr=1e-3 stages.1.steps=100000 \
  > "$work/lock.out" 2>&1 &
pid=$!
pids+=("$pid")
for _ in $(seq 1 300); do
  grep -q '"global_step":2,' "$work/lock/metrics.jsonl" 2>/dev/null && break
  sleep 0.1
done
set +e
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/lock" > "$work/second.out" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || { cat "$work/second.out"; fail "shared run dir: exit code $code (expected 2)"; }
grep -q "in use by another training run (process $pid" "$work/second.out" ||
  { cat "$work/second.out"; fail "shared run dir: holder's PID $pid not named"; }
echo "ok: a second run on the same run directory is refused with the holder's PID"
kill -INT "$pid"
wait "$pid" || fail "SIGINT: exit code $?"
grep -q "resume with: roformer pretrain --config $work/f.yaml run.dir=$work/lock stages.1.lr=1e-3 stages.1.steps=100000" \
  "$work/lock.out" || { tail -3 "$work/lock.out"; fail "SIGINT: resume hint lost the overrides"; }
echo "ok: the resume hint keeps the overrides"

# 5. A refused resume names the model key.
set +e
"$roformer" pretrain --config "$work/f.yaml" "run.dir=$work/lock" model.intermediate_size=128 > "$work/key.out" 2>&1
code=$?
set -e
[[ $code -eq 2 ]] || fail "changed model: exit code $code"
grep -q "model.intermediate_size: 64 in the checkpoint, 128 in the config" "$work/key.out" ||
  { cat "$work/key.out"; fail "changed model: key not named"; }
echo "ok: a refused resume names the model key that differs"
