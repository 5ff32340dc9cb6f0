#!/usr/bin/env python3
"""The table of scripts/gpu_bench.sh: reads the JSON lines that
mlm_step_bench (ours) and hf_roformer_bench.py (the peer) wrote, puts every
row on one FLOP scale (the FLOPs of each row's shape from
`mlm_step_bench --flops-for`, i.e. train/telemetry's mlm_training_flops, also
for the peer, whose full-head set-up does more work than that counts) and
writes a Markdown table ready for docs/performance/gpu-step.md: tokens/s, TFLOP/s, MFU,
peak memory, ours over the best peer per sequence length, the cost per
token at the longest length over that at 512 (--reference-seq), our A/B rows over
the default with a verdict, and issue 14's targets.

  bench_summary.py RESULTS.jsonl --flops-cmd "mlm_step_bench --size base --device cuda" [--out FILE]
"""

import argparse
import json
import shlex
import subprocess
import sys


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def add_flops(rows, flops_cmd):
    """Fills flops_per_step, tflops and mfu of ok rows that lack them, per precision."""
    todo = [r for r in rows if r.get("status") == "ok" and "flops_per_step" not in r]
    for precision in sorted({r["precision"] for r in todo}):
        part = [r for r in todo if r["precision"] == precision]
        shapes = ",".join(f"{r['seq']}:{r['batch']}:{r['masked']}" for r in part)
        cmd = shlex.split(flops_cmd) + ["--precision", precision, "--flops-for", shapes]
        lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
        answers = [json.loads(l) for l in lines if l.startswith("{")]
        if len(answers) != len(part):
            raise SystemExit(f"bench_summary: {' '.join(cmd)} gave {len(answers)} answers for {len(part)} rows")
        for r, a in zip(part, answers):
            step_s = r["step_ms"] / 1e3
            r["flops_per_step"] = a["flops_per_step"]
            r["peak_tflops"] = a["peak_tflops"]
            r["tflops"] = a["flops_per_step"] / step_s / 1e12
            r["mfu"] = r["tflops"] / a["peak_tflops"]


def tflops(v):
    return f"{v:.1f}" if v >= 1 else f"{v:.3f}"


def mib(v):
    return "-" if v is None else f"{v:,.0f}"


def table(rows, reference):
    out = []
    ok = [r for r in rows if r.get("status") == "ok"]
    seqs = sorted({r["seq"] for r in rows})
    out.append("| seq | set-up | batch | tokens/s | step ms | TFLOP/s | MFU | peak allocated MiB | peak reserved MiB |")
    out.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in seqs:
        for r in [r for r in rows if r["seq"] == s]:
            if r.get("status") == "ok":
                out.append(f"| {s} | {r['setup']} | {r['batch']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | "
                           f"{tflops(r['tflops'])} | {100 * r['mfu']:.1f}% | {mib(r.get('peak_allocated_mb'))} | "
                           f"{mib(r.get('peak_reserved_mb'))} |")
            else:
                out.append(f"| {s} | {r['setup']} | {r.get('status')}: {r.get('message', '')} | | | | | | |")
    out.append("")
    # Ours over the best peer, per precision and sequence length.
    out.append("| seq | ours | best peer set-up | ours / best peer (tokens/s) |")
    out.append("|---:|---|---|---:|")
    for s in seqs:
        for mine in [r for r in ok if r["seq"] == s and r["framework"] == "ours"]:
            peers = comparable_peers(ok, s)
            if not peers:
                out.append(f"| {s} | {mine['setup']} | (no peer row) | - |")
                continue
            best = max(peers, key=lambda r: r["tokens_per_s"])
            out.append(f"| {s} | {mine['setup']} | {best['setup']} | "
                       f"{mine['tokens_per_s'] / best['tokens_per_s']:.2f}x |")
    out.append("")
    # Launch overhead (issue 14: kept small): kernel calls per step, and the
    # host's time to queue forward and backward beside the whole step.
    queued = [r for r in ok if r["framework"] == "ours" and "enqueue_ms" in r]
    if queued:
        out.append("| seq | set-up | kernel calls per step | host ms to queue forward + backward | step ms |")
        out.append("|---:|---|---:|---:|---:|")
        for r in queued:
            out.append(f"| {r['seq']} | {r['setup']} | {r['kernel_calls_per_step']} | {r['enqueue_ms']:.1f} | "
                       f"{r['step_ms']:.1f} |")
        out.append("")
    # Cost per token at the longest length over the reference (issue 14: at most 1.3 at 1536 over 512).
    longest = max(seqs) if seqs else 0
    if reference in seqs and longest > reference:
        out.append(f"| set-up | cost per token at {longest} / at {reference} |")
        out.append("|---|---:|")
        for setup in dict.fromkeys(r["setup"] for r in ok):
            at = {r["seq"]: r for r in ok if r["setup"] == setup}
            if reference in at and longest in at:
                ratio = at[reference]["tokens_per_s"] / at[longest]["tokens_per_s"]
                out.append(f"| {setup} | {ratio:.2f} |")
        out.append("")
    return out, ok, seqs


