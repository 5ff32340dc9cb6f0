#!/usr/bin/env bash
# The attention-kernel table of issue 14: forward and backward TFLOP/s at head
# dim 64 in bf16 for S = 512, 1536, 4096, 16384 (B x S = 32768 tokens, 12
# heads), ours (bench/gpu/attention_bench.cpp: plain, RoPE inside, RoPE as
# separate kernels) and cuDNN's fused SDPA called directly (the same program:
# plain, and after our rope kernels as model.attention_kernel: cudnn_sdpa
# runs it) beside torch's scaled_dot_product_attention backends
# (bench/gpu/attention_bench_torch.py: flash, cuDNN, memory-efficient; flash
# and cuDNN also with dropout 0.1, beside our kernels with it) on the
# same GPU, in one run. FLOPs as FlashAttention counts them: forward
# 4 B H S^2 D, backward 2.5 x that.
#
#   bench/gpu/attention_table.sh build   here (no GPU needed): build attention_bench for
#                                        sm_90 into build-gpu/ (scripts/gpu_common.sh) and pack
#                                        it with gpu-pack into .gpu-attention/
#   bench/gpu/attention_table.sh run     on the GPU machine from the repository root:
#                                        both benchmarks, then the table (also written to
#                                        $OUT/attention_table.txt when $OUT is set)
#
# One device call: run(command="bench/gpu/attention_table.sh run", carry=[".gpu-attention"])
# A caller with its own bundle (scripts/gpu_bench.sh) may put attention_bench on PATH
# first (or set ATTENTION_BENCH); then .gpu-attention is not needed. Extra arguments
# after `run` are the lengths to measure. For that caller:
#   bench/gpu/attention_table.sh targets   the CMake targets to pack, one per line
#   bench/gpu/attention_table.sh dry       exits 77 (skip): the kernels need a GPU
#   ATTENTION_OUT=<dir>                     where attention_table.txt goes (else $OUT)
#   bench/gpu/attention_table.sh kernels [S] on the GPU machine: Nsight Compute (ncu) on one
#                                        launch each of the model's attention kernels and
#                                        their plain baselines (attention_bench --once) at
#                                        S (1536): speed of light, tensor-pipe use, shared
#                                        bank conflicts, occupancy, warp stalls, in
#                                        $OUT/flash_ncu.txt, and the stall samples per SASS
#                                        instruction in $OUT/flash_ncu_sass.csv.gz (what a
#                                        kernel change made without a GPU needs)
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-}
shift || true
pack_dir=.gpu-attention

# The sm_90 build and gpu-pack of scripts/gpu_common.sh (its build-gpu/).
build() {
  # shellcheck source=scripts/gpu_common.sh
  source scripts/gpu_common.sh
  gpu_build_and_pack "$pack_dir" attention_bench
  echo 'attention_table: packed; on the GPU machine:'
  echo '  run(command="bench/gpu/attention_table.sh run", carry=[".gpu-attention"])'
}

