#!/usr/bin/env python3
"""PyTorch peer of bench/layers/model_bench.cpp: one RoFormer MLM training
step (forward + backward, no optimizer) of the same model, batch and threads.

  --mode full    logits at every position, loss over the labelled ones
                 (what Hugging Face's RoFormerForMaskedLM does)
  --mode masked  the head runs only on the labelled rows (the optimised peer)
  --precision bf16  forward under torch.autocast("cpu", dtype=torch.bfloat16),
                 what a user with a bf16 CPU turns on (parameters stay f32)

Prints one JSON line: {"mode", "step_s" (median), "tokens_per_s", ...}.
Run with the system interpreter: /usr/bin/python3 (python3-torch).
"""

import argparse
import json
import math
import os
import statistics
import time

import torch
from torch import nn
import torch.nn.functional as F


class Rope(nn.Module):
    """Interleaved RoPE as transformers' apply_rotary_position_embeddings."""

    def __init__(self, head_dim, max_len, base=10000.0):
        super().__init__()
        inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.repeat_interleave(angles.cos(), 2, dim=-1).float())
        self.register_buffer("sin", torch.repeat_interleave(angles.sin(), 2, dim=-1).float())

    def forward(self, x):  # [B, H, S, D]
        s = x.shape[2]
        rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape_as(x)
        return x * self.cos[:s] + rotated * self.sin[:s]


class Layer(nn.Module):
    def __init__(self, hidden, heads, inter, p):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attn_out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.inter = nn.Linear(hidden, inter)
        self.out = nn.Linear(inter, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)
        self.p = p

    def forward(self, x, ext_mask, rope):
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        q, k = rope(q), rope(k)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + ext_mask
        probs = F.dropout(F.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).reshape(b, s, h)
        x = self.ln1(F.dropout(self.attn_out(ctx), self.p, self.training) + x)
        y = self.out(F.gelu(self.inter(x)))
        return self.ln2(F.dropout(y, self.p, self.training) + x)


class RoFormerMLM(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, inter, max_len, p):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.token_type = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(Layer(hidden, heads, inter, p) for _ in range(layers))
        self.rope = Rope(hidden // heads, max_len)
        self.head_dense = nn.Linear(hidden, hidden)
        self.head_ln = nn.LayerNorm(hidden, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.p = p
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids, types, mask, labels, masked_only):
        ext = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        x = F.dropout(self.ln(self.word(ids) + self.token_type(types)), self.p, self.training)
        for layer in self.layers:
            x = layer(x, ext, self.rope)
        x = x.reshape(-1, x.shape[-1])
        labels = labels.reshape(-1)
        if masked_only:
            rows = (labels != -100).nonzero().squeeze(1)
            x, labels = x.index_select(0, rows), labels.index_select(0, rows)
        # .float(): torch 1.13's CPU autocast leaves layer_norm out of its
        # lists and the bf16 GELU output would meet f32 weights (a no-op in f32).
        h = self.head_ln(F.gelu(self.head_dense(x)).float())
        logits = F.linear(h, self.word.weight, self.bias)
        return F.cross_entropy(logits, labels, ignore_index=-100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=0, help="default 4 * hidden")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--mask-prob", type=float, default=0.15)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--mode", choices=["full", "masked"], default="masked")
    ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    inter = args.intermediate or 4 * args.hidden
    model = RoFormerMLM(args.vocab, args.hidden, args.layers, args.heads, inter, args.seq, args.dropout)
    model.train()
    b, s = args.batch, args.seq
    ids = torch.randint(1, args.vocab, (b, s))
    types = torch.zeros(b, s, dtype=torch.long)
    types[:, s // 2 :] = 1
    mask = torch.ones(b, s, dtype=torch.long)
    n_masked = max(1, round(args.mask_prob * b * s))
    labels = torch.full((b * s,), -100, dtype=torch.long)
    rows = torch.randperm(b * s)[:n_masked]
    labels[rows] = torch.randint(1, args.vocab, (n_masked,))
    labels = labels.view(b, s)

    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(ids, types, mask, labels, args.mode == "masked")
        loss.backward()
        elapsed = time.perf_counter() - start
        model.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(elapsed)
    step_s = statistics.median(times)
    print(json.dumps(dict(mode=args.mode, precision=args.precision, step_s=step_s, tokens_per_s=b * s / step_s,
                          loss=float(loss), threads=torch.get_num_threads(),
                          torch=str(torch.__version__), masked_rows=n_masked)))


if __name__ == "__main__":
    main()
