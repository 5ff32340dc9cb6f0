#!/usr/bin/python3
"""Writes tests/fixtures/adamw_golden.json: ten torch.optim.AdamW steps on three
parameters (one without weight decay) with fixed gradients per step, so the C++
AdamW can be checked against PyTorch's numbers. Run with Debian's python3-torch:
    /usr/bin/python3 tests/golden/make_adamw_golden.py
"""
import json
import os

import torch

torch.manual_seed(0)
shapes = {"encoder.weight": (4, 3), "encoder.bias": (3,), "norm.LayerNorm.weight": (5,)}
params = {n: torch.randn(s, dtype=torch.float32) for n, s in shapes.items()}
initial = {n: p.clone() for n, p in params.items()}
lr, betas, eps, wd = 1e-2, (0.9, 0.999), 1e-6, 0.1
decay = [params["encoder.weight"]]
no_decay = [params["encoder.bias"], params["norm.LayerNorm.weight"]]
for p in params.values():
    p.requires_grad_(True)
opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
    lr=lr, betas=betas, eps=eps)
grads = []
for step in range(10):
    g = {n: torch.randn(s, dtype=torch.float32) * (step + 1) for n, s in shapes.items()}
    grads.append({n: t.flatten().tolist() for n, t in g.items()})
    for n, p in params.items():
        p.grad = g[n].clone()
    opt.step()
state = {n: opt.state[p] for n, p in params.items()}
out = {
    "reference": f"torch.optim.AdamW, PyTorch {torch.__version__}",
    "lr": lr, "betas": list(betas), "eps": eps, "weight_decay": wd,
    "no_decay": ["encoder.bias", "norm.LayerNorm.weight"],
    "shapes": {n: list(s) for n, s in shapes.items()},
    "initial": {n: t.flatten().tolist() for n, t in initial.items()},
    "grads": grads,
    "final": {n: p.detach().flatten().tolist() for n, p in params.items()},
    "exp_avg": {n: s["exp_avg"].flatten().tolist() for n, s in state.items()},
    "exp_avg_sq": {n: s["exp_avg_sq"].flatten().tolist() for n, s in state.items()},
}
path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "adamw_golden.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", os.path.normpath(path))
