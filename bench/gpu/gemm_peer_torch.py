#!/usr/bin/env python3
"""The peer of mlm_step_bench --gemm-report: the same matrix products in PyTorch.

Reads the rows of a results file (JSON lines, mlm_step_bench --json) that hold
a gemm_report, runs each recorded problem as PyTorch would (torch.mm, addmm
with the bias, addmm_ / baddbmm_ where C accumulates, _addmm_activation for
the GELU epilogue; the dGELU and row-sums epilogues as the product followed by
their reduction, without dGELU's elementwise factor; an f32 result of bf16
operands by mm's out_dtype where this torch has it, else the product then a
cast), and prints one table: per problem, the algorithm our gemm runs, the
fastest candidate cuBLASLt offered, and torch, in ms and TFLOP/s, the torch
call as it ran, and the step's products in total (calls x ms). Each time is
the median of three averages of --repeats runs back to back. --json writes
torch's times per problem.

    gemm_peer_torch.py RESULTS.jsonl [--device cuda|cpu] [--repeats N] [--json OUT]

On the CPU (tests) it times with a wall clock; the problems are what the file says.
"""
import argparse
import json
import statistics
import sys
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def stored(rows, cols, ld, batch, stride, dtype, device, gen):
    """A random stored matrix with its strides (row stride ld, batch stride)."""
    span = (stride * (batch - 1) if stride else 0) + (rows - 1) * ld + cols
    flat = torch.randn(max(span, 1), generator=gen, device=device).to(dtype)
    if batch == 1:
        return flat.as_strided((rows, cols), (ld, 1))
    return flat.as_strided((batch, rows, cols), (stride, ld, 1))


def product_into(dt_out, dt_in):
    """torch's product writing dt_out from dt_in operands, and its name: mm's
    out_dtype where this torch has it, else the product then a cast."""
    if dt_out == dt_in:
        return (lambda a, b: a @ b), ""
    try:
        probe = torch.ones(1, 1, dtype=dt_in)
        torch.mm(probe, probe, out_dtype=dt_out)
        return (lambda a, b: torch.mm(a, b, out_dtype=dt_out) if a.dim() == 2
                else torch.bmm(a, b, out_dtype=dt_out)), " (out_dtype)"
    except (TypeError, RuntimeError):
        return (lambda a, b: (a @ b).to(dt_out)), " + cast"


def problem_call(p, device, gen):
    """A closure running problem p once in PyTorch, and what it runs."""
    dt_in, dt_out = DTYPES[p["input"]], DTYPES[p["output"]]
    m, n, k, batch = p["m"], p["n"], p["k"], p["batch"]
    sa = p["stride_a"] if batch > 1 else 0
    sb = p["stride_b"] if batch > 1 else 0
    a = stored(k if p["trans_a"] else m, m if p["trans_a"] else k, p["lda"], batch, sa, dt_in,
               device, gen)
    b = stored(n if p["trans_b"] else k, k if p["trans_b"] else n, p["ldb"], batch, sb, dt_in,
               device, gen)
    a = a.transpose(-1, -2) if p["trans_a"] else a
    b = b.transpose(-1, -2) if p["trans_b"] else b
    shape = (batch, m, n) if batch > 1 else (m, n)
    bias = torch.randn(n, generator=gen, device=device).to(dt_out) if p["bias"] else None
    epilogue = p["epilogue"]
    if p["beta"] != 0:
        c = torch.randn(shape, generator=gen, device=device).to(dt_out)
        if dt_out == dt_in:
            run = (lambda: c.baddbmm_(a, b)) if batch > 1 else (lambda: c.addmm_(a, b))
            what = "baddbmm_" if batch > 1 else "addmm_"
        else:
            mm, how = product_into(dt_out, dt_in)
            run, what = (lambda: c.add_(mm(a, b))), "add_(mm%s)" % how
        if bias is not None:
            inner = run
            run, what = (lambda: inner().add_(bias)), what + " + bias"
        return run, what
    if epilogue == "gelu_aux":
        return (lambda: torch._addmm_activation(bias, a, b, use_gelu=True)), "_addmm_activation"
    if epilogue == "dgelu_bias_grad":
        return (lambda: torch.mm(a, b).sum(0)), "mm + sum(0)"
    if epilogue == "row_sums_of_a":
        mm, how = product_into(dt_out, dt_in)
        return (lambda: (mm(a, b), a.sum(1))), "mm%s + sum(1)" % how
    if bias is not None and batch == 1 and dt_out == dt_in:
        return (lambda: torch.addmm(bias, a, b)), "addmm"
    mm, how = product_into(dt_out, dt_in)
    name = ("bmm" if batch > 1 else "mm") + how
    if bias is not None:
        return (lambda: mm(a, b).add_(bias)), name + " + bias"
    return (lambda: mm(a, b)), name


