#!/usr/bin/python3
"""Plots validation MLM loss and accuracy against the global step for runs
that differ only in model.position, from their metrics.jsonl files, and prints
a table of the values at each evaluation.

    /usr/bin/python3 scripts/plot_position_ablation.py runs/ablation-*/metrics.jsonl --out docs/position_ablation.svg
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "validation":
            rows[r["global_step"]] = r  # a resumed run may repeat a step: keep the last
    return [rows[k] for k in sorted(rows)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    table = {}
    for path in args.metrics:
        name = os.path.basename(os.path.dirname(path)).replace("ablation-", "")
        rows = load(path)
        steps = [r["global_step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], marker="o", ms=3, label=name)
        ax_acc.plot(steps, [100 * r["mlm_accuracy"] for r in rows], marker="o", ms=3, label=name)
        table[name] = rows
    ax_loss.set_xlabel("global step")
    ax_loss.set_ylabel("validation MLM loss")
    ax_acc.set_xlabel("global step")
    ax_acc.set_ylabel("validation MLM accuracy (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(title="position")
    fig.suptitle("tiny RoFormer, six-stage schedule, same seed: position encodings compared")
    fig.tight_layout()
    fig.savefig(args.out)
    print("wrote", args.out)
    names = list(table)
    print("step  " + "  ".join(f"{n:>18}" for n in names))
    for i, r in enumerate(table[names[0]]):
        cells = []
        for n in names:
            rr = table[n][i] if i < len(table[n]) else None
            cells.append(f"{rr['loss']:7.4f} / {100 * rr['mlm_accuracy']:5.2f}%" if rr else " " * 18)
        print(f"{r['global_step']:5d} " + "  ".join(cells))


if __name__ == "__main__":
    main()
