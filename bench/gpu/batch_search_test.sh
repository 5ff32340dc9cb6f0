#!/usr/bin/env bash
# The batch searches of mlm_step_bench and hf_roformer_bench.py where
# --max-tokens alone stops the doubling (seq 24, a cap of 240 tokens: 2, 4,
# 8, and 16 would pass it): both try the cap's own batch, 10, and keep it;
# the peer keeps 8 when that batch does not fit (a simulated out-of-memory
# error). On the CPU, tiny models.
#   batch_search_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: batch_search_test.sh BUILD_DIR}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
python=$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--device cpu --size tiny --seq 24 --precision f32 --max-tokens 240 --start-batch 2
  --steps 1 --warmup 0 --threads 2)

check() {  # check FILE BATCH TRIALS: the row's batch and its search as (batch, fits) pairs
  "$python" - "$@" <<'PY'
import json, sys
path, batch, trials = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(path) if l.strip()]
assert len(rows) == 1, rows
r = rows[0]
got = " ".join(f"{t['batch']}{'' if t['fits'] else 'x'}" for t in r["search"])
assert r["status"] == "ok" and r["batch"] == batch and got == trials, (path, r["batch"], got)
print(f"{r['setup']}: batch {r['batch']}, search {got}")
PY
}

"$build/bench/gpu/mlm_step_bench" "${common[@]}" --json "$tmp/ours.jsonl" > /dev/null
check "$tmp/ours.jsonl" 10 "2 4 8 10"
if ! "$python" -c 'import torch' 2> /dev/null; then
  echo "the peer's search not run: $python has no torch (python3-torch)"
  exit 0
fi
peer=("$python" "$root/bench/gpu/hf_roformer_bench.py" --model standin --setups eager "${common[@]}")
"${peer[@]}" --json "$tmp/peer.jsonl" > /dev/null
check "$tmp/peer.jsonl" 10 "2 4 8 10"
"${peer[@]}" --json "$tmp/peer_oom.jsonl" --simulate-oom-tokens 230 > /dev/null
check "$tmp/peer_oom.jsonl" 8 "2 4 8 10x"
