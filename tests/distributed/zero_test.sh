#!/usr/bin/env bash
# ZeRO-1 (distributed.zero: 1) on 2 ranks, its gradients reduce-scattered.
# Losses are bit-identical to plain data parallelism (two ranks' sums are the
# same one addition either way, the update is element-wise, and the norm adds
# the same chunk partials in the same order); with clipping on every step and
# a non-finite gradient that only rank 1 sees, the gradient norms are
# bit-identical too, every rank skips that step, and ZeRO-1 with an
# all-reduce instead (distributed.reduce_scatter: false) agrees as well.
# Each rank's share of the AdamW moments is half of the whole (the reported
# bytes); a killed ZeRO-1 run resumes bit-exactly on 2 ranks, and
# bit-exactly with ZeRO switched off or on; its checkpoint resumes on 1 rank
# without ZeRO, and a 1-rank checkpoint resumes on 2 ranks with ZeRO-1, both
# on the same schedule.
# Usage: zero_test.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
ROFORMER=$1
SRC=$2
source "$SRC/tests/distributed/common.sh"
write_config

# field FILE KEY: KEY's value in the last train record of a metrics.jsonl.
field() { grep '"type":"train"' "$1" | tail -1 | sed -n "s/.*\"$2\":\(\[[^]]*\]\|[^,}]*\).*/\1/p"; }

launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/plain" >"$work/plain.log" 2>&1 ||
  { cat "$work/plain.log"; exit 1; }
launch 2 "$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/zero" distributed.zero=1 \
  >"$work/zero.log" 2>&1 || { cat "$work/zero.log"; exit 1; }
last_losses "$work/plain/metrics.jsonl" > "$work/plain.txt"
last_losses "$work/zero/metrics.jsonl" > "$work/zero.txt"
[[ $(wc -l < "$work/zero.txt") -eq 10 ]] || { echo "expected 10 steps"; cat "$work/zero.txt"; exit 1; }
cmp "$work/plain.txt" "$work/zero.txt" ||
  { echo "ZeRO-1 and plain data parallelism differ"; paste "$work/plain.txt" "$work/zero.txt"; exit 1; }
echo "ZeRO-1 vs plain, 2 ranks: 10 steps, bit-identical losses"

# Memory per rank: the moments halve, parameters and gradients stay whole.
whole=$(field "$work/plain/metrics.jsonl" optimizer_state_bytes)
share=$(field "$work/zero/metrics.jsonl" optimizer_state_bytes)
shares=$(field "$work/zero/metrics.jsonl" optimizer_state_bytes_per_rank)
rss=$(field "$work/zero/metrics.jsonl" peak_rss_mb_per_rank)
echo "moments per rank: plain $whole bytes, ZeRO-1 $shares; peak RSS per rank (MB) $rss"
[[ $(field "$work/zero/metrics.jsonl" param_bytes) == $(field "$work/plain/metrics.jsonl" param_bytes) ]] ||
  { echo "parameter bytes changed with ZeRO-1"; exit 1; }
awk -v whole="$whole" -v share="$share" -v shares="$shares" -v rss="$rss" 'BEGIN {
  gsub(/[][]/, "", shares); n = split(shares, s, ",")
  gsub(/[][]/, "", rss); nr = split(rss, r, ",")
  if (n != 2 || nr != 2) { print "expected 2 ranks of bytes and RSS"; exit 1 }
  if (s[1] + s[2] != whole) { print "the shares do not add up to the whole moments"; exit 1 }
  # Half, up to one alignment unit (AdamW::kShardAlignment, 16384 floats) of both moments.
  if (share != s[1] || share * 2 - whole < 0 || share * 2 - whole > 2 * 2 * 16384 * 4) {
    print "rank 0 holds " share " bytes of moments, not half of " whole; exit 1 }
  if (r[1] <= 0 || r[2] <= 0) { print "no peak RSS for a rank"; exit 1 } }'
grep -q "memory per rank: .*AdamW moments .*ZeRO-1: 1/2" "$work/zero.log" ||
  { echo "no memory line in the log"; cat "$work/zero.log"; exit 1; }
grep -q "gradients: reduce-scatter in .*all-gather" "$work/zero.log" ||
  { echo "ZeRO-1 did not reduce-scatter"; cat "$work/zero.log"; exit 1; }
grep -q "gradients: all-reduce in" "$work/plain.log" || { echo "no all-reduce in plain"; exit 1; }
# The modelled traffic: reduce-scatter + all-gather send what one all-reduce does.
[[ $(field "$work/zero/metrics.jsonl" comm_bytes_per_step) == $(field "$work/plain/metrics.jsonl" comm_bytes_per_step) ]] ||
  { echo "ZeRO-1 should send as many bytes as plain data parallelism"; exit 1; }

