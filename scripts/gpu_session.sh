#!/usr/bin/env bash
# A GPU session's whole check and benchmark in one device call. The machine
# is given back 30 s after a call, and each start costs about 35 s of the
# session's 15 minutes, so one call should do everything:
#
#   scripts/gpu_session.sh build     # here: one bundle (gpu_check's programs and gpu_bench's) into .gpu/
#   run(command="scripts/gpu_session.sh run", carry=[".gpu"], timeout_s=600)
#
# `run` runs, one after the other, each under its own budget:
#   1. scripts/gpu_check.sh run   CHECK_BUDGET seconds (230), the memcheck
#                                 suites MEMCHECK_SUITE_SECONDS each (60);
#   2. scripts/gpu_bench.sh run   BENCH_BUDGET seconds (280), at BENCH_SEQS
#                                 ('512 1536 128': issue 14 asks for all three;
#                                 128 after the attention table, ~10 s), the
#                                 peer at HF_SEQS (512) in
#                                 HF_SETUPS (eager,compile: compile reuses
#                                 eager's batch search);
#   3. scripts/gpu_bench.sh profile, the op-by-op profile of one step at
#                                 PROFILE_PRECISIONS (bf16,bf16-alternating:
#                                 the backward's sweeps alternating, op by
#                                 op), then at 1536 x 42 (the same two),
#                                 without the Nsight counters, if
#                                 SESSION_BUDGET (570 s, counted from the
#                                 start) leaves PROFILE_MIN seconds (60);
#   4. scripts/gpu_bench.sh kernels, Nsight Compute's counters on one launch
#                                 each of the model's attention kernels at
#                                 1536 (attention_bench --once: the plain
#                                 and the model's forward, the keep bits
#                                 kernel, the plain and the model's
#                                 backward, its sweeps upwards and
#                                 alternating), if the budget leaves
#                                 KERNELS_MIN seconds (60);
#   5. scripts/gpu_bench.sh gemm, the step's products timed one by one beside
#                                 PyTorch's, if the budget leaves GEMM_MIN
#                                 seconds (30).
# Other variables pass through to the scripts (GPU_STEPS, ATTENTION_SEQS, ...).
#
# What comes back in $OUT, at most 8 files (the device tool's limit):
#   summary.txt        each part's step lines, then the bench table
#   check.tar.gz       gpu_check's own output: its summary, its logs and the
#                      golden files transformers wrote on the machine where
#                      they differ from the committed ones (pack_check: the
#                      logs alone if that is over the tool's 16 MB)
#   results.jsonl      every bench row with its batch search
#   bench_logs.tar.gz  gpu_bench's step logs and bench_summary.txt (the bench
#                      table with issue 14's targets judged, also at the end
#                      of summary.txt)
#   profile.txt        the op-by-op profile (when it ran; as far as it got
#                      when the budget cut it)
#   flash_ncu.tar.gz   the kernels' counters: flash_ncu.txt (per kernel),
#                      flash_ncu_sass.csv.gz (stall samples per SASS
#                      instruction) and ncu's log (ncu is stopped 15 s
#                      before the budget, so what it wrote is packed)
#   gemm_report.txt    the products one by one, ours beside PyTorch's (likewise)
#   gemm.jsonl         the same with every candidate's time
# The exit status is the number of parts that failed.
#
# CHECK_SCRIPT and BENCH_SCRIPT replace the two scripts (the test's stand-ins:
# tests/bench/gpu_session_test.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh  # gpu_usage
check_script=${CHECK_SCRIPT:-scripts/gpu_check.sh}
bench_script=${BENCH_SCRIPT:-scripts/gpu_bench.sh}

# A part under what is left of the session's budget (run_session's start,
# parts and failed), if that is at least MIN seconds: `$bench_script MODE`
# with the VAR=VALUE settings and PART_SECONDS (its time limit, for a part
# that stops its own steps before it), its FILES copied back even when the
# budget cut it, and an ok / FAIL / skip line in summary.txt (a failure
# counted).
budgeted_part() {  # budgeted_part NAME MIN MODE "FILES" [VAR=VALUE...]
  local name=$1 min=$2 mode=$3 files=$4 dir=$parts/$3 rc=0 f
  shift 4
  local left=$((${SESSION_BUDGET:-570} - (SECONDS - start)))
  if ((left < min)); then
    echo "skip  $name: ${left} s left of the session's budget (needs $min)" >> "$OUT/summary.txt"
    return
  fi
  mkdir -p "$dir"
  env "$@" OUT="$dir" PART_SECONDS="$left" timeout "$left" bash "$bench_script" "$mode" \
    > "$dir/${mode}_out.txt" 2>&1 || rc=$?
  for f in $files; do
    [[ -f $dir/$f ]] && cp "$dir/$f" "$OUT/$f"
  done
  local first=$OUT/${files%% *} size
  if [[ ! -f $first ]]; then
    size="no ${first##*/}"
  elif [[ $first == *.gz ]]; then
    size="$(stat -c %s "$first") bytes"
  else
    size="$(wc -l < "$first") lines"
  fi
  if ((rc == 0)); then
    echo "ok    $name ($size)" >> "$OUT/summary.txt"
  else
    failed=$((failed + 1))
    { echo "FAIL  $name (exit $rc; 124: the budget): tail of its output"
      tail -5 "$dir/${mode}_out.txt"; } | sed '2,$s/^/      /' >> "$OUT/summary.txt"
  fi
}

