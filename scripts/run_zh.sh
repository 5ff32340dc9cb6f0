#!/usr/bin/env bash
# The README's Chinese demo: set up, build, fetch Chinese text (npm
# chinese-poetry, Debian fortunes-zh), learn a jieba word + character vocab and
# prepare HDF5 shards, pretrain configs/tiny_zh.yaml on the CPU with its
# six-stage schedule, then fill in masked Chinese words.
# Usage: scripts/run_zh.sh [config] [key=value overrides...]
# Re-running resumes the run in runs/tiny_zh (or starts fresh after `rm -rf runs/tiny_zh`).
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/tiny_zh.yaml}
shift || true

phase() { printf '\n== %s (%s)\n' "$1" "$(date +%H:%M:%S)"; }

phase "set-up: Debian packages"
scripts/setup.sh --zh

phase "build (Release)"
cmake -S . -B build-run -DCMAKE_BUILD_TYPE=Release -DROFORMER_WITH_CUDA=OFF \
  -DROFORMER_BUILD_TESTS=OFF -DROFORMER_BUILD_BENCH=OFF >/dev/null
cmake --build build-run -j"$(nproc)" --target roformer
roformer=build-run/roformer

phase "fetch Chinese text"
scripts/fetch_data_zh.sh

phase "learn the vocab (jieba words + characters) and prepare shards"
vocab_size=$($roformer config --config "$config" "$@" | awk '/^model:/{m=1; next} m && /^  vocab_size:/{print $2; exit}')
$roformer prepare --config "$config" --build-vocab "$vocab_size" "$@"

phase "pretrain"
$roformer pretrain --config "$config" "$@"

phase "fill-mask with the pretrained model"
run_dir=$($roformer config --config "$config" "$@" | awk '/^run:/{r=1; next} r && /^  dir:/{print $2; exit}')
$roformer predict --checkpoint "$run_dir" --top-k 5 \
  --text "床前明月[MASK]，疑是地上霜。" \
  --text "举头望明月，低头思[MASK]。" \
  --text "春眠不觉晓，处处闻啼[MASK]。" \
  --text "我们在[MASK]上学习中文。"
