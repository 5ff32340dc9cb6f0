#!/usr/bin/env bash
# scripts/gpu_session.sh with stand-ins for gpu_check.sh and gpu_bench.sh (no
# GPU, no bundle): the parts run in order with their budgets and variables,
# everything comes back in at most 8 files, the goldens inside check.tar.gz
# where they differ from the committed ones (the logs alone when it would be
# over the device tool's limit),
# the profile, the kernel counters and then the gemm report run when the
# session's budget leaves room and are skipped when not, and a failed part is
# counted in the exit status.
set -euo pipefail
root=${1:?usage: gpu_session_test.sh SOURCE_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The stand-ins log what they were asked and write what the real ones write.
cat > "$work/check.sh" <<'SH'
echo "check $1 budget=$GPU_CHECK_BUDGET memcheck=$MEMCHECK_SUITE_SECONDS" >> "$LOG"
echo "ok    cuda_tests (1 s)" > "$OUT/summary.txt"
echo golden > "$OUT/roformer_mlm.h5"
cp tests/fixtures/golden_train10.h5 "$OUT/"  # the same as the committed one
mkdir -p "$OUT/w" && echo "[  FAILED  ] a test" > "$OUT/w/cuda_tests.log" && echo xml > "$OUT/w/t.xml"
tar czf "$OUT/logs.tar.gz" -C "$OUT/w" . && rm -rf "$OUT/w"
exit "${CHECK_RC:-0}"
SH
cat > "$work/bench.sh" <<'SH'
case $1 in
  run)
    echo "bench run budget=$GPU_BENCH_BUDGET seqs=$BENCH_SEQS hf=$HF_SEQS setups=$HF_SETUPS" >> "$LOG"
    echo "ok    ours_512 (5 s)" > "$OUT/summary.txt"
    echo "| 512 | ours bf16 |" > "$OUT/bench_summary.txt"
    echo '{"seq": 512}' > "$OUT/results.jsonl"
    echo logs > "$OUT/logs.tar.gz"
    sleep "${BENCH_SLEEP:-0}" ;;
  profile)
    echo "bench profile precisions=$PROFILE_PRECISIONS kernels=$PROFILE_KERNELS gemm=$GEMM_REPORT" >> "$LOG"
    printf 'op fwd\nlinear 1\n' > "$OUT/profile.txt"
    sleep "${PROFILE_SLEEP:-0}" ;;
  kernels)
    echo "bench kernels part=${PART_SECONDS:+set}" >> "$LOG"
    echo counters > "$OUT/flash_ncu.tar.gz"
    exit "${KERNELS_RC:-0}" ;;
  gemm)
    echo "bench gemm" >> "$LOG"
    echo "gemm report" > "$OUT/gemm_report.txt"
    echo '{"gemm_report": []}' > "$OUT/gemm.jsonl"
    exit "${GEMM_RC:-0}" ;;
esac
SH
run() {  # run NAME [VAR=VALUE...]: the session into $work/NAME, its status in $work/NAME.rc
  local name=$1
  shift
  mkdir -p "$work/$name"
  local rc=0
  env "$@" OUT="$work/$name" LOG="$work/$name.log" CHECK_SCRIPT="$work/check.sh" \
    BENCH_SCRIPT="$work/bench.sh" bash "$root/scripts/gpu_session.sh" run > /dev/null || rc=$?
  echo "$rc" > "$work/$name.rc"
}

run full
files=$(find "$work/full" -type f | wc -l)
((files <= 8)) || fail "$files files come back (at most 8)"
for f in summary.txt check.tar.gz results.jsonl bench_logs.tar.gz profile.txt flash_ncu.tar.gz \
  gemm_report.txt gemm.jsonl; do
  [[ -f $work/full/$f ]] || fail "no $f"
done
# The listing read whole first: grep -q ends early, and tar's SIGPIPE would
# fail the pipeline under pipefail.
listing=$(tar tzf "$work/full/check.tar.gz")
grep -q 'roformer_mlm.h5' <<< "$listing" || fail "the goldens are not in check.tar.gz"
! grep -q 'golden_train10.h5' <<< "$listing" || fail "a golden equal to the committed one came back"
grep -q 'check_out.txt' <<< "$listing" || fail "gpu_check's output is not in check.tar.gz"
tar tzf "$work/full/bench_logs.tar.gz" | grep 'bench_summary.txt' > /dev/null ||
  fail "the bench table is not in bench_logs.tar.gz"
