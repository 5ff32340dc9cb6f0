#!/usr/bin/env bash
# The RoFormer-base benchmark of issue 14 in one device call: ours
# (bench/gpu/mlm_step_bench) beside transformers' RoFormerForMaskedLM
# (bench/gpu/hf_roformer_bench.py: eager, torch.compile, SDPA if offered), then
# the attention-kernel table (bench/gpu/attention_table.sh, when it exists).
#
#   scripts/gpu_bench.sh build     here (no GPU needed): the sm_90 build of the
#                                  bench programs, packed into .gpu/bench/
#                                  (without it, the run takes .gpu/'s bundle:
#                                  scripts/gpu_session.sh packs them there)
#   scripts/gpu_bench.sh targets   the bench programs' CMake targets, one a line
#   scripts/gpu_bench.sh run       on the GPU machine, from the repository root
#   scripts/gpu_bench.sh dry       here, without a GPU: the same steps on the CPU
#                                  with a tiny model and short sequences, from
#                                  the build directory, to test this script
#   scripts/gpu_bench.sh profile   on the GPU machine: one bf16 step of ours at
#                                  PROFILE_SEQ (512) x PROFILE_BATCH (128) with
#                                  every op synchronised (mlm_step_bench
#                                  --profile): synchronised ms per op, in
#                                  $OUT/profile.txt; then the same at
#                                  PROFILE_LONG_SEQ (1536) x
#                                  PROFILE_LONG_BATCH (42: about as many
#                                  tokens) at PROFILE_LONG_PRECISIONS
#                                  (bf16,bf16-alternating), appended: where
#                                  the cost per token at 1536 goes, op by op
#                                  (PROFILE_LONG_SEQ= skips it); then the step's matrix
#                                  products one by one (mlm_step_bench
#                                  --gemm-report: every algorithm cuBLASLt
#                                  offers for each, at the same shape) beside
#                                  PyTorch's (bench/gpu/gemm_peer_torch.py),
#                                  in $OUT/gemm_report.txt and gemm.jsonl
#                                  (not with GEMM_REPORT=0); then ncu on the flash
#                                  kernels at 1536 ($OUT/flash_ncu.txt; not
#                                  with PROFILE_KERNELS=0)
#   scripts/gpu_bench.sh gemm      on the GPU machine: only the gemm report
#   scripts/gpu_bench.sh kernels   on the GPU machine: only that ncu step, at
#                                  PROFILE_ATTENTION_SEQ (1536), on the
#                                  kernels of the model's step
#                                  (attention_bench --once): per-kernel
#                                  counters and warp stalls, and the stall
#                                  samples per SASS instruction
#                                  ($OUT/flash_ncu_sass.csv.gz; all three
#                                  files also in flash_ncu.tar.gz); about a
#                                  minute
#
# The one device call (.gpu/ is ignored, so it must be carried):
#
#   run(command="scripts/gpu_bench.sh run", carry=[".gpu"], timeout_s=600)
#
# Steps, each under its own limit and all under GPU_BENCH_BUDGET seconds (510
# by default; the table gets 45 more). Ours and the peer alternate per
# sequence length, 512 first (the length of the targets), so drifts of the
# machine hit both alike and a budget cut loses the least important rows:
#   device         nvidia-smi, nvcc, torch and transformers versions
#   ours_S, hf_S   for S in BENCH_SEQS (512 1536 128; the peer only at those
#                  also in HF_SEQS, if set): bf16 (ours: f32 where
#                  the device refuses bf16), the largest micro-batch that fits
#                  (doubling search, out-of-memory errors caught, no doubling
#                  after a 3 s step), median of 5 steps after 2; the peer's
#                  head on the masked rows (HF_HEAD=full: every position), its
#                  set-ups in the order eager, sdpa, compile (the slowest to
#                  start last, so a time limit cuts only it)
#   attention      bench/gpu/attention_table.sh run, if present (after the
#                  first two lengths; at the lengths in ATTENTION_SEQS if set)
#   ours_bgrad     ours at 512 with the bias gradients summed inside the
#                  weight-gradient products (--precision bf16-bgrad, cuBLASLt's
#                  BGRADB): whether that setting should be on by default
#   ours_addgrad   ours at 512 with every gradient sum added by autograd in a
#                  pass of its own (--precision bf16-addgrad): what the
#                  products adding into the sums gained, side by side
#   ours_mmasync   ours at 512 with the attention forward and fused backward on
#                  mma.sync rather than wgmma (--precision bf16-mmasync; on
#                  compute capability 9.0, where wgmma is the default): what
#                  wgmma gains, side by side
#   ours_ropeinside ours at 512 with RoPE inside the attention kernels rather
#                  than q and k rotated once around the plain ones (the
#                  default, set_rotate_once; --precision bf16-ropeinside):
#                  what rotating once gains (at 1536 too until session 23,
#                  whose ours_bitsahead_1536 took that row's place: the
#                  default was settled there on session 20)
#   ours_gemmtimed ours at 512 with the products' cuBLASLt algorithms chosen
#                  by timing (run.gemm_algorithms: timed; --precision
#                  bf16-gemmtimed) rather than the heuristic's first answers:
#                  whether that choice should be the default (within the
#                  spread at 512 and 1536 on an H200, session 24, which
#                  ended ours_gemmtimed_1536)
#   ours_alternating ours at 512 with the fused backward's sweeps of the
#                  query tiles alternating in direction (--precision
#                  bf16-alternating, set_flash_backward_alternates_sweeps):
#                  whether that should be the default; ours_alternating_1536
#                  the same at 1536, right after ours_1536, where the sweeps
#                  outgrow the L2
#   ours_bitsinside ours at 512 with the attention dropout's keep bits drawn
#                  inside each forward rather than ahead by a kernel of their
#                  own (the default since session 24; --precision
#                  bf16-bitsinside): what drawing ahead gains, side by side;
#                  ours_bitsinside_1536 the same at 1536
#   ours_unfuseddrop ours at 512 with the hidden dropout as a pass of its own
#                  before each residual layer norm (--precision
#                  bf16-unfuseddrop): what the dropout inside the layer-norm
#                  kernels (the default) gains, side by side
#   ours_separate  ours at 512 with model.attention_kernel: separate (three
#                  products, rope kernels, then the plain attention kernels)
#                  against the default (one product read in place, q and k
#                  rotated once around the plain kernels inside that op):
#                  what the one product gains
#   ours_f32act    ours at 512 with bf16 activations off (--precision
#                  bf16-f32act): what bf16 activations gained, side by side
#   hf_full_512    the peer's stock forward (logits at every position), eager
#   ours_f32       ours in f32 at the lengths not yet measured in f32 (last)
#   summary        bench/gpu/bench_summary.py: the table
# What comes back in $OUT:
#   bench_summary.txt   the Markdown table for docs/performance/gpu-step.md (tokens/s,
#                       TFLOP/s, MFU, peak memory, ours / best peer per length,
#                       cost per token at 1536 over 512, our A/B rows over the
#                       default with a verdict, the targets)
#   summary.txt         one line per step
#   results.jsonl       every row, as the programs wrote them (MFU filled in)
#   logs.tar.gz         every step's log
#
# bench/gpu/attention_table.sh, written on another branch, is called as
#   ATTENTION_OUT=<dir> bash bench/gpu/attention_table.sh run|dry
# with the bundle's programs on PATH and PYTHON set; it prints its table on
# stdout (kept in bench_summary.txt) and exits 0, or 77 to skip. The build
# asks it `bash bench/gpu/attention_table.sh targets` for the CMake targets to
# pack (one per line).
set -uo pipefail
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_common.sh"
gpu_script_init "${BASH_SOURCE[0]}" "${1:-}"