# The benchmark lines of both programs as one table, S by S.
table() {
  awk '
    /^attention impl=/ {
      impl = ""; S = ""; f = ""; b = ""; note = ""
      for (i = 2; i <= NF; ++i) {
        split($i, kv, "=")
        if (kv[1] == "impl") impl = kv[2]
        else if (kv[1] == "S") S = kv[2]
        else if (kv[1] == "fwd_tflops") f = kv[2]
        else if (kv[1] == "bwd_tflops") b = kv[2]
      }
      if ($0 ~ /unavailable/) { f = "n/a"; b = "n/a" }
      if (!(impl in seen)) { seen[impl] = 1; order[++n] = impl }
      if (!(S in seenS)) { seenS[S] = 1; lengths[++m] = S }
      fwd[impl, S] = f; bwd[impl, S] = b
    }
    /^attention splits / {
      for (i = 3; i <= NF; ++i) { split($i, kv, "="); splits[kv[1]] = kv[2] }
      split_line[splits["S"]] = "legacy " splits["legacy"] ", default " splits["default"]
    }
    END {
      printf "%-16s", "TFLOP/s fwd/bwd"
      for (j = 1; j <= m; ++j) printf " | %15s", "S=" lengths[j]
      printf "\n"
      for (i = 1; i <= n; ++i) {
        printf "%-16s", order[i]
        for (j = 1; j <= m; ++j) {
          key = order[i] SUBSEP lengths[j]
          cell = (key in fwd) ? fwd[key] " / " bwd[key] : "-"
          printf " | %15s", cell
        }
        printf "\n"
      }
      # Issue 14: forward >= 300 and backward >= 200 TFLOP/s at S >= 1536
      # (H100, bf16, head dim 64), our best implementation at each length.
      for (j = 1; j <= m; ++j) {
        if (lengths[j] + 0 < 1536) continue
        bf = -1; bb = -1
        for (i = 1; i <= n; ++i) {
          if (order[i] !~ /^ours-/) continue
          key = order[i] SUBSEP lengths[j]
          if (!(key in fwd) || fwd[key] == "n/a") continue
          if (fwd[key] + 0 > bf) { bf = fwd[key] + 0; fi_ = order[i] }
          if (bwd[key] + 0 > bb) { bb = bwd[key] + 0; bi_ = order[i] }
        }
        if (bf < 0) continue
        printf "target S=%s: forward %.1f (%s) >= 300 %s; backward %.1f (%s) >= 200 %s\n", \
          lengths[j], bf, fi_, (bf >= 300 ? "met" : "not met"), bb, bi_, (bb >= 200 ? "met" : "not met")
      }
      # The wgmma kernels against mma.sync at each length, with RoPE inside
      # (the path of the model until session 20, which rotates once around
      # the plain kernels): whether they should be the default on Hopper.
      for (j = 1; j <= m; ++j) {
        a = "ours-fused" SUBSEP lengths[j]; w = "ours-fused-wgmma" SUBSEP lengths[j]
        if (!(a in fwd) || !(w in fwd) || fwd[w] == "n/a" || fwd[a] + 0 <= 0 || bwd[a] + 0 <= 0) continue
        printf "wgmma / mma.sync S=%s (ours-fused): forward %.2fx, backward %.2fx\n", \
          lengths[j], fwd[w] / fwd[a], bwd[w] / bwd[a]
      }
      # The wgmma forward pipelined against in step, kernel by kernel: which
      # ones the default schedule should pipeline (set_flash_forward_schedule).
      split("ours-plain-wgmma ours-fused-wgmma ours-fused-dropout-wgmma ours-plain-dropout-wgmma", kinds, " ")
      for (j = 1; j <= m; ++j) {
        line = ""
        for (k = 1; k <= 4; ++k) {
          a = kinds[k] SUBSEP lengths[j]; w = kinds[k] "-pipelined" SUBSEP lengths[j]
          if (!(a in fwd) || !(w in fwd) || fwd[w] == "n/a" || fwd[a] + 0 <= 0) continue
          line = line sprintf("%s %s %.2fx", (line == "" ? "" : ","), kinds[k], fwd[w] / fwd[a])
        }
        if (line != "") printf "pipelined / in step S=%s, forward:%s\n", lengths[j], line
      }
      # The backward at the default split count over the first rule count
      # (flash_backward_splits.h), on the model path (plain, with and
      # without dropout): whether the time model chose well.
      for (j = 1; j <= m; ++j) {
        line = ""
        for (k = 1; k <= 2; ++k) {
          kind = (k == 1 ? "ours-plain-wgmma" : "ours-plain-dropout-wgmma")
          a = kind "-legacysplits" SUBSEP lengths[j]; w = kind SUBSEP lengths[j]
          if (!(a in bwd) || !(w in bwd) || bwd[a] == "n/a" || bwd[a] + 0 <= 0) continue
          line = line sprintf("%s %s %.2fx", (line == "" ? "" : ","), kind, bwd[w] / bwd[a])
        }
        if (line != "") printf "splits default / legacy S=%s (%s), backward:%s\n", lengths[j], split_line[lengths[j]], line
      }
      # The backward of the step since session 22 (q and k rotated once, the
      # kernel rotating dq and dk back as it writes them) over the plain
      # backward: what the rotation at the stores costs.
      for (j = 1; j <= m; ++j) {
        a = "ours-plain-dropout-wgmma" SUBSEP lengths[j]; w = "ours-once-dropout-wgmma" SUBSEP lengths[j]
        if (!(a in bwd) || !(w in bwd) || bwd[w] == "n/a" || bwd[a] + 0 <= 0) continue
        printf "rotated once / plain S=%s (dropout), backward: %.2fx\n", lengths[j], bwd[w] / bwd[a]
      }
      # The keep bits drawn ahead of the forward by a kernel of their own
      # over drawn inside it, each forward under its default schedule:
      # whether set_flash_keep_bits_ahead should be the default.
      for (j = 1; j <= m; ++j) {
        p = "ours-plain-dropout-wgmma-pipelined" SUBSEP lengths[j]; pa = "ours-plain-dropout-wgmma-bitsahead" SUBSEP lengths[j]
        f = "ours-fused-dropout-wgmma" SUBSEP lengths[j]; fa = "ours-fused-dropout-wgmma-bitsahead" SUBSEP lengths[j]
        if (!(p in fwd) || !(pa in fwd) || !(f in fwd) || !(fa in fwd) || fwd[pa] == "n/a" || fwd[p] + 0 <= 0 || fwd[f] + 0 <= 0) continue
        printf "bits ahead / inside S=%s, forward: plain pipelined %.2fx, RoPE inside in step %.2fx\n", \
          lengths[j], fwd[pa] / fwd[p], fwd[fa] / fwd[f]
      }
      # The fused backward sweeping its query tiles in alternating
      # directions over always upwards, the plain kernel and the model'"'"'s:
      # whether set_flash_backward_alternates_sweeps should be the default.
      for (j = 1; j <= m; ++j) {
        line = ""
        for (k = 1; k <= 2; ++k) {
          kind = (k == 1 ? "ours-plain-wgmma" : "ours-once-dropout-wgmma")
          a = kind "-upwards" SUBSEP lengths[j]; w = kind "-alternating" SUBSEP lengths[j]
          if (!(a in bwd) || !(w in bwd) || bwd[w] == "n/a" || bwd[a] + 0 <= 0) continue
          line = line sprintf("%s %s %.2fx", (line == "" ? "" : ","), kind, bwd[w] / bwd[a])
        }
        if (line != "") printf "sweeps alternating / upwards S=%s, backward:%s\n", lengths[j], line
      }
      # What dropout 0.1 costs each kernel, ours (the model'"'"'s forward, the
      # keep bits drawn ahead, over the same forward without dropout; the
      # plain backward with over without) beside torch'"'"'s backends.
      for (j = 1; j <= m; ++j) {
        fl = ""; bl = ""
        for (k = 1; k <= 3; ++k) {
          if (k == 1) { who = "ours"; d = "ours-plain-dropout-wgmma-bitsahead"; z = "ours-plain-wgmma-pipelined"; bd = "ours-plain-dropout-wgmma"; bz = "ours-plain-wgmma" }
          else { who = (k == 2 ? "torch-flash" : "torch-cudnn"); d = who "-dropout"; z = who; bd = d; bz = z }
          a = d SUBSEP lengths[j]; w = z SUBSEP lengths[j]
          if ((a in fwd) && (w in fwd) && fwd[a] != "n/a" && fwd[w] != "n/a" && fwd[w] + 0 > 0)
            fl = fl sprintf("%s %s %.2fx", (fl == "" ? "" : ","), who, fwd[a] / fwd[w])
          a = bd SUBSEP lengths[j]; w = bz SUBSEP lengths[j]
          if ((a in bwd) && (w in bwd) && bwd[a] != "n/a" && bwd[w] != "n/a" && bwd[w] + 0 > 0)
            bl = bl sprintf("%s %s %.2fx", (bl == "" ? "" : ","), who, bwd[a] / bwd[w])
        }
        if (fl == "" && bl == "") continue
        printf "dropout / none S=%s (speed), forward:%s; backward:%s\n", lengths[j], (fl == "" ? " -" : fl), (bl == "" ? " -" : bl)
      }
    }'
}