# Clipping on every step (the norms are about 1.2 to 1.7) and a NaN in rank
# 1's summed gradient at global step 4 (after the reduction: rank 0 does not
# see it). steps NAME ARGS...: the run on 2 ranks, then per train record
# "global_step last_step_loss grad_norm grad_norm_clipped skipped_steps".
steps() {
  local name=$1
  shift
  local run=("$ROFORMER" pretrain --config "$work/dp.yaml" "run.dir=$work/$name"
    model.hidden_size=48 optim.clip_grad_norm=0.5 "$@")
  mpirun --bind-to none -x OMP_NUM_THREADS=1 -np 1 "${run[@]}" : \
    -np 1 env ROFORMER_TEST_NAN_GRADIENT_AT_STEP=3 "${run[@]}" >"$work/$name.log" 2>&1 ||
    { cat "$work/$name.log"; exit 1; }
  for rank in 0 1; do
    grep -q "\[rank $rank/2\] \[warning\] step 4: non-finite gradient.*update skipped" "$work/$name.log" ||
      { echo "$name: rank $rank did not skip step 4"; cat "$work/$name.log"; exit 1; }
  done
  python3 - "$work/$name/metrics.jsonl" >"$work/$name.steps" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "train":
        print(r["global_step"], r["last_step_loss"], repr(r["grad_norm"]),
              repr(r["grad_norm_clipped"]), r["skipped_steps"])
PY
}
steps clip_plain
# One bucket of the whole 5.6 MiB buffer (the runs above use 10 KiB buckets):
# the MPI communicator reduce-scatters it in 2 MiB pieces (2^19 floats), and
# with hidden size 48 the share bound falls inside a piece.
steps clip_zero distributed.zero=1 distributed.bucket_mb=25
grep -q "gradients: reduce-scatter in 1 bucket(s)" "$work/clip_zero.log" ||
  { echo "expected 1 bucket"; grep "gradients:" "$work/clip_zero.log"; exit 1; }
bound=$(field "$work/clip_zero/metrics.jsonl" optimizer_state_bytes)
(( bound / 8 % 524288 != 0 && bound / 8 > 524288 )) ||
  { echo "the share bound ($((bound / 8)) floats) does not fall inside a later piece"; exit 1; }
steps clip_zero_ar distributed.zero=1 distributed.reduce_scatter=false
[[ $(wc -l < "$work/clip_zero.steps") -eq 10 ]] || { echo "expected 10 steps"; cat "$work/clip_zero.steps"; exit 1; }
awk '$1 >= 4 && $5 != 1 { print "step " $1 ": " $5 " skipped steps, expected 1"; bad = 1 }
     $1 < 4 && $5 != 0 { print "step " $1 ": a step skipped before step 4"; bad = 1 }
     $1 != 4 && !($4 < $3) { print "step " $1 ": clipping did not engage"; bad = 1 }
     END { exit bad }' "$work/clip_zero.steps"
# The norm of a skipped step is NaN (logged null) where the NaN was summed
# into it (reduce-scatter); with the gradient whole on every rank, rank 0's
# own norm never saw rank 1's NaN.
awk '$1 != 4' "$work/clip_plain.steps" > "$work/clip_plain.finite"
awk '$1 != 4' "$work/clip_zero.steps" > "$work/clip_zero.finite"
cmp "$work/clip_plain.finite" "$work/clip_zero.finite" ||
  { echo "ZeRO-1 (reduce-scatter) and plain differ in losses or gradient norms";
    paste "$work/clip_plain.steps" "$work/clip_zero.steps"; exit 1; }
cmp <(cut -d' ' -f1,2 "$work/clip_plain.steps") <(cut -d' ' -f1,2 "$work/clip_zero.steps") ||
  { echo "the skipped step's loss differs"; exit 1; }
cmp "$work/clip_plain.steps" "$work/clip_zero_ar.steps" ||
  { echo "ZeRO-1 with an all-reduce and plain differ";
    paste "$work/clip_plain.steps" "$work/clip_zero_ar.steps"; exit 1; }
echo "clipped, one NaN step on rank 1: plain, ZeRO-1 reduce-scatter and all-reduce agree bit for bit"

# zero NAME FIRST_RANKS FIRST_ZERO THEN_RANKS THEN_ZERO: kill_then_resume with
# distributed.zero set for each half.
zero() {
  first_args=("distributed.zero=$3")
  then_args=("distributed.zero=$5")
  kill_then_resume "$1" "$2" "$4"
}

zero same 2 1 2 1
cmp "$work/zero.txt" "$work/same.txt" ||
  { echo "ZeRO-1 resume on 2 ranks is not bit-exact"; diff "$work/zero.txt" "$work/same.txt"; exit 1; }
echo "ZeRO-1 2 -> 2: bit-exact"
# ZeRO-1 changes no float operation, so switching it on or off on the same
# world size is bit-exact too: the gathered moments are exactly the whole ones.
zero unshard 2 1 2 0
cmp "$work/zero.txt" "$work/unshard.txt" ||
  { echo "ZeRO-1 -> plain on 2 ranks is not bit-exact"; diff "$work/zero.txt" "$work/unshard.txt"; exit 1; }
zero shard 2 0 2 1
cmp "$work/zero.txt" "$work/shard.txt" ||
  { echo "plain -> ZeRO-1 on 2 ranks is not bit-exact"; diff "$work/zero.txt" "$work/shard.txt"; exit 1; }
echo "2 ranks ZeRO-1 <-> plain: bit-exact"
zero shrink 2 1 1 0
compare "$work/zero.txt" "$work/shrink.txt" 1e-5 "ZeRO-1 2 ranks -> 1 rank"
zero grow 1 0 2 1
compare "$work/zero.txt" "$work/grow.txt" 1e-5 "1 rank -> 2 ranks ZeRO-1"