def spread(r):
    """The range of a row's timed steps, slowest over fastest less one; None
    when it has fewer than two or did not record them (the peer's rows, older
    results): a verdict then has nothing to judge by."""
    lo, hi = r.get("step_ms_min"), r.get("step_ms_max")
    if not lo or not hi or r.get("steps", 0) < 2:
        return None
    return hi / lo - 1


def ab_table(ok, seqs):
    """Each A/B row of ours (another precision or attention kernel, in bf16)
    over the default, "ours bf16", at the same length (the last such row, as
    targets() takes it), with a verdict: faster or slower only by more than
    the wider of the two rows' step ranges (a time ratio, so "slower" means
    the step took that much longer), "no spread recorded" without both."""
    out = ["| seq | set-up | tokens/s over ours bf16 | steps | spread (max / min - 1) | verdict |",
           "|---:|---|---:|---:|---:|---|"]
    ours = {(r["seq"], r["setup"]): r for r in ok if r["framework"] == "ours"}
    for s in seqs:
        ab = [r for (seq, setup), r in ours.items()
              if seq == s and setup.startswith("ours bf16") and setup != "ours bf16"]
        base = ours.get((s, "ours bf16"))
        if ab and (base is None or not base["tokens_per_s"] > 0):
            out.append(f"| {s} | (no ours bf16 row to compare with) | - | - | - | - |")
            continue
        for r in ab:
            ratio = r["tokens_per_s"] / base["tokens_per_s"]
            ranges = [spread(base), spread(r)]
            if None in ranges:
                margin, verdict = "-", "no spread recorded"
            else:
                m = max(ranges)
                margin = f"{100 * m:.1f}%"
                verdict = ("faster" if ratio > 1 + m else "slower" if ratio * (1 + m) < 1
                           else "within the spread")
            out.append(f"| {s} | {r['setup']} | {ratio:.3f}x | {r.get('steps', '-')} | {margin} | {verdict} |")
    return out + [""] if len(out) > 2 else []


def comparable_peers(ok, seq):
    """The peer's rows at seq doing our work: the head on the masked rows. Its
    stock full-head forward does more, so it is shown but never the yardstick
    (a run whose other set-ups failed must not judge the target on it)."""
    return [r for r in ok if r["seq"] == seq and r["framework"] != "ours" and r.get("head") != "all rows"]


def targets(ok, seqs):
    """Issue 14's targets, as far as these rows answer them."""
    lines = []
    # The default set-up's rows: A/B rows share its precision ("ours bf16 separate").
    ours = {(r["seq"], r["setup"]): r for r in ok if r["framework"] == "ours"}
    mine = ours.get((512, "ours bf16"))
    peers = comparable_peers(ok, 512)
    if mine and peers:
        best = max(peers, key=lambda r: r["tokens_per_s"])
        ratio = mine["tokens_per_s"] / best["tokens_per_s"]
        lines.append(f"target: >= 2x the best peer at seq 512: {ratio:.2f}x ({best['setup']}) -> "
                     f"{'met' if ratio >= 2 else 'not met'}")
    if mine:
        lines.append(f"target: >= 45% MFU at seq 512: {100 * mine['mfu']:.1f}% -> "
                     f"{'met' if mine['mfu'] >= 0.45 else 'not met'}")
    long_run = ours.get((1536, "ours bf16"))
    if mine and long_run:
        cost = mine["tokens_per_s"] / long_run["tokens_per_s"]
        lines.append(f"target: cost per token at 1536 <= 1.3x that at 512: {cost:.2f}x -> "
                     f"{'met' if cost <= 1.3 else 'not met'}")
    if not lines:
        lines.append("targets: no ours bf16 row at seq 512 to judge them by")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("--flops-cmd", required=True, help="mlm_step_bench with --size and --device")
    ap.add_argument("--out", default="")
    ap.add_argument("--title", default="")
    ap.add_argument("--reference-seq", type=int, default=512, help="the cost per token is compared with this length")
    args = ap.parse_args()
    rows = load(args.results)
    add_flops(rows, args.flops_cmd)
    lines = [args.title] if args.title else []
    body, ok, seqs = table(rows, args.reference_seq)
    lines += body + ab_table(ok, seqs) + targets(ok, seqs)
    lines.append("FLOPs per step (every row, ours and the peer): tokens x (6 x P_layers + 12 x layers x hidden x "
                 "seq) + masked x 6 x P_head (train/telemetry.h); MFU against the peak in each row's peak_tflops.")
    text = "\n".join(lines) + "\n"
    if args.out:
        open(args.out, "w").write(text)
        with open(args.results + ".filled", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
