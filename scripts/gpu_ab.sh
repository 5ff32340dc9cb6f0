#!/usr/bin/env bash
# A short device call for an A/B of kernel settings, when a session has too
# little device time left for scripts/gpu_session.sh (about 10 minutes):
#
#   scripts/gpu_session.sh build     # here, as for a whole session
#   run(command="scripts/gpu_ab.sh run", carry=[".gpu"], timeout_s=240)
#
# In order, each part's output in $OUT/ab.txt:
#   1. cuda_tests' flash attention cases and edges (AB_TESTS), which run
#      every kernel variant against the CPU;
#   2. attention_bench at ATTENTION_SEQS (1536 4096), ours and cuDNN's
#      (its lines in $OUT/attention.txt), and bench/gpu/attention_table.sh's
#      table of them;
#   3. mlm_step_bench at each of AB_SEQS ('512:256 1536:80', seq:batch, the
#      batches gpu_bench's search found on an H100; an H200 fits 85 at 1536)
#      with every
#      precision of AB_PRECISIONS in one process, AB_ROUNDS (2) times, so the
#      settings take turns; rows in $OUT/ab.jsonl, then bench_summary.py's
#      table of each over ours bf16 with its spread.
# The exit status is the number of parts that failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh  # gpu_unpack, gpu_usage

run_ab() {
  : "${OUT:?gpu_ab run: \$OUT (the device tool output folder) is not set}"
  local failed=0 log=$OUT/ab.txt pair seq batch round
  gpu_unpack .gpu > "$log" 2>&1 || { cat "$log"; return 1; }
  {
    echo "gpu_ab $(git rev-parse --short HEAD 2> /dev/null) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "== cuda_tests ${AB_TESTS:=Cases/FlashAttention.*:FlashAttentionEdges.*}"
  } >> "$log"
  cuda_tests --gtest_filter="$AB_TESTS" > "$OUT/cuda_tests.log" 2>&1 || failed=$((failed + 1))
  grep -E '^\[  (FAILED|PASSED|SKIPPED) |Failure|error' "$OUT/cuda_tests.log" >> "$log"
  echo "== attention table" >> "$log"
  # shellcheck disable=SC2086
  attention_bench ${ATTENTION_SEQS:-1536 4096} > "$OUT/attention.txt" 2>&1 || failed=$((failed + 1))
  bash bench/gpu/attention_table.sh table < "$OUT/attention.txt" >> "$log" 2>&1 ||
    failed=$((failed + 1))
  echo "== steps" >> "$log"
  for ((round = 1; round <= ${AB_ROUNDS:-2}; ++round)); do
    for pair in ${AB_SEQS:-512:256 1536:80}; do
      seq=${pair%%:*} batch=${pair##*:}
      mlm_step_bench --device cuda --size base --precision "${AB_PRECISIONS:-bf16,bf16-alternating}" \
        --seq "$seq" --batch "$batch" --steps "${AB_STEPS:-10}" --warmup 2 --json "$OUT/ab.jsonl" \
        >> "$log" 2>&1 || failed=$((failed + 1))
    done
  done
  python3 bench/gpu/bench_summary.py "$OUT/ab.jsonl" --flops-cmd "mlm_step_bench --size base --device cuda" \
    --out "$OUT/ab_summary.txt" >> "$log" 2>&1 || failed=$((failed + 1))
  echo "gpu_ab: $failed part(s) failed" >> "$log"
  tail -c 11000 "$log"  # the device tool shows the output's tail
  return "$failed"
}

case ${1:-} in
  run) run_ab ;;
  *)
    gpu_usage "$0"
    exit 2
    ;;
esac