mode=${1:-}
pack_dir=.gpu/bench
attention_script=bench/gpu/attention_table.sh
# scripts/gpu_session.sh packs the bench's programs into gpu_check's bundle
# (one copy of the libraries: the carry's 64 MiB): that one serves then.
[[ $mode != build && ! -f $pack_dir/bundle.tar.xz && -f .gpu/bundle.tar.xz ]] && pack_dir=.gpu

# The programs the bench runs (mlm_step_bench, and the attention table's).
bench_targets() {
  echo mlm_step_bench
  [[ -f $attention_script ]] && bash "$attention_script" targets 2> /dev/null | grep -v '^$'
  return 0
}

build() {
  local targets
  mapfile -t targets < <(bench_targets)
  gpu_build_and_pack "$pack_dir" "${targets[@]}"
  echo "gpu_bench: ${targets[*]} built for sm_90 and packed into $pack_dir/bundle.tar.xz; on the GPU machine:"
  echo '  run(command="scripts/gpu_bench.sh run", carry=[".gpu"], timeout_s=600)'
}

# --- the steps (each runs in its own bash: set -e is fine here) -------------------------

ours_step() {  # ours_step PRECISIONS SEQS [ARGS]: bf16 falls back to f32 where it is refused
  mlm_step_bench --device "$DEVICE" --size "$SIZE" --precision "$1" --seq "$2" \
    --json "$WORK/results.jsonl" $OURS_ARGS "${@:3}"
}

