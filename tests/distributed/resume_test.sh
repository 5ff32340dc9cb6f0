#!/usr/bin/env bash
# Resume across world sizes. A 2-rank run killed (every rank, SIGKILL) after
# its step-4 checkpoint resumes on 2 ranks bit-exactly, and on 1 rank with the
# same schedule and data order (losses within the equivalence tolerance); a
# 1-rank run killed the same way resumes on 2 ranks likewise.
# Usage: resume_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
ROFORMER=$1
SRC=$2
source "$SRC/tests/distributed/common.sh"
write_config

launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/straight" >/dev/null 2>&1
last_losses "$work/straight/metrics.jsonl" > "$work/straight.txt"
[[ $(wc -l < "$work/straight.txt") -eq 10 ]] || { echo "expected 10 steps"; exit 1; }

kill_then_resume same 2 2
cmp "$work/straight.txt" "$work/same.txt" ||
  { echo "resume on the same world size is not bit-exact"; diff "$work/straight.txt" "$work/same.txt"; exit 1; }
echo "2 -> 2: bit-exact"
kill_then_resume shrink 2 1
compare "$work/straight.txt" "$work/shrink.txt" 1e-5 "2 -> 1 ranks"
kill_then_resume grow 1 2
compare "$work/straight.txt" "$work/grow.txt" 1e-5 "1 -> 2 ranks"
