# Sourced by the end-to-end test scripts (tests/train/*.sh,
# tests/robustness/*.sh): the miniature pretraining config they share and
# helpers to read what a run logged. The caller sets SRC (the source tree)
# and work (its scratch directory) first.

# mini_config FILE [SECTION...]: writes the miniature config to FILE: a
# 1-layer, 16-wide model on the test corpus (tests/fixtures), one stage of
# 2 steps, a checkpoint and a log record every step. Each SECTION, a whole
# top-level entry in flow style ("model: {hidden_size: 32, ...}",
# "stages: [{...}, {...}]"), replaces the default entry of its key (or is
# added); the other entries keep their defaults.
mini_config() {
  local file=$1
  shift
  local -A entry=(
    [run]="{dir: $work/run, seed: 3, threads: 1}"
    [model]="{vocab_size: 30522, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32, max_position_embeddings: 64}"
    [data]="{vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt, inputs: [\"$SRC/tests/fixtures/corpus/*/*.txt\"], shard_dir: $work/shards, validation_fraction: 0.2}"
    [optim]="{lr: 1.0e-3}"
    [stages]="[{max_seq_len: 32, batch_size: 2, steps: 2}]"
    [checkpoint]="{every_steps: 1, keep_last: 3}"
    [log]="{every_steps: 1, eval_every_steps: 0, progress: never}"
  )
  local order=(run model data optim stages checkpoint log) arg key
  for arg in "$@"; do
    key=${arg%%:*}
    [[ -v "entry[$key]" ]] || order+=("$key")
    entry[$key]=${arg#*: }
  done
  for key in "${order[@]}"; do echo "$key: ${entry[$key]}"; done > "$file"
}

# losses METRICS_JSONL: "global_step loss" of every step record, the loss
# exactly as logged (the keys of a record are sorted by name).
losses() { sed -n 's/.*"global_step":\([0-9]*\),.*"last_step_loss":"\([^"]*\)".*/\1 \2/p' "$1"; }

# same_losses GOT WANT: every "step loss" line of GOT equals WANT's loss at
# that step, bit for bit; prints each mismatch and fails if there was one.
same_losses() {
  local step loss want bad=0
  while read -r step loss; do
    want=$(awk -v s="$step" '$1 == s {print $2}' "$2")
    [[ "$loss" == "$want" ]] || { echo "step $step: loss $loss, uninterrupted $want"; bad=1; }
  done < "$1"
  return $bad
}

# checkpoint_steps DIR: the global steps of the checkpoints in DIR, ascending.
checkpoint_steps() { ls "$1" | sed -n 's/^ckpt-0*\([0-9][0-9]*\).*\.h5$/\1/p' | sort -n | tr '\n' ' '; }

fail() {
  echo "FAIL: $*"
  exit 1
}
