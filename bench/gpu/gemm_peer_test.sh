#!/usr/bin/env bash
# gemm_peer_torch.py on the CPU with a gemm report (testdata/gemm_report.jsonl,
# which cuda_tests' GemmReport.ThePeersTestDataIsWhatTheRowsSay holds to what
# gemm_report_row writes: a bias product, one accumulating into f32, the three
# epilogues, a strided batch with no timed candidate): the torch call each
# problem takes (an f32 result by out_dtype or a cast), its times, the totals
# line once every problem has ours, and the refusal of a file without a
# report. Skips without python3-torch.
set -euo pipefail
here=$(dirname "$0")
python=$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || echo python3)
"$python" -c 'import torch' 2>/dev/null || { echo "SKIP: $python has no torch (python3-torch)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
peer() { "$python" "$here/gemm_peer_torch.py" "$@" --device cpu --repeats 2; }

peer "$here/testdata/gemm_report.jsonl" --json "$work/all.jsonl" >"$work/all.txt"
# The same report without its untimed problem: every row has ours, so a total.
"$python" - "$here/testdata/gemm_report.jsonl" "$work/complete.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    if "gemm_report" in r:
        r["gemm_report"] = [p for p in r["gemm_report"] if "heuristic_ms" in p]
open(sys.argv[2], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
peer "$work/complete.jsonl" --json "$work/complete_out.jsonl" >"$work/complete.txt"
echo '{"setup": "ours bf16", "seq": 64, "status": "ok"}' >"$work/none.jsonl"
rc=0
peer "$work/none.jsonl" >"$work/none.txt" || rc=$?

"$python" - "$work" "$rc" <<'PY'
import json, re, sys
work, rc = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(work + "/all.jsonl")]
calls = [r["torch_call"] for r in rows]
f32 = r"( \(out_dtype\)| \+ cast)"
expected = ["addmm", r"add_\(mm%s\)" % f32, "_addmm_activation", r"mm \+ sum\(0\)",
            r"mm%s \+ sum\(1\)" % f32, "bmm"]
assert len(calls) == len(expected), calls
for call, pattern in zip(calls, expected):
    assert re.fullmatch(pattern, call), (call, pattern)
assert all(r["torch_ms"] > 0 for r in rows), rows
text = open(work + "/all.txt").read()
assert "the step's products" not in text, "a total over a problem without ours"
assert re.search(r"^3x\[64x16\]\*\[16x64\]T +1 +- +- +[0-9.]+ ", text, re.M), text
done = [json.loads(l) for l in open(work + "/complete_out.jsonl")]
assert len(done) == 5, done
ours = sum(r["calls"] * r["ours_ms"] for r in done)
torch_total = sum(r["calls"] * r["torch_ms"] for r in done)
m = re.search(r"ours ([0-9.]+) ms, best candidates ([0-9.]+) ms \(([0-9.]+)x\), "
              r"torch ([0-9.]+) ms \(([0-9.]+)x ours\)", open(work + "/complete.txt").read())
assert m, open(work + "/complete.txt").read()
assert abs(float(m.group(1)) - ours) < 0.06, (m.group(1), ours)
assert abs(float(m.group(5)) - torch_total / ours) < 0.002 * torch_total / ours + 1e-3, m.groups()
assert rc == 1 and "no row" in open(work + "/none.txt").read(), rc
print("gemm_peer_torch: ok")
PY
