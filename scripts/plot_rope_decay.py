#!/usr/bin/env python3
"""Plots RoPE's long-term decay (RoFormer paper, Appendix C / Figure 2).

For a head dimension d and base b, theta_k = b^(-2k/d), and the relative
upper bound of |q_m . k_n| at relative distance r = m - n is

    (1 / (d/2)) * sum_{j=1}^{d/2} |S_j|,   S_j = sum_{k=0}^{j-1} e^{i r theta_k}.

It falls as r grows: distant tokens interact more weakly. The C++ test
RoFormerProperties.LongTermDecayOfAppendixC checks the same curve, computed
through the model's rope op.

  /usr/bin/python3 scripts/plot_rope_decay.py [--out docs/rope_decay.svg]
(needs matplotlib: apt-get install -y python3-matplotlib)
"""

import argparse
import os

import numpy as np


def decay_curve(d, base, max_distance):
    r = np.arange(max_distance + 1, dtype=np.float64)[:, None]
    theta = base ** (-2.0 * np.arange(d // 2) / d)
    partial = np.cumsum(np.exp(1j * r * theta[None, :]), axis=1)  # S_1 .. S_{d/2}
    return np.abs(partial).mean(axis=1)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description="Plot RoPE's long-term decay bound.")
    parser.add_argument("--out", default=os.path.join(root, "docs", "rope_decay.svg"))
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--base", type=float, default=10000.0)
    parser.add_argument("--max-distance", type=int, default=256)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = decay_curve(args.dim, args.base, args.max_distance)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(len(curve)), curve, color="#1f6fb4", linewidth=1.4)
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel("relative upper bound  (2/d) Σ_j |S_j|")
    ax.set_title(f"RoPE long-term decay (d = {args.dim}, base = {args.base:g})")
    ax.set_xlim(0, args.max_distance)
    ax.set_ylim(0, None)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, metadata={"Date": None} if args.out.endswith(".svg") else None)
    print(f"wrote {args.out}: bound {curve[0]:.2f} at 0, {curve[10]:.2f} at 10, "
          f"{curve[100]:.2f} at 100, {curve[-1]:.2f} at {args.max_distance}")


if __name__ == "__main__":
    main()
