#!/usr/bin/env bash
# bench/gpu/attention_table.sh kernels without a GPU: stand-ins for ncu and
# attention_bench on PATH record how they were called. Checks that the
# profiled run asks for the per-instruction stall samples (SourceCounters),
# exports the report, leaves the clocks alone and launches the kernels once;
# that both pages are read back from the report (the SASS page gzipped); that
# a run leaving no report fails naming it; and that no ncu skips. Also
# scripts/gpu_bench.sh kernels: the same step at 1536, packed into
# flash_ncu.tar.gz, ncu stopped before a part's budget (PART_SECONDS).
set -euo pipefail
script=$(cd "$(dirname "$0")" && pwd)/attention_table.sh
gpu_bench=$(cd "$(dirname "$0")/../.." && pwd)/scripts/gpu_bench.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/out"
cat > "$work/bin/attention_bench" <<'SH'
#!/usr/bin/env bash
echo "attention_bench $*" >> "$CALLS"
SH
# The stand-in ncu: a profiled run writes <export>.ncu-rep (unless NCU_FAIL)
# after running the program; --import prints a page named by --page.
cat > "$work/bin/ncu" <<'SH'
#!/usr/bin/env bash
echo "ncu $*" >> "$CALLS"
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --import) echo "page of ${args[i + 1]}: ${args[*]}"; exit 0 ;;
    --export) report=${args[i + 1]} ;;
    --once) "${args[i - 1]}" --once "${args[i + 1]}" ;;
  esac
done
[[ -n ${NCU_SLOW:-} ]] && sleep "$NCU_SLOW"
[[ -n ${NCU_FAIL:-} ]] && { echo "==ERROR== profiling failed" >&2; exit 9; }
echo report > "$report.ncu-rep"
SH
chmod +x "$work/bin/attention_bench" "$work/bin/ncu"
export CALLS=$work/calls PATH=$work/bin:$PATH ATTENTION_BENCH=attention_bench
fail() { echo "attention_kernels_test: $*" >&2; exit 1; }

OUT=$work/out bash "$script" kernels 512 > "$work/log" 2>&1 || fail "kernels failed: $(cat "$work/log")"
run=$(grep -- '--export' "$CALLS") || fail "no profiled run"
for want in '--clock-control none' '--section SourceCounters' '--section WarpStateStats' \
  "--export $work/out/flash_ncu" '--kernel-name regex:flash_' 'attention_bench --once 512'; do
  [[ $run == *"$want"* ]] || fail "the profiled run lacks '$want': $run"
done
grep -qx 'attention_bench --once 512' "$CALLS" || fail "the kernels were not launched once at 512"
grep -q -- "--page details" "$work/out/flash_ncu.txt" || fail "no details page"
sass=$(gzip -dc "$work/out/flash_ncu_sass.csv.gz")
[[ $sass == *"--page source --csv --print-source sass"* ]] || fail "no SASS page: $sass"
[[ $sass == *"flash_ncu.ncu-rep"* ]] || fail "the SASS page is not the report's: $sass"

# scripts/gpu_bench.sh kernels (what scripts/gpu_session.sh runs): the same
# step at 1536, its readable files also packed into flash_ncu.tar.gz.
rm -f "$work/out"/*
OUT=$work/out bash "$gpu_bench" kernels > "$work/log" 2>&1 ||
  fail "gpu_bench.sh kernels failed: $(cat "$work/log")"
grep -qx 'attention_bench --once 1536' "$CALLS" || fail "gpu_bench.sh kernels did not launch at 1536"
packed=$(tar tzf "$work/out/flash_ncu.tar.gz") || fail "no flash_ncu.tar.gz"
for f in flash_ncu.txt flash_ncu_sass.csv.gz flash_ncu_run.log; do
  grep -qx "$f" <<< "$packed" || fail "$f is not in flash_ncu.tar.gz: $packed"
done

# Under a part's budget (PART_SECONDS) ncu is stopped before it: a slow
# profile fails, and its log is still packed.
rm -f "$work/out"/* "$CALLS"
start=$SECONDS
if NCU_SLOW=20 PART_SECONDS=4 OUT=$work/out bash "$gpu_bench" \
  kernels > "$work/log" 2>&1; then
  fail "a profile past its part's budget passed"
fi
((SECONDS - start < 15)) || fail "ncu was not stopped before the part's budget"
tar tzf "$work/out/flash_ncu.tar.gz" | grep -x flash_ncu_run.log > /dev/null || fail "the cut profile's log was not packed"

# ncu failing before it writes a report: the step fails and says so.
rm -f "$work/out"/* "$CALLS"
if NCU_FAIL=1 OUT=$work/out bash "$script" kernels > "$work/log" 2>&1; then
  fail "a run without a report passed"
fi
grep -q 'ncu wrote no report (exit 9)' "$work/log" || fail "no message: $(cat "$work/log")"
grep -q 'profiling failed' "$work/log" || fail "ncu's own error was not shown"

# A report an earlier run left is not taken for this run's.
echo stale > "$work/out/flash_ncu.ncu-rep"
if NCU_FAIL=1 OUT=$work/out bash "$script" kernels > "$work/log" 2>&1; then
  fail "a stale report passed for a failed run"
fi
grep -q 'ncu wrote no report' "$work/log" || fail "a stale report was read: $(cat "$work/log")"

# No ncu on the machine: skipped, saying so (where the system has none of its own).
rm "$work/bin/ncu"
if ! PATH=/usr/bin:/bin command -v ncu > /dev/null; then
  PATH=$work/bin:/usr/bin:/bin OUT=$work/out bash "$script" kernels > "$work/log" 2>&1 ||
    fail "no ncu should skip"
  grep -q 'no ncu on this machine' "$work/log" || fail "no skip message: $(cat "$work/log")"
fi
echo "attention_kernels_test: ok"
