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

source scripts/run_common.sh
setup_and_build

phase "fetch text and vocabulary"
scripts/fetch_data.sh

phase "prepare shards"
$roformer prepare --config "$config" "$@"

phase "pretrain"
$roformer pretrain --config "$config" "$@"

phase "fill-mask with the pretrained model"
run_dir=$(config_value run dir "$config" "$@")
$roformer predict --checkpoint "$run_dir" --top-k 5 \
  --text "the [MASK] of the union is strong." \
  --text "call me [MASK]." \
  --text "the whale swam into the [MASK]."

phase "training curves"
$roformer plot "$run_dir" --out "$run_dir/curves.svg"
echo "open $run_dir/curves.svg to see loss, accuracy and learning rate against tokens"