ours_f32_step() {  # ours_f32_step SEQS: the f32 rows the bf16 steps have not measured already
  set -e
  local todo
  todo=$($PYTHON - "$WORK/results.jsonl" "$1" <<'PY'
import json, os, sys
path, seqs = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
rows = [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
done = {r["seq"] for r in rows if r["setup"] == "ours f32" and r["status"] == "ok"}
print(",".join(str(s) for s in seqs if s not in done))
PY
  )
  [[ -n $todo ]] || { echo "f32 already measured at every length (bf16 was refused)"; exit 77; }
  ours_step f32 "$todo" --budget-s 25
}

hf_step() {  # hf_step SEQ [ARGS]
  $PYTHON bench/gpu/hf_roformer_bench.py --device "$DEVICE" --size "$SIZE" --seq "$1" \
    --setups "$HF_SETUPS" --head "$HF_HEAD" --json "$WORK/results.jsonl" $HF_ARGS "${@:2}"
}

attention_step() {
  [[ -f $attention_script ]] || { echo "$attention_script is not in this tree"; exit 77; }
  mkdir -p "$WORK/attention"
  local rc=0
  # ATTENTION_SEQS (all four lengths by default) shortens the table for a short call.
  # shellcheck disable=SC2086
  ATTENTION_OUT=$WORK/attention bash "$attention_script" "$ATTENTION_MODE" ${ATTENTION_SEQS:-} |
    tee "$WORK/attention_table.txt" || rc=$?
  return $rc
}

summary_step() {
  set -e
  [[ -s $WORK/results.jsonl ]] || { echo "no results were written"; exit 1; }
  $PYTHON bench/gpu/bench_summary.py "$WORK/results.jsonl" \
    --flops-cmd "mlm_step_bench --size $SIZE --device $DEVICE" --out "$OUT/bench_summary.txt" \
    --reference-seq "$REFERENCE_SEQ" \
    --title "RoFormer-$SIZE MLM training step, $DEVICE_NAME, $(date -u '+%Y-%m-%d'), commit $COMMIT"
  cp "$WORK/results.jsonl.filled" "$OUT/results.jsonl"
  if [[ -s $WORK/attention_table.txt ]]; then
    { echo; echo "Attention kernels (bench/gpu/attention_table.sh):"; cat "$WORK/attention_table.txt"; } \
      >> "$OUT/bench_summary.txt"
  fi
}

run_bench() {
  local dry=${1:-}
  if [[ -z $dry ]]; then
    : "${OUT:?gpu_bench run: \$OUT (the device tool output folder) is not set}"
    gpu_unpack "$pack_dir"
    command -v mlm_step_bench > /dev/null || {
      echo "gpu_bench: no mlm_step_bench in $pack_dir's bundle: build with scripts/gpu_bench.sh build or scripts/gpu_session.sh build"
      exit 1
    }
    export DEVICE=cuda SIZE=base PYTHON=${PYTHON:-python3} ATTENTION_MODE=run
    export OURS_ARGS=${OURS_ARGS:-} HF_ARGS=${HF_ARGS:-}
    BENCH_SEQS=${BENCH_SEQS:-512 1536 128}
    export REFERENCE_SEQ=512 LONG_SEQ=1536
    export HF_SETUPS=${HF_SETUPS:-eager,sdpa,compile}
  else
    # Here: the CPU, a tiny model, short sequences and small micro-batches; the
    # memory cap and the simulated out-of-memory errors make both searches back off.
    export OUT=${OUT:-/tmp/gpu_bench_dry/out}
    rm -rf "$OUT" && mkdir -p "$OUT"
    gpu_dry_path
    export DEVICE=cpu SIZE=tiny PYTHON=${PYTHON:-$(gpu_dry_python)} ATTENTION_MODE=dry
    local common="--steps 2 --warmup 1 --threads 2 --max-tokens 2048 --start-batch 4"
    export OURS_ARGS=${OURS_ARGS:-"$common --memory-cap-mb 20"}
    export HF_ARGS=${HF_ARGS:-"$common --simulate-oom-tokens 1024"}
    # Without transformers here, the harness runs on the plain-PyTorch stand-in.
    $PYTHON -c 'import transformers' 2>/dev/null || HF_ARGS+=" --model standin"
    BENCH_SEQS=${BENCH_SEQS:-64 128 32}
    export REFERENCE_SEQ=64 LONG_SEQ=128
    export HF_SETUPS=${HF_SETUPS:-eager,sdpa,compile}
  fi
  export HF_HEAD=${HF_HEAD:-masked}
  export WORK=${GPU_BENCH_WORK:-/tmp/gpu_bench}
  export BUDGET=${GPU_BENCH_BUDGET:-510} ROOT SUMMARY=summary.txt
  export COMMIT DEVICE_NAME
  COMMIT=$(git describe --always --dirty 2>/dev/null || echo '?')
  DEVICE_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  DEVICE_NAME=${DEVICE_NAME:-$(hostname) CPU}
  rm -rf "$WORK" && mkdir -p "$WORK"
  : > "$OUT/summary.txt"
  summary "gpu_bench $COMMIT on $DEVICE_NAME, $(date -u '+%Y-%m-%d %H:%M UTC')"
  step device 30 device_info
  local seq n=0
  for seq in $BENCH_SEQS; do
    ((n++ == 2)) && step attention 150 attention_step
    step "ours_$seq" 60 ours_step bf16 "$seq" --f32-if-refused --budget-s 45
    # The A/B rows of the long length (the target of the cost per token),
    # before the attention table can spend the budget: the backward's sweeps
    # alternating (new in session 24) and the keep bits drawn inside the
    # forward (the default until session 24), where attention weighs most.
    if [[ $seq == "$LONG_SEQ" ]]; then
      step "ours_alternating_$LONG_SEQ" 60 ours_step bf16-alternating "$LONG_SEQ" --budget-s 45
      step "ours_bitsinside_$LONG_SEQ" 60 ours_step bf16-bitsinside "$LONG_SEQ" --budget-s 45
    fi
    [[ " ${HF_SEQS:-$BENCH_SEQS} " == *" $seq "* ]] && step "hf_$seq" 120 hf_step "$seq"
  done
  ((n <= 2)) && step attention 150 attention_step
  seq=${BENCH_SEQS%% *}
  # Our A/B rows before the peer's stock forward (session 7 measured that one):
  # under a cut budget the rows that decide defaults come first.
  step ours_alternating 60 ours_step bf16-alternating "$REFERENCE_SEQ" --budget-s 45
  step ours_bitsinside 60 ours_step bf16-bitsinside "$REFERENCE_SEQ" --budget-s 45
  step ours_gemmtimed 60 ours_step bf16-gemmtimed "$REFERENCE_SEQ" --budget-s 45
  step ours_mmasync 60 ours_step bf16-mmasync "$REFERENCE_SEQ" --budget-s 45
  step ours_ropeinside 60 ours_step bf16-ropeinside "$REFERENCE_SEQ" --budget-s 45
  step ours_unfuseddrop 60 ours_step bf16-unfuseddrop "$REFERENCE_SEQ" --budget-s 45
  step ours_separate 60 ours_step bf16 "$REFERENCE_SEQ" --attention-kernel separate --budget-s 45
  step ours_bgrad 60 ours_step bf16-bgrad "$REFERENCE_SEQ" --budget-s 45
  step ours_addgrad 60 ours_step bf16-addgrad "$REFERENCE_SEQ" --budget-s 45
  step ours_f32act 60 ours_step bf16-f32act "$REFERENCE_SEQ" --budget-s 45
  step "hf_full_$seq" 60 hf_step "$seq" --setups eager --head full
  step ours_f32 100 ours_f32_step "${BENCH_SEQS// /,}"
  # The table is written whatever the budget left: it only reads the results.
  BUDGET=$((BUDGET + 45)) step summary 30 summary_step
  [[ -f $OUT/bench_summary.txt ]] && cat "$OUT/bench_summary.txt"
  summary "gpu_bench: $failed step(s) failed in $((SECONDS - start_time)) s; logs in logs.tar.gz"
  pack_logs
  exit "$failed"
}

# Where a bf16 step's device time goes, op by op; then the flash kernels'
# hardware counters (bench/gpu/attention_table.sh kernels: ncu, when present).
run_profile() {
  : "${OUT:?gpu_bench profile: \$OUT (the device tool output folder) is not set}"
  gpu_unpack "$pack_dir"
  mlm_step_bench --device cuda --size base --precision "${PROFILE_PRECISIONS:-bf16,bf16-f32act}" \
    --seq "${PROFILE_SEQ:-512}" \
    --batch "${PROFILE_BATCH:-128}" --steps 3 --warmup 1 --profile | tee "$OUT/profile.txt"
  # The long length at about the same tokens a step: the cost per token at
  # 1536 over 512 (issue 14's target), op by op.
  if [[ -n ${PROFILE_LONG_SEQ-1536} ]]; then
    mlm_step_bench --device cuda --size base \
      --precision "${PROFILE_LONG_PRECISIONS:-bf16,bf16-alternating}" --seq "${PROFILE_LONG_SEQ-1536}" \
      --batch "${PROFILE_LONG_BATCH:-42}" --steps 3 --warmup 1 --profile |
      tee -a "$OUT/profile.txt" || echo "gpu_bench profile: the long length's profile failed (above)"
  fi
  if [[ ${GEMM_REPORT:-1} != 0 ]]; then
    gemm_report || echo "gpu_bench profile: the gemm report failed (above)"
  fi
  # PROFILE_KERNELS=0 (scripts/gpu_session.sh): the op table only, no Nsight counters.
  [[ ${PROFILE_KERNELS:-1} == 0 ]] && return
  run_kernels || echo "gpu_bench profile: the kernel counters failed (above)"
}

# One bf16 step's cuBLASLt products, each timed with every algorithm the
# heuristic offers, then the same products in PyTorch beside them: what the
# products could gain from another algorithm, and how cuBLASLt through us
# compares with PyTorch's calls ($OUT/gemm_report.txt).
gemm_report() {
  : "${OUT:?gpu_bench gemm: \$OUT (the device tool output folder) is not set}"
  command -v mlm_step_bench > /dev/null || gpu_unpack "$pack_dir"
  rm -f "$OUT/gemm.jsonl"  # --json appends
  mlm_step_bench --device cuda --size base --precision bf16 --seq "${PROFILE_SEQ:-512}" \
    --batch "${PROFILE_BATCH:-128}" --steps 1 --warmup 1 --gemm-report \
    --json "$OUT/gemm.jsonl" | tee "$OUT/gemm_report.txt" || return 1
  ${PYTHON:-python3} bench/gpu/gemm_peer_torch.py "$OUT/gemm.jsonl" --device cuda |
    tee -a "$OUT/gemm_report.txt"
}

# The flash kernels' hardware counters alone (the bundle unpacked first),
# its readable files also in one flash_ncu.tar.gz (what scripts/gpu_session.sh
# brings back), packed whatever part of them ncu wrote.
run_kernels() {
  : "${OUT:?gpu_bench kernels: \$OUT (the device tool output folder) is not set}"
  command -v attention_bench > /dev/null || gpu_unpack "$pack_dir"
  [[ -f $attention_script ]] || { echo "$attention_script is not in this tree"; return 1; }
  local rc=0 f files=()
  # Under a part's budget (PART_SECONDS, scripts/gpu_session.sh), ncu is
  # stopped 15 s before it (a short one: halfway), so that what it wrote is
  # still packed.
  local part=${PART_SECONDS:-0}
  ((part > 0)) && : "${NCU_SECONDS:=$((part > 30 ? part - 15 : (part + 1) / 2))}"
  NCU_SECONDS=${NCU_SECONDS:-} ATTENTION_BENCH=attention_bench \
    bash "$attention_script" kernels "${PROFILE_ATTENTION_SEQ:-1536}" || rc=$?
  for f in flash_ncu.txt flash_ncu_sass.csv.gz flash_ncu_run.log; do
    [[ -f $OUT/$f ]] && files+=("$f")
  done
  ((${#files[@]})) && tar czf "$OUT/flash_ncu.tar.gz" -C "$OUT" "${files[@]}"
  return "$rc"
}

case $mode in
  build) build ;;
  targets) bench_targets ;;
  run) run_bench ;;
  profile) run_profile ;;
  kernels) run_kernels ;;
  gemm) gemm_report ;;
  dry) run_bench dry ;;
  __lib) ;;  # sourced by step(): the functions only
  *)
    gpu_usage "$0"
    exit 2
    ;;
esac
