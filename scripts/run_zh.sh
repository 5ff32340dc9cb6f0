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

source scripts/run_common.sh
setup_and_build --zh

phase "fetch Chinese text"
scripts/fetch_data_zh.sh

phase "learn the vocab (jieba words + characters) and prepare shards"
vocab_size=$(config_value model vocab_size "$config" "$@")
$roformer prepare --config "$config" --build-vocab "$vocab_size" "$@"

phase "pretrain"
$roformer pretrain --config "$config" "$@"

phase "fill-mask with the pretrained model"
run_dir=$(config_value run dir "$config" "$@")
$roformer predict --checkpoint "$run_dir" --top-k 5 \
  --text "床前明月[MASK]，疑是地上霜。" \
  --text "举头望明月，低头思[MASK]。" \
  --text "春眠不觉晓，处处闻啼[MASK]。" \
  --text "我们在[MASK]上学习中文。"