# Sets `bench` to the attention_bench to run: $ATTENTION_BENCH, one on the
# PATH, or the carried bundle's (unpacked here: it puts it on the PATH of
# this shell, so this runs in it, not in a subshell).
locate_bench() {
  bench=${ATTENTION_BENCH:-}
  if [[ -z $bench ]] && command -v attention_bench > /dev/null; then bench=attention_bench; fi
  if [[ -z $bench && -f $pack_dir/bundle.tar.xz ]]; then
    # shellcheck source=scripts/gpu_common.sh
    source scripts/gpu_common.sh
    # env.sh greps for missing libraries (no match: a failing pipeline), so not under -e.
    set +e
    gpu_unpack "$pack_dir"
    set -e
    bench=attention_bench
  fi
  [[ -n $bench ]] || { echo "attention_table: no attention_bench (run 'build' here and carry $pack_dir)" >&2; exit 1; }
}

run() {
  locate_bench
  local log
  log=$(mktemp)
  {
    echo "# attention kernels, bf16, head dim 64, 12 heads, B x S = 32768 tokens, no mask; dropout 0.1 in the rows that name it"
    echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  } | tee "$log"
  "$bench" "$@" 2>&1 | tee -a "$log"
  "${PYTHON:-python3}" bench/gpu/attention_bench_torch.py "$@" 2>&1 | tee -a "$log"
  echo
  table < "$log" | tee -a "$log"
  local out=${ATTENTION_OUT:-${OUT:-}}
  if [[ -n $out ]]; then cp "$log" "$out/attention_table.txt"; fi
  rm -f "$log"
}

