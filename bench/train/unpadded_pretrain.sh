#!/usr/bin/env bash
# Pretraining throughput with unpadded (token-stream) batches against padded
# ones, side by side: configs/tiny.yaml's first stage (seq 128, batch 32) for
# STEPS steps, the two modes alternating ROUNDS times (A B A B ...) so a
# drift in the machine's speed hits both. Prints each run's median
# tokens_per_s over its log windows (the first window, with warm-up, left
# out) and its packing efficiency, then the medians per mode.
# Usage: bench/train/unpadded_pretrain.sh OUT_DIR [STEPS] [ROUNDS] [-- OVERRIDES...]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1 steps=${2:-40} rounds=${3:-2}
shift 3 2>/dev/null || shift $#
[[ "${1:-}" == "--" ]] && shift
mkdir -p "$out"
for ((r = 1; r <= rounds; ++r)); do
  for mode in unpadded padded; do
    dir=$out/$mode.$r
    rm -rf "$dir"
    [[ $mode == unpadded ]] && flag=true || flag=false
    build/roformer pretrain --config configs/tiny.yaml run.dir="$dir" data.unpadded=$flag \
      "stages=[{max_seq_len: 128, batch_size: 32, steps: $steps}]" log.every_steps=5 \
      log.eval_every_steps=0 checkpoint.every_steps=0 "$@" >"$out/$mode.$r.log" 2>&1
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
per_mode = {}
for r in range(1, rounds + 1):
    for mode in ("unpadded", "padded"):
        rows = [json.loads(l) for l in open(f"{out}/{mode}.{r}/metrics.jsonl")]
        train = [x for x in rows if x.get("type") == "train"][1:]
        tps = statistics.median(x["tokens_per_s"] for x in train)
        fill = statistics.mean(x.get("packing_efficiency", float("nan")) for x in train)
        per_mode.setdefault(mode, []).append(tps)
        print(f"round {r} {mode:9s} {tps:8.0f} tokens/s  fill {fill:.3f}")
for mode, v in per_mode.items():
    print(f"median {mode:9s} {statistics.median(v):8.0f} tokens/s")
print(f"unpadded / padded: {statistics.median(per_mode['unpadded']) / statistics.median(per_mode['padded']):.2f}x")
PY
