#!/usr/bin/env bash
# Faults of one rank in a 2-rank run: killed with SIGKILL, failing with an
# error, or stopped (SIGSTOP: neither dead nor answering). Each time the other
# rank exits within 60 s, the launcher exits non-zero, and the output names
# the failed rank (a hang: the waiting rank's timeout says a peer hangs); the
# run then resumes. A global batch that does not split
# over the ranks is an error naming the stage and the numbers. SIGTERM to
# mpirun saves one checkpoint and stops every rank.
# Usage: faults_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
ROFORMER=$1
SRC=$2
source "$SRC/tests/distributed/common.sh"
write_config

# fault NAME VARIABLE EXPECTED_REGEX: rank 1 gets VARIABLE=5 (before global step 5).
fault() {
  local start=$SECONDS code=0
  launch 2 bash -c "[[ \$OMPI_COMM_WORLD_RANK == 1 ]] && export $2=5; exec \"\$0\" \"\$@\"" \
    "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/$1" >"$work/$1.log" 2>&1 || code=$?
  local took=$((SECONDS - start))
  echo "$1: exit $code after ${took}s"
  ((code != 0)) || { echo "$1: mpirun exited 0"; cat "$work/$1.log"; exit 1; }
  ((took < 60)) || { echo "$1: took ${took}s"; exit 1; }
  grep -Eq "$3" "$work/$1.log" || { echo "$1: no message naming rank 1"; cat "$work/$1.log"; exit 1; }
  # And the run resumes from its step-4 checkpoint to the end.
  launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/$1" >"$work/$1.resume.log" 2>&1 ||
    { cat "$work/$1.resume.log"; exit 1; }
  grep -q "resuming from .*ckpt-00000004.h5" "$work/$1.resume.log" ||
    { echo "$1: did not resume from step 4"; cat "$work/$1.resume.log"; exit 1; }
}

fault killed ROFORMER_TEST_KILL_AT_STEP "process rank 1 .*(signal 9|Killed)"
fault throws ROFORMER_TEST_FAIL_AT_STEP "rank 1 of 2 failed: injected failure"
# The stopped rank never answers: rank 0's collective times out (timeout_s 20).
fault hangs ROFORMER_TEST_HANG_AT_STEP "rank 0 of 2: .* did not complete within 20 s"

# A global batch of 9 does not split over 2 ranks.
code=0
launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/odd" stages.1.batch_size=9 \
  >"$work/odd.log" 2>&1 || code=$?
((code != 0)) || { echo "batch 9 over 2 ranks: exit 0"; exit 1; }
grep -q "stages\[1\]: batch_size 9 does not split over 2 ranks" "$work/odd.log" ||
  { echo "no error naming the stage and numbers"; cat "$work/odd.log"; exit 1; }
[[ ! -e $work/odd/checkpoints/ckpt-00000002.h5 ]] || { echo "trained before failing"; exit 1; }
# SIGTERM to the launcher: every rank finishes its step, rank 0 writes one
# checkpoint, every rank stops (mpirun forwards SIGTERM and kills 1 s later).
# (mpirun itself in the background, so $! is its PID.)
mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1 "$ROFORMER" pretrain --config "$work/dp.yaml" \
  "run.dir=$work/term" stages.0.steps=1000 \
  checkpoint.every_steps=0 >"$work/term.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q "global      3/" "$work/term.log" && break; sleep 0.1; done
kill -TERM $pid
wait $pid || true
for rank in 0 1; do
  grep -q "\[rank $rank/2\] \[warning\] stopped by signal 15 after global step" "$work/term.log" ||
    { echo "SIGTERM: rank $rank did not stop cleanly"; grep -v "step .*[|]" "$work/term.log"; exit 1; }
done
[[ $(ls "$work/term/checkpoints" | wc -l) -eq 1 ]] ||
  { echo "SIGTERM: expected one checkpoint"; ls "$work/term/checkpoints"; exit 1; }
echo "SIGTERM: one checkpoint ($(ls "$work/term/checkpoints")), every rank stopped"

echo "faults: every failure ends the run in time, names rank 1, and resumes"