# check.tar.gz from gpu_check's OUT folder, under the tool's 16 MB a file:
# the goldens transformers wrote only where they differ from the committed
# ones, and if the whole is still too large (session 20's was: its step logs
# were lost), the logs alone: summary, check_out.txt and the steps' *.log.
pack_check() {  # pack_check DIR
  local dir=$1 f excluded=()
  for f in "$dir"/*.h5; do
    [[ -f $f ]] && cmp -s "$f" "tests/fixtures/${f##*/}" && excluded+=(--exclude "${f##*/}")
  done
  tar czf "$OUT/check.tar.gz" -C "$dir" "${excluded[@]}" .
  ((${CHECK_TAR_LIMIT:-15000000} >= $(stat -c %s "$OUT/check.tar.gz"))) && return
  echo "gpu_session: check.tar.gz over the tool's limit: the logs alone" >> "$OUT/summary.txt"
  local logs=$dir/logs-only
  mkdir -p "$logs"
  tar xzf "$dir/logs.tar.gz" -C "$logs" --wildcards '*.log' 2> /dev/null
  cp "$dir"/summary.txt "$dir"/check_out.txt "$logs/" 2> /dev/null
  tar czf "$OUT/check.tar.gz" -C "$logs" .
}

run_session() {
  : "${OUT:?gpu_session run: \$OUT (the device tool output folder) is not set}"
  local start=$SECONDS failed=0 parts
  parts=$(mktemp -d "${TMPDIR:-/tmp}/gpu_session.XXXXXX")
  mkdir -p "$parts/check" "$parts/bench"
  : > "$OUT/summary.txt"

  OUT=$parts/check GPU_CHECK_BUDGET=${CHECK_BUDGET:-230} \
    MEMCHECK_SUITE_SECONDS=${MEMCHECK_SUITE_SECONDS:-60} \
    bash "$check_script" run > "$parts/check/check_out.txt" 2>&1 || failed=$((failed + 1))
  cat "$parts/check/summary.txt" >> "$OUT/summary.txt" 2> /dev/null ||
    echo "gpu_session: gpu_check wrote no summary (check_out.txt in check.tar.gz)" >> "$OUT/summary.txt"
  pack_check "$parts/check"

  OUT=$parts/bench GPU_BENCH_BUDGET=${BENCH_BUDGET:-280} BENCH_SEQS=${BENCH_SEQS:-512 1536 128} \
    HF_SEQS=${HF_SEQS:-512} HF_SETUPS=${HF_SETUPS:-eager,compile} \
    bash "$bench_script" run > "$parts/bench/bench_out.txt" 2>&1 || failed=$((failed + 1))
  cat "$parts/bench/summary.txt" >> "$OUT/summary.txt" 2> /dev/null ||
    echo "gpu_session: gpu_bench wrote no summary (bench_out.txt in bench_logs.tar.gz)" >> "$OUT/summary.txt"
  [[ -f $parts/bench/results.jsonl ]] && cp "$parts/bench/results.jsonl" "$OUT/"
  tar czf "$OUT/bench_logs.tar.gz" -C "$parts/bench" --exclude results.jsonl .

  budgeted_part profile "${PROFILE_MIN:-60}" profile profile.txt \
    PROFILE_PRECISIONS="${PROFILE_PRECISIONS:-bf16,bf16-alternating}" \
    PROFILE_KERNELS=0 GEMM_REPORT=0
  budgeted_part "kernel counters" "${KERNELS_MIN:-60}" kernels flash_ncu.tar.gz
  budgeted_part "gemm report" "${GEMM_MIN:-30}" gemm "gemm_report.txt gemm.jsonl"
  [[ -f $parts/bench/bench_summary.txt ]] && cat "$parts/bench/bench_summary.txt" >> "$OUT/summary.txt"
  echo "gpu_session: $failed part(s) failed in $((SECONDS - start)) s" >> "$OUT/summary.txt"
  cat "$OUT/summary.txt"  # the device tool shows the output's tail
  rm -rf "$parts"
  return "$failed"
}

case ${1:-} in
  build)
    # One bundle for both (one copy of the libraries: under the carry's 64
    # MiB), the bench's programs in gpu_check's; gpu_bench.sh takes that one
    # when it finds none of its own.
    bench_targets=$(bash "$bench_script" targets) || exit 1
    EXTRA_TARGETS="$(tr '\n' ' ' <<< "$bench_targets")" bash "$check_script" build || exit 1
    rm -rf .gpu/bench
    ;;
  run) run_session ;;
  *)
    gpu_usage "$0"
    exit 2
    ;;
esac
