#!/usr/bin/env bash
# RoPE against the baseline: runs configs/tiny.yaml three times with the same
# steps and seed, changing only model.position (rope | absolute | none), then
# plots the validation curves (docs/position_ablation.svg) with
# scripts/plot_position_ablation.py. Assumes `scripts/run.sh` (or fetch +
# prepare) has been run once. Usage: scripts/compare_positions.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
roformer=${1:-build}/roformer
for position in rope absolute none; do
  dir=runs/ablation-$position
  if [[ -f $dir/checkpoints/done ]]; then continue; fi
  echo "== position: $position"
  "$roformer" pretrain --config configs/tiny.yaml model.position=$position run.dir=$dir \
    log.eval_every_steps=40 log.progress=never
  touch "$dir/checkpoints/done"
done
/usr/bin/python3 scripts/plot_position_ablation.py runs/ablation-{rope,absolute,none}/metrics.jsonl \
  --out docs/position_ablation.svg