# Over the limit: the steps' logs, the summary and check_out.txt alone.
run big CHECK_TAR_LIMIT=1
listing=$(tar tzf "$work/big/check.tar.gz")
grep -q 'cuda_tests.log' <<< "$listing" || fail "the step logs are not in the cut check.tar.gz"
grep -q 'check_out.txt' <<< "$listing" || fail "check_out.txt is not in the cut check.tar.gz"
! grep -q 'roformer_mlm.h5\|t.xml\|logs.tar.gz' <<< "$listing" || fail "the cut check.tar.gz holds more than logs"
grep -q 'over the tool.s limit: the logs alone' "$work/big/summary.txt" || fail "the cut is not said"
diff <(cat "$work/full.log") - <<'LOG' || fail "the parts or their variables"
check run budget=230 memcheck=60
bench run budget=280 seqs=512 1536 128 hf=512 setups=eager,compile
bench profile precisions=bf16,bf16-alternating kernels=0 gemm=0
bench kernels part=set
bench gemm
LOG
grep -q '^ok    cuda_tests' "$work/full/summary.txt" || fail "the check's steps in summary.txt"
grep -q '^ok    ours_512' "$work/full/summary.txt" || fail "the bench's steps in summary.txt"
grep -q '^ok    profile' "$work/full/summary.txt" || fail "the profile's line in summary.txt"
grep -q '^ok    kernel counters ([0-9]* bytes)' "$work/full/summary.txt" ||
  fail "the kernel counters' line in summary.txt"
grep -q '^ok    gemm report (1 lines)' "$work/full/summary.txt" || fail "the gemm report's line in summary.txt"
grep -q '^| 512 | ours bf16 |' "$work/full/summary.txt" || fail "the bench table in summary.txt"
[[ $(cat "$work/full.rc") == 0 ]] || fail "a clean session exits $(cat "$work/full.rc")"

# No room for the profile: skipped, and said so; a failed check is counted.
run short SESSION_BUDGET=2 BENCH_SLEEP=1 PROFILE_MIN=60 CHECK_RC=3 BENCH_SEQS=128 CHECK_BUDGET=9
[[ ! -f $work/short/profile.txt ]] || fail "the profile ran without the budget for it"
grep -q '^skip  profile' "$work/short/summary.txt" || fail "the skipped profile is not said"
grep -q '^skip  kernel counters' "$work/short/summary.txt" || fail "the skipped counters are not said"
grep -q '^skip  gemm report' "$work/short/summary.txt" || fail "the skipped gemm report is not said"
[[ ! -f $work/short/gemm_report.txt ]] || fail "the gemm report ran without the budget for it"
grep -q 'check run budget=9 ' "$work/short.log" || fail "CHECK_BUDGET is not passed on"
grep -q 'seqs=128 ' "$work/short.log" || fail "BENCH_SEQS is not passed on"
[[ $(cat "$work/short.rc") == 1 ]] || fail "one failed part exits $(cat "$work/short.rc"), not 1"
# A profile the budget cuts: what it wrote comes back, and the cut is counted.
run cut SESSION_BUDGET=8 PROFILE_MIN=1 PROFILE_SLEEP=30
[[ -f $work/cut/profile.txt ]] || fail "the cut profile's output did not come back"
grep -q '^FAIL  profile (exit 124' "$work/cut/summary.txt" || fail "the cut profile is not said"
[[ $(cat "$work/cut.rc") == 1 ]] || fail "a cut profile exits $(cat "$work/cut.rc"), not 1"
# Failed counters: counted, what they wrote comes back, and the gemm report
# still runs.
run kernelsfail KERNELS_RC=3
grep -q '^FAIL  kernel counters (exit 3' "$work/kernelsfail/summary.txt" || fail "failed counters are not said"
[[ -f $work/kernelsfail/flash_ncu.tar.gz ]] || fail "the failed counters' output did not come back"
grep -q '^ok    gemm report' "$work/kernelsfail/summary.txt" || fail "no gemm report after failed counters"
[[ $(cat "$work/kernelsfail.rc") == 1 ]] || fail "failed counters exit $(cat "$work/kernelsfail.rc"), not 1"
# A failed gemm report: counted, and what it wrote comes back.
run gemmfail GEMM_RC=2
grep -q '^FAIL  gemm report (exit 2' "$work/gemmfail/summary.txt" || fail "the failed gemm report is not said"
[[ -f $work/gemmfail/gemm.jsonl ]] || fail "the failed gemm report's output did not come back"
[[ $(cat "$work/gemmfail.rc") == 1 ]] || fail "a failed gemm report exits $(cat "$work/gemmfail.rc"), not 1"
echo "gpu_session_test: ok"
