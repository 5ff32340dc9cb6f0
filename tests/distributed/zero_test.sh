#!/usr/bin/env bash
# ZeRO-1 (distributed.zero: 1) on 2 ranks. Losses are bit-identical to plain
# data parallelism (the update is element-wise, so sharding it changes no
# float operation); each rank's share of the AdamW moments is half of the
# whole (the reported bytes); a killed ZeRO-1 run resumes bit-exactly on 2
# ranks, and bit-exactly with ZeRO switched off or on; its checkpoint
# resumes on 1 rank without ZeRO, and a 1-rank
# checkpoint resumes on 2 ranks with ZeRO-1, both on the same schedule.
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
  # Half, up to one alignment unit (16 floats) of both moments.
  if (share != s[1] || share * 2 - whole < 0 || share * 2 - whole > 2 * 2 * 16 * 4) {
    print "rank 0 holds " share " bytes of moments, not half of " whole; exit 1 }
  if (r[1] <= 0 || r[2] <= 0) { print "no peak RSS for a rank"; exit 1 } }'
grep -q "memory per rank: .*AdamW moments .*ZeRO-1: 1/2" "$work/zero.log" ||
  { echo "no memory line in the log"; cat "$work/zero.log"; exit 1; }

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
