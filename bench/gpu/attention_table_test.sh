#!/usr/bin/env bash
# bench/gpu/attention_table.sh table on benchmark lines made up here: the
# table (a length a row lacks shows "-", an unavailable one "n/a"), issue
# 14's targets judged on our best row at S >= 1536, and the wgmma kernels'
# speed over mma.sync's on the model's path (ours-fused) at each length both
# were measured, the pipelined wgmma forward's over the in-step one, the
# backward at the default split count over the first rule's, and the
# rotated-once backward's over the plain one.
set -euo pipefail
script=$(cd "$(dirname "$0")" && pwd)/attention_table.sh
fail() { echo "attention_table_test: $*" >&2; exit 1; }
out=$(bash "$script" table <<'LINES'
attention impl=ours-fused S=512 B=64 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=105.2 bwd_tflops=57.6
attention impl=ours-fused S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=118.4 bwd_tflops=66.6
attention impl=ours-fused-wgmma S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=320.0 bwd_tflops=99.9
attention impl=ours-plain-wgmma S=512 unavailable: not compute capability 9.0
attention impl=ours-fused-wgmma-pipelined S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=352.0 bwd_tflops=99.9
attention impl=ours-fused-dropout-wgmma S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=100.0 bwd_tflops=90.0
attention impl=ours-fused-dropout-wgmma-pipelined S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=95.0 bwd_tflops=90.0
attention impl=ours-plain-dropout-wgmma S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=160.0 bwd_tflops=90.0
attention impl=ours-plain-dropout-wgmma-pipelined S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=164.0 bwd_tflops=90.0
attention impl=ours-once-dropout-wgmma S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=160.0 bwd_tflops=88.2
attention impl=cudnn-plain S=1536 B=21 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=404.2 bwd_tflops=341.1
attention splits S=4096 legacy=3 default=4
attention impl=ours-plain-wgmma S=4096 B=8 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=350.0 bwd_tflops=250.0
attention impl=ours-plain-wgmma-legacysplits S=4096 B=8 H=12 D=64 fwd_ms=1 bwd_ms=2 fwd_tflops=350.0 bwd_tflops=200.0
LINES
)
echo "$out"
grep -q '^ours-fused-wgmma *| *- *| *320.0 / 99.9 *| *- *$' <<< "$out" || fail "the wgmma row or its missing length"
grep -q '^ours-plain-wgmma *| *n/a / n/a *| *- *| *350.0 / 250.0 *$' <<< "$out" || fail "the unavailable row"
grep -qx 'target S=1536: forward 352.0 (ours-fused-wgmma-pipelined) >= 300 met; backward 99.9 (ours-fused-wgmma) >= 200 not met' \
  <<< "$out" || fail "the targets (judged on ours alone, not cuDNN)"
grep -qx 'wgmma / mma.sync S=1536 (ours-fused): forward 2.70x, backward 1.50x' <<< "$out" ||
  fail "the wgmma over mma.sync ratios"
! grep -q 'wgmma / mma.sync S=512' <<< "$out" || fail "a ratio where wgmma was not measured"
grep -qx 'pipelined / in step S=1536, forward: ours-fused-wgmma 1.10x, ours-fused-dropout-wgmma 0.95x, ours-plain-dropout-wgmma 1.02x' \
  <<< "$out" || fail "the pipelined forward's ratios (plain was not measured)"
! grep -q 'pipelined / in step S=512' <<< "$out" || fail "a pipelined ratio where none was measured"
grep -qx 'splits default / legacy S=4096 (legacy 3, default 4), backward: ours-plain-wgmma 1.25x' \
  <<< "$out" || fail "the split counts and their ratio"
! grep -q 'splits default / legacy S=1536' <<< "$out" || fail "a split ratio where none was measured"
grep -qx 'rotated once / plain S=1536 (dropout), backward: 0.98x' <<< "$out" ||
  fail "the rotated-once backward over the plain one"
! grep -q 'rotated once / plain S=4096' <<< "$out" || fail "a rotated-once ratio where none was measured"
echo "attention_table_test: ok"
