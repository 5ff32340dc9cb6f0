#!/usr/bin/env bash
# Data parallelism on one CPU machine: 2 MPI ranks x 1 thread against 1
# process x 2 threads, the same global batch (configs/tiny.yaml's first
# stage, 128 x 32) for STEPS steps, alternated ROUNDS times so a drifting
# machine affects both alike. Prints each run's tokens/s (steady state: the
# first log window is dropped) and, for the 2-rank runs, the share of the
# step the gradient all-reduce kept rank 0 waiting (metrics.jsonl's
# comm_share: communication not hidden behind backward, load imbalance
# included). Figures: docs/performance/distributed.md, "Data parallelism on CPU".
#
# With MODE zero: 2 ranks x 1 thread, plain (distributed.zero 0, gradients
# all-reduced), ZeRO-1 with its gradients reduce-scattered and ZeRO-1 with
# them all-reduced (distributed.reduce_scatter false) instead, printing
# tokens/s, the share of the step waiting for the gradient reduction
# (comm_share) and in ZeRO-1's parameter all-gather, the MiB each rank sends
# per step by the ring model (comm_bytes_per_step), the AdamW moments' MiB
# per rank and each rank's peak RSS (docs/performance/distributed.md, "ZeRO-1 on CPU").
# Usage: bench/distributed_cpu.sh [ROFORMER_BINARY] [STEPS] [ROUNDS] [MODE: threads|zero]
set -euo pipefail
cd "$(dirname "$0")/.."
roformer=${1:-build/roformer}
steps=${2:-30}
rounds=${3:-3}
mode=${4:-threads}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--config configs/tiny.yaml "stages=[{max_seq_len: 128, batch_size: 32, steps: $steps}]"
      checkpoint.every_steps=0 log.every_steps=5 log.eval_every_steps=0 log.eval_batches=0
      log.progress=never)

# mean of a metrics.jsonl key over the train records after the first
mean() {
  python3 -c "
import json, sys
rows = [json.loads(l) for l in open('$1') if '\"train\"' in l][1:]
print('%.4g' % (sum(r.get('$2', 0) for r in rows) / max(len(rows), 1)))"
}

if [[ $mode == zero ]]; then
  # summary FILE: tokens/s, reduction and gather shares (means over the train
  # records after the first), MiB sent per step, the last record's moment
  # bytes per rank and peak RSS per rank.
  summary() {
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l]
steady = rows[1:] or rows
tok_s = sum(r["tokens_per_s"] for r in steady) / len(steady)
span = max(steady[-1]["elapsed_s"] - rows[0]["elapsed_s"], 1e-9)
blocked = sum(r.get("comm_blocked_s", 0) for r in steady) / span
gather = sum(r.get("param_gather_s", 0) for r in steady) / span
print("%10.0f %10.2f%% %12.2f%% %10.2f %22s %20s" % (tok_s, 100 * blocked, 100 * gather,
      rows[-1]["comm_bytes_per_step"] / 2**20,
      "/".join("%.1f" % (b / 2**20) for b in rows[-1]["optimizer_state_bytes_per_rank"]),
      "/".join("%.0f" % m for m in rows[-1]["peak_rss_mb_per_rank"])))
PY
  }

  printf "%-5s %-16s %10s %11s %13s %10s %22s %20s\n" round run tokens/s comm_share gather_share \
    "MiB/step" "moments MiB per rank" "peak RSS MB per rank"
  for r in $(seq 1 "$rounds"); do
    for run in plain zero1_rs zero1_ar; do
      case $run in
        plain) over=(distributed.zero=0) ;;
        zero1_rs) over=(distributed.zero=1 distributed.reduce_scatter=true) ;;
        zero1_ar) over=(distributed.zero=1 distributed.reduce_scatter=false) ;;
      esac
      mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$roformer" pretrain "${args[@]}" \
        run.threads=1 "${over[@]}" "run.dir=$work/$run-$r" >/dev/null 2>&1
      printf "%-5s %-16s %s\n" "$r" "$run" "$(summary "$work/$run-$r/metrics.jsonl")"
    done
  done
  exit 0
fi

printf "%-5s %-22s %10s %10s\n" round run tokens/s comm_share
for r in $(seq 1 "$rounds"); do
  mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$roformer" pretrain "${args[@]}" \
    run.threads=1 "run.dir=$work/mpi$r" >/dev/null 2>&1
  OMP_NUM_THREADS=2 "$roformer" pretrain "${args[@]}" run.threads=2 "run.dir=$work/omp$r" \
    >/dev/null 2>&1
  printf "%-5s %-22s %10s %10s\n" "$r" "2 ranks x 1 thread" "$(mean "$work/mpi$r/metrics.jsonl" tokens_per_s)" \
    "$(mean "$work/mpi$r/metrics.jsonl" comm_share)"
  printf "%-5s %-22s %10s %10s\n" "$r" "1 rank x 2 threads" "$(mean "$work/omp$r/metrics.jsonl" tokens_per_s)" "-"
done
