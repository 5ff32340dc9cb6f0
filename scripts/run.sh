#!/usr/bin/env bash
# The README's main job: set up, build, fetch real English text and the
# bert-base-uncased vocabulary, prepare HDF5 shards, pretrain the tiny RoFormer
# on the CPU with its six-stage schedule, then show fill-mask predictions.
# Usage: scripts/run.sh [config] [key=value overrides...]
# Re-running resumes the run in runs/tiny (or starts fresh after `rm -rf runs/tiny`).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/tiny.yaml}
shift || true

phase() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

phase "set-up: Debian packages"
scripts/setup.sh

phase "build (Release)"
# CUDA kernels are only built where a GPU can run them; the test command
# always compiles them.
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=ON; fi
cmake -S . -B build-run -DCMAKE_BUILD_TYPE=Release -DROFORMER_WITH_CUDA=$cuda \
  -DROFORMER_BUILD_TESTS=OFF -DROFORMER_BUILD_BENCH=OFF >/dev/null
cmake --build build-run -j"$(nproc)" --target roformer
roformer=build-run/roformer

phase "fetch text and vocabulary"
scripts/fetch_data.sh

phase "prepare shards"
$roformer prepare --config "$config" "$@"

phase "pretrain"
$roformer pretrain --config "$config" "$@"

phase "fill-mask with the pretrained model"
run_dir=$($roformer config --config "$config" "$@" | awk '/^run:/{r=1; next} r && /^  dir:/{print $2; exit}')
$roformer predict --checkpoint "$run_dir" --top-k 5 \
  --text "the [MASK] of the union is strong." \
  --text "call me [MASK]." \
  --text "the whale swam into the [MASK]."

phase "training curves"
$roformer plot "$run_dir" --out "$run_dir/curves.svg"
echo "open $run_dir/curves.svg to see loss, accuracy and learning rate against tokens"