def median_ms(run, device, repeats):
    """ms a run: the median of three averages of `repeats` runs back to back
    (the host's dispatch then overlaps the device's work)."""
    run()
    groups = []
    for _ in range(3):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                run()
            stop.record()
            stop.synchronize()
            groups.append(start.elapsed_time(stop) / repeats)
        else:
            t0 = time.perf_counter()
            for _ in range(repeats):
                run()
            groups.append(1e3 * (time.perf_counter() - t0) / repeats)
    return statistics.median(groups)


def describe(p):
    shape = "%dx[%dx%d]%s*[%dx%d]%s" % (p["batch"], p["m"], p["k"], "T" if p["trans_a"] else "",
                                       p["k"], p["n"], "T" if p["trans_b"] else "")
    extra = (" +=" if p["beta"] != 0 else "") + (" bias" if p["bias"] else "")
    if p["epilogue"] != "none":
        extra += " " + p["epilogue"]
    return shape + extra


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.results) if line.strip()]
    reports = [r for r in rows if r.get("gemm_report")]
    if not reports:
        print("gemm_peer_torch: no row of %s holds a gemm_report" % args.results)
        return 1
    gen = torch.Generator(device=args.device).manual_seed(0)
    out = []
    for row in reports:
        print("gemm report, %s seq %s batch %s: ours (the algorithm our gemm runs), the fastest"
              " cuBLASLt candidate, torch %s" % (row["setup"], row["seq"], row["batch"],
                                                 torch.__version__))
        print("%-44s %5s %9s %9s %9s %7s %8s %22s" % ("problem", "calls", "ours ms", "best ms",
                                                     "torch ms", "torch/", "ours", "torch call"))
        print("%-44s %5s %9s %9s %9s %7s %8s" % ("", "", "", "", "", "ours", "TFLOP/s"))
        totals = {"ours": 0.0, "best": 0.0, "torch": 0.0}
        complete = True
        for p in row["gemm_report"]:
            run, what = problem_call(p, args.device, gen)
            torch_ms = median_ms(run, args.device, args.repeats)
            ours, best = p.get("heuristic_ms"), p.get("best_ms")
            out.append({"seq": row["seq"], "problem": describe(p), "calls": p["calls"],
                        "torch_ms": torch_ms, "torch_call": what, "ours_ms": ours,
                        "best_ms": best})
            if ours is None or best is None:
                complete = False
                print("%-44s %5d %9s %9s %9.3f %7s %8s %22s" % (describe(p), p["calls"], "-", "-",
                                                                torch_ms, "-", "-", what))
                continue
            for key, ms in (("ours", ours), ("best", best), ("torch", torch_ms)):
                totals[key] += p["calls"] * ms
            print("%-44s %5d %9.3f %9.3f %9.3f %7.3f %8.1f %22s" % (
                describe(p), p["calls"], ours, best, torch_ms, torch_ms / ours,
                p["flop"] / ours * 1e-9, what))
        if complete and totals["ours"] > 0:
            print("the step's products: ours %.1f ms, best candidates %.1f ms (%.3fx), torch %.1f"
                  " ms (%.3fx ours)" % (totals["ours"], totals["best"],
                                        totals["best"] / totals["ours"], totals["torch"],
                                        totals["torch"] / totals["ours"]))
    if args.json:
        with open(args.json, "w") as f:
            for r in out:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
