#!/usr/bin/env bash
# sass_loops.py on a hand-written listing: one loop of eight instructions, two
# HMMA and one MUFU, a guarded FMUL counted as FMUL, the kernel named with its
# template arguments, ptxas's registers, spills and stack frame read from a log.
set -euo pipefail
here=$(dirname "$0")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cat >"$log" <<'LOG'
ptxas info    : Compiling entry function '_ZN8roformer7kernels4cuda12_GLOBAL__N_120flash_forward_kernelILi1ELb0EEEvNS2_9FlashArgsEl' for 'sm_90'
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 8 bytes cumulative stack size
LOG
got=$(python3 "$here/sass_loops.py" "$here/testdata/loop.sass" --ptxas "$log" --min-loop 1 --json)
python3 - "$got" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
assert len(rows) == 1, rows
r = rows[0]
assert r['kernel'] == 'flash_forward_kernel<1,0>', r['kernel']
assert r['ptxas'] == '128 registers, 4 bytes spilled, 8 bytes stack frame', r['ptxas']
(loop,) = r['loops']
assert loop['instructions'] == 8, loop
assert loop['hmma'] == 2 and loop['mufu'] == 1, loop
assert loop['mix']['FMUL'] == 1 and loop['mix']['BRA'] == 1, loop
print('sass_loops: ok')
PY
