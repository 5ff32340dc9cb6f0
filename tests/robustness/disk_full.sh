#!/usr/bin/env bash
# Disk full: pretraining on a small tmpfs that holds two checkpoints but not a
# third. The run must stop with a clear error (exit 1, "No space left on
# device"), not a crash, and the checkpoints written before must still load.
# Skips (exit 77) where mounting a tmpfs is not allowed.
# Usage: disk_full.sh ROFORMER_BINARY SOURCE_DIR
set -euo pipefail
R=$(realpath "$1")
SRC=$(realpath "$2")
work=$(mktemp -d)
mnt=$work/small
mkdir -p "$mnt"
cleanup() {
  umount "$mnt" 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
source "$SRC/tests/train/mini_run.sh"
if ! mount -t tmpfs -o size=16m tmpfs "$mnt" 2> /dev/null; then
  echo "SKIP: cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)"
  exit 77
fi

mini_config "$work/d.yaml" "run: {dir: $mnt/run, seed: 3, threads: 1}" \
  "data: {vocab: $SRC/tests/fixtures/bert-base-uncased-vocab.txt, inputs: [\"$SRC/tests/fixtures/corpus/moby-dick/chapter_1.txt\"], shard_dir: $work/shards, validation_fraction: 0.2}" \
  "stages: [{max_seq_len: 32, batch_size: 2, steps: 10}]" "checkpoint: {every_steps: 1, keep_last: 0}"
"$R" prepare --config "$work/d.yaml" > /dev/null 2>&1
set +e
"$R" pretrain --config "$work/d.yaml" > "$work/out.txt" 2>&1
code=$?
set -e
[[ $code -ge 128 ]] && { cat "$work/out.txt"; fail "pretrain crashed (signal $((code - 128)))"; }
[[ $code -eq 1 ]] || { cat "$work/out.txt"; fail "exit code $code, expected 1"; }
grep -q "No space left on device" "$work/out.txt" || { cat "$work/out.txt"; fail "the error does not say the disk is full"; }
grep -qE "internal error|terminate called" "$work/out.txt" && fail "internal error reported"
n=0
for f in "$mnt"/run/checkpoints/ckpt-*.h5; do
  [[ -e "$f" ]] || continue
  "$R" inspect "$f" > /dev/null 2>&1 || fail "checkpoint $f written before the disk filled does not load"
  n=$((n + 1))
done
((n >= 1)) || fail "no checkpoint survived"
ls "$mnt/run/checkpoints" | grep '\.tmp' > /dev/null && fail "a temporary checkpoint was left behind"
grep -qv '^{.*}$' "$mnt/run/metrics.jsonl" && fail "metrics.jsonl holds a partial line"
echo "disk full: clear error (exit 1), $n earlier checkpoint(s) intact, no temp file left"