# Where the flash kernels' time goes, by the hardware counters (ncu; leaves
# the clocks alone, as the device notes ask). Four files in $OUT:
#   flash_ncu.txt         per kernel: speed of light, tensor-pipe use, bank
#                         conflicts, occupancy, warp stall reasons
#   flash_ncu_sass.csv.gz per SASS instruction of each kernel: executions and
#                         the warp-stall samples by reason (SourceCounters),
#                         to read beside bench/gpu/sass_loops.sh's listing
#   flash_ncu.ncu-rep     the report itself (ncu-ui, or ncu --import)
#   flash_ncu_run.log     the profiled run's output (ncu's and the program's)
# The profiled run is the only step that needs the GPU; the two pages are
# read back from the report, so a page ncu cannot print loses only itself.
kernels() {
  locate_bench
  if ! command -v ncu > /dev/null; then
    echo "attention_table: no ncu on this machine: kernel counters skipped"
    return 0
  fi
  local out=${ATTENTION_OUT:-${OUT:-.}}
  local S=${1:-1536}
  local report=$out/flash_ncu rc=0
  rm -f "$report.ncu-rep"  # a report left by an earlier run must not pass for this one's
  timeout "${NCU_SECONDS:-240}" ncu --clock-control none --kernel-name regex:flash_ \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section SourceCounters \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum \
    --export "$report" --force-overwrite "$bench" --once "$S" > "$out/flash_ncu_run.log" 2>&1 ||
    rc=$?
  tail -20 "$out/flash_ncu_run.log"
  [[ -f $report.ncu-rep ]] || { echo "attention_table: ncu wrote no report (exit $rc)"; return 1; }
  ncu --import "$report.ncu-rep" --page details > "$out/flash_ncu.txt" 2>&1 ||
    echo "attention_table: ncu could not print the details page (see flash_ncu.txt)"
  ncu --import "$report.ncu-rep" --page source --csv --print-source sass 2>&1 |
    gzip > "$out/flash_ncu_sass.csv.gz" ||
    echo "attention_table: ncu could not print the SASS page"
  grep -E '^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Warp Cycles Per Issued|hmma|bank_conflicts|ldsm' \
    "$out/flash_ncu.txt" | head -80 || true
  return "$rc"
}

case $mode in
  build) build ;;
  run) run "$@" ;;
  kernels) kernels "$@" ;;
  targets) echo attention_bench ;;
  dry)
    echo "attention_table: the attention kernels need a GPU (dry run: skipped)"
    exit 77
    ;;
  table) table ;;  # the table of benchmark lines on stdin
  *)
    awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"  # the header above
    exit 2
    ;;
esac
