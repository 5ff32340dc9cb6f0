#!/usr/bin/env bash
# scripts/gpu_bench.sh dry, from a build directory, and what its results must
# show: ours and the peer measured at every length, both batch searches having
# backed off (the memory cap, the simulated out-of-memory errors), every
# measured row given an MFU by the summary, and the summary's ratio tables.
#   gpu_bench_dry_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: gpu_bench_dry_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
python=$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)
"$python" -c 'import torch' 2> /dev/null || { echo "SKIP: $python has no torch (python3-torch)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OUT=$tmp/out GPU_BENCH_WORK=$tmp/work BUILD_DIR=$build PYTHON=$python
rc=0
bash "$root/scripts/gpu_bench.sh" dry > "$tmp/dry.log" 2>&1 || rc=$?
if ((rc != 0)); then
  cat "$tmp/dry.log"
  echo "gpu_bench.sh dry failed (exit $rc)"
  exit 1
fi
"$python" - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "results.jsonl")) if l.strip()]
ok = [r for r in rows if r["status"] == "ok"]
seqs = {64, 128, 32}
ours = {r["seq"] for r in ok if r["framework"] == "ours"}
peer = {r["seq"] for r in ok if r["framework"] != "ours"}
assert ours == seqs, f"ours measured at {sorted(ours)}, expected {sorted(seqs)}"
assert peer == seqs, f"the peer measured at {sorted(peer)}, expected {sorted(seqs)}"
for who, pick in (("ours", lambda r: r["framework"] == "ours"), ("the peer", lambda r: r["framework"] != "ours")):
    backed = [r for r in ok if pick(r) and any(not t["fits"] for t in r["search"])]
    assert backed, f"{who}: no batch search backed off from a step that did not fit"
    for r in backed:
        fitted = [t["batch"] for t in r["search"] if t["fits"]]
        failed = [t["batch"] for t in r["search"] if not t["fits"]]
        assert r["batch"] == max(fitted) and r["batch"] < min(failed), (who, r["search"], r["batch"])
for r in ok:
    assert 0 < r["mfu"] < 1 and r["tokens_per_s"] > 0 and r["flops_per_step"] > 0, r
    assert abs(r["tokens_per_s"] - r["tokens"] / (r["step_ms"] / 1e3)) < 1e-6 * r["tokens_per_s"], r
text = open(os.path.join(out, "bench_summary.txt")).read()
for needle in ("| seq | set-up | batch | tokens/s", "ours / best peer", "cost per token at 128 / at 64"):
    assert needle in text, f"bench_summary.txt lacks {needle!r}:\n{text}"
print(f"gpu_bench dry: {len(ok)} measured rows, both searches backed off, summary complete")
PY
