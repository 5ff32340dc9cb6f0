#!/usr/bin/env bash
# Fine-tuning per epoch with unpadded (token-stream) batches against padded
# ones, side by side on this machine: the same config, seed and data, only
# data.unpadded differs (then data.packing on top, if asked). Prints per run
# the wall time of each epoch (training plus its validation pass, from
# metrics.jsonl's elapsed_s), the validation accuracy per epoch and the
# test accuracy, then the padded/unpadded time ratio.
# Usage: bench/train/unpadded_finetune.sh CONFIG OUT_DIR [MODES] [-- OVERRIDES...]
#   MODES: comma list of padded, unpadded, packed (default: unpadded,padded)
set -euo pipefail
cd "$(dirname "$0")/../.."
config=$1 out=$2
modes=${3:-unpadded,padded}
shift 3 2>/dev/null || shift $#
[[ "${1:-}" == "--" ]] && shift
mkdir -p "$out"
for mode in ${modes//,/ }; do
  case $mode in
    padded) flags=(data.unpadded=false) ;;
    unpadded) flags=(data.unpadded=true) ;;
    packed) flags=(data.unpadded=true data.packing=true) ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  dir=$out/$mode
  rm -rf "$dir"
  start=$(date +%s.%N)
  build/roformer finetune --config "$config" run.dir="$dir" "${flags[@]}" "$@" >"$out/$mode.log" 2>&1
  end=$(date +%s.%N)
  python3 - "$dir/metrics.jsonl" "$mode" "$start" "$end" <<'PY'
import json, sys
path, mode, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
rows = [json.loads(l) for l in open(path)]
train = [r for r in rows if r.get("type") == "train"]
epochs = [r for r in rows if r.get("type") == "epoch"]
ends, fills = {}, {}
for r in train:
    ends[r["epoch"]] = r["elapsed_s"]
    fills.setdefault(r["epoch"], []).append(r.get("packing_efficiency", float("nan")))
prev, times = 0.0, []
for e in sorted(ends):
    times.append(ends[e] - prev)
    prev = ends[e]
test = [r for r in rows if r.get("type") == "test"]
print(f"{mode:9s} epoch s: {' '.join(f'{t:7.1f}' for t in times)} | fill "
      f"{sum(fills[1]) / len(fills[1]):.2f} | val acc: "
      + " ".join(f"{100 * r['validation_accuracy']:.2f}" for r in epochs if "validation_accuracy" in r)
      + (f" | test acc {100 * test[-1]['accuracy']:.2f}" if test else "")
      + f" | wall {end - start:.0f}s")
PY
done
