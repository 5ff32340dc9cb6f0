#!/usr/bin/env bash
# ZeRO-1 on one CPU machine: 2 MPI ranks x 1 thread with distributed.zero 0
# and 1, configs/tiny.yaml's first stage (128 x 32) for STEPS steps,
# alternated ROUNDS times so a drifting machine affects both alike. Prints
# each run's tokens/s (steady state: the first log window is dropped), the
# share of the step spent in the parameter all-gather (ZeRO-1 only), the
# AdamW moments' bytes per rank and each rank's peak RSS (metrics.jsonl).
# Figures: docs/performance.md, "ZeRO-1 on CPU".
# Usage: bench/zero_cpu.sh [ROFORMER_BINARY] [STEPS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
roformer=${1:-build/roformer}
steps=${2:-20}
rounds=${3:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--config configs/tiny.yaml "stages=[{max_seq_len: 128, batch_size: 32, steps: $steps}]"
      checkpoint.every_steps=0 log.every_steps=5 log.eval_every_steps=0 log.eval_batches=0
      log.progress=never run.threads=1)

# summary FILE: tokens/s and gather share (means over the train records
# after the first), the last record's moment bytes per rank and peak RSS per rank.
summary() {
  python3 -c "
import json
rows = [json.loads(l) for l in open('$1') if '\"train\"' in l]
steady = rows[1:] or rows
mean = lambda k: sum(r.get(k, 0) for r in steady) / len(steady)
share = sum(r.get('param_gather_s', 0) for r in steady) / max(sum(r['elapsed_s'] for r in steady[-1:]) - rows[0]['elapsed_s'], 1e-9)
print('%10.0f %12.2f%% %24s %20s' % (mean('tokens_per_s'), 100 * share,
      '/'.join('%.1f' % (b / 2**20) for b in rows[-1]['optimizer_state_bytes_per_rank']),
      '/'.join('%.0f' % m for m in rows[-1]['peak_rss_mb_per_rank'])))"
}

printf "%-5s %-8s %10s %13s %24s %20s\n" round zero tokens/s gather_share "moments MiB per rank" "peak RSS MB per rank"
for r in $(seq 1 "$rounds"); do
  for z in 0 1; do
    mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$roformer" pretrain "${args[@]}" \
      "distributed.zero=$z" "run.dir=$work/z$z-$r" >/dev/null 2>&1
    printf "%-5s %-8s %s\n" "$r" "$z" "$(summary "$work/z$z-$r/metrics.jsonl")"
  done
done
