# Shared by the distributed tests: the mpirun command line, a skip when
# mpirun or MPI support is absent, and a tiny pretraining config.
# Sourced with ROFORMER and SRC set.

command -v mpirun >/dev/null || { echo "SKIP: mpirun not found (apt-get install openmpi-bin)"; exit 77; }
"$ROFORMER" pretrain --help >/dev/null
# Root in containers and CI; two ranks on a two-core machine.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Quiet the "no high-speed network" notice of a machine without one.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1

# launch N ARGS...: ARGS run as N ranks, one thread each.
launch() {
  local n=$1
  shift
  mpirun -np "$n" --bind-to none -x OMP_NUM_THREADS=1 "$@"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A two-stage config of a 2-layer model with dropout on; global batch 8.
write_config() {
  cat > "$work/dp.yaml" <<YAML
run: {name: dp, dir: $work/run, seed: 11, threads: 1}
model:
  vocab_size: 30522
  hidden_size: 32
  num_hidden_layers: 2
  num_attention_heads: 2
  intermediate_size: 64
  max_position_embeddings: 128
  hidden_dropout_prob: 0.1
  attention_probs_dropout_prob: 0.1
data:
  vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt
  inputs: ["$SRC/tests/fixtures/corpus/*/*.txt"]
  shard_dir: $work/shards
  validation_fraction: 0.2
optim: {lr: 1.0e-3, warmup_steps: 2}
stages:
  - {max_seq_len: 64, batch_size: 8, steps: 6}
  - {max_seq_len: 32, batch_size: 8, steps: 4}
checkpoint: {every_steps: 2, keep_last: 0}
log: {every_steps: 1, eval_every_steps: 0, eval_batches: 4, progress: never}
distributed: {bucket_mb: 0.01, timeout_s: 20}
YAML
  "$ROFORMER" prepare --config "$work/dp.yaml" >/dev/null
}

# "global_step loss" per logged step of a metrics.jsonl.
losses() { sed -n 's/.*"global_step":\([0-9]*\),.*"last_step_loss":"\([^"]*\)".*/\1 \2/p' "$1"; }

# compare A B MAX_REL LABEL: every step's loss of two loss files within MAX_REL.
compare() {
  [[ $(wc -l < "$1") -eq $(wc -l < "$2") && $(wc -l < "$1") -gt 0 ]] ||
    { echo "$4: step counts differ"; cat "$1" "$2"; return 1; }
  paste "$1" "$2" | awk -v max="$3" -v label="$4" '
    { if ($1 != $3) { print label ": step mismatch " $1 " vs " $3; bad = 1; next }
      d = $2 - $4; if (d < 0) d = -d; rel = d / ($2 < 0 ? -$2 : $2); if (rel > worst) worst = rel
      if (rel > max) { printf "%s: step %d loss %.9g vs %.9g (rel %.2e > %g)\n", label, $1, $2, $4, rel, max; bad = 1 } }
    END { printf "%s: %d steps, largest relative difference %.2e\n", label, NR, worst; exit bad }'
}

# The newest logged loss of each step (a resumed run logs its rerun steps again).
last_losses() { losses "$1" | awk '{ l[$1] = $2 } END { for (s in l) print s, l[s] }' | sort -n; }

# kill_then_resume NAME FIRST_RANKS THEN_RANKS: a run of $work/dp.yaml killed
# (every rank, SIGKILL) before global step 5, after its step-4 checkpoint,
# then resumed to the end; its last losses go to $work/NAME.txt. The arrays
# first_args and then_args add overrides to each half.
first_args=()
then_args=()
kill_then_resume() {
  local dir=$work/$1
  local first=("$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$dir" "${first_args[@]}")
  local then=("$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$dir" "${then_args[@]}")
  if [[ $2 -eq 1 ]]; then
    ROFORMER_TEST_KILL_AT_STEP=5 "${first[@]}" >"$work/$1.first.log" 2>&1 &&
      { echo "$1: the killed run exited 0"; exit 1; }
  else
    launch "$2" -x ROFORMER_TEST_KILL_AT_STEP=5 "${first[@]}" >"$work/$1.first.log" 2>&1 &&
      { echo "$1: the killed run exited 0"; exit 1; }
  fi
  [[ -f $dir/checkpoints/ckpt-00000004.h5 ]] || { echo "$1: no step-4 checkpoint"; ls "$dir/checkpoints"; exit 1; }
  if [[ $3 -eq 1 ]]; then "${then[@]}" >"$work/$1.log" 2>&1; else launch "$3" "${then[@]}" >"$work/$1.log" 2>&1; fi ||
    { cat "$work/$1.log"; exit 1; }
  grep -q "resuming from .*ckpt-00000004.h5" "$work/$1.log" ||
    { echo "$1: did not resume from step 4"; cat "$work/$1.log"; exit 1; }
  last_losses "$dir/metrics.jsonl" > "$work/$1.txt"
}
