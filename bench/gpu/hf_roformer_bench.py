#!/usr/bin/env python3
"""The peer of bench/gpu/mlm_step_bench: transformers' RoFormerForMaskedLM,
one MLM training step (forward and backward under bf16 autocast, gradient
clipping at norm 1, AdamW), at each sequence length with the largest
micro-batch that fits, in up to three set-ups:

  eager    the model as transformers builds it (attn_implementation="eager")
  compile  the same under torch.compile (one compilation per shape; its batch
           is the eager search's, halved if it does not fit, not searched
           upwards: every new shape would compile again)
  sdpa     attn_implementation="sdpa", when transformers offers it for
           RoFormer (detected; a row says so when it does not)

--head masked (default) runs the model's encoder (model.roformer) and then its
LM head (model.cls) on the masked rows only, as ours does; RoFormerForMaskedLM's
own forward computes logits at every position, which --head full measures.

Each result is one JSON object per line in --json, with the fields of
mlm_step_bench (framework, setup, seq, batch, tokens_per_s, step_ms,
peak_allocated_mb, peak_reserved_mb, status, message, search); MFU is added by
bench/gpu/bench_summary.py from the same FLOP formula as ours.

Without transformers (this CPU machine: /usr/bin/python3 has torch only) every
set-up is reported as skipped and the exit code is 77, unless --model standin
replaces the model with the plain-PyTorch RoFormer of
bench/layers/model_bench_torch.py, to test this harness here:

  /usr/bin/python3 bench/gpu/hf_roformer_bench.py --device cpu --size tiny \\
      --model standin --seq 32,64 --simulate-oom-tokens 512
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {
    # RoFormer-base as issue 14 sets it (the paper's 12 layers, vocab 50,000).
    "base": dict(vocab_size=50000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    # A tiny model for CPU dry runs (as mlm_step_bench --size tiny).
    "tiny": dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128),
}
MASK_PROB = 0.15


class SimulatedOom(RuntimeError):
    """--simulate-oom-tokens: a step too large "runs out of memory" (tests the search here)."""


def is_oom(error):
    return isinstance(error, SimulatedOom) or "out of memory" in str(error).lower()


class MaskedRowsLM(nn.Module):
    """Encoder at every position, LM head and loss at the masked rows only."""

    def __init__(self, hf_model):
        super().__init__()
        self.model = hf_model

    def forward(self, ids, types, mask, rows, targets):
        hidden = self.model.roformer(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
        logits = self.model.cls(picked)
        return F.cross_entropy(logits.float(), targets)


class FullHeadLM(nn.Module):
    """RoFormerForMaskedLM's own forward: logits at every position."""

    def __init__(self, hf_model):
        super().__init__()
        self.model = hf_model

    def forward(self, ids, types, mask, labels):
        return self.model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss


class StandIn(nn.Module):
    """bench/layers/model_bench_torch.py's RoFormer in place of transformers' (CPU tests)."""

    def __init__(self, size, max_len, masked_only):
        super().__init__()
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "layers"))
        from model_bench_torch import RoFormerMLM  # noqa: E402

        s = SIZES[size]
        self.model = RoFormerMLM(s["vocab_size"], s["hidden_size"], s["num_hidden_layers"],
                                 s["num_attention_heads"], s["intermediate_size"], max_len, 0.1)
        self.masked_only = masked_only

    def forward(self, ids, types, mask, labels):
        return self.model(ids, types, mask, labels, self.masked_only)


def load_transformers():
    """(module, None) or (None, why not)."""
    try:
        import transformers
    except Exception as e:  # noqa: BLE001
        return None, f"transformers is not importable here ({type(e).__name__}: {e})"
    try:
        transformers.RoFormerConfig, transformers.RoFormerForMaskedLM  # lazy attributes: load them now
    except Exception as e:  # noqa: BLE001
        return None, f"transformers {transformers.__version__} has no RoFormerForMaskedLM ({type(e).__name__}: {e})"
    return transformers, None


def build_hf(transformers, size, max_len, attn):
    """RoFormerForMaskedLM with attn_implementation `attn`; raises with transformers' reason if refused."""
    config = transformers.RoFormerConfig(
        **SIZES[size], max_position_embeddings=max_len, embedding_size=SIZES[size]["hidden_size"],
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, type_vocab_size=2,
        rotary_value=False)
    cls = transformers.RoFormerForMaskedLM
    try:
        # What AutoModelForMaskedLM.from_config calls: it checks attn_implementation
        # against what the class supports and raises when it does not.
        model = cls._from_config(config, attn_implementation=attn)
    except (TypeError, AttributeError):  # a transformers without the argument: eager only
        if attn != "eager":
            raise ValueError(f"this transformers ({transformers.__version__}) has no attn_implementation")
        model = cls(config)
    used = getattr(model.config, "_attn_implementation", "eager")
    if used != attn:
        raise ValueError(f"asked for attn_implementation={attn!r}, the model uses {used!r}")
    return model


class Batch:
    def __init__(self, b, s, vocab, device, seed=42):
        g = torch.Generator().manual_seed(seed)
        n = b * s
        self.ids = torch.randint(1, vocab, (b, s), generator=g)
        self.types = torch.zeros(b, s, dtype=torch.long)
        self.types[:, s // 2:] = 1
        self.mask = torch.ones(b, s, dtype=torch.long)
        # Exactly round(15%) labelled rows, as mlm_step_bench.
        self.masked = max(1, int(MASK_PROB * n + 0.5))
        rows = torch.randperm(n, generator=g)[: self.masked].sort().values
        labels = torch.full((n,), -100, dtype=torch.long)
        labels[rows] = torch.randint(1, vocab, (self.masked,), generator=g)
        self.labels = labels.view(b, s)
        self.rows, self.targets = rows, labels[rows]
        for name in ("ids", "types", "mask", "labels", "rows", "targets"):
            setattr(self, name, getattr(self, name).to(device))


class Runner:
    """One set-up: a module whose forward returns the loss, its AdamW, and the step."""

    def __init__(self, module, args, device, head):
        self.module = module.to(device).train()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        fused = {"fused": True} if device.type == "cuda" else {}
        try:
            self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.01, eps=1e-6, **fused)
        except TypeError:  # an older torch without fused AdamW
            self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.01, eps=1e-6)
        self.call = module
        self.args, self.device, self.head = args, device, head
        self.batch = None

    def compile(self):
        self.call = torch.compile(self.module, dynamic=False)

    def set_batch(self, b, s):
        self.batch = None
        self.batch = Batch(b, s, SIZES[self.args.size]["vocab_size"], self.device)

    def inputs(self):
        x = self.batch
        if self.head == "masked" and isinstance(self.module, MaskedRowsLM):
            return (x.ids, x.types, x.mask, x.rows, x.targets)
        return (x.ids, x.types, x.mask, x.labels)

    def step(self):
        if self.args.simulate_oom_tokens and self.batch.ids.numel() > self.args.simulate_oom_tokens:
            raise SimulatedOom(f"simulated out of memory: {self.batch.ids.numel()} tokens")
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.args.precision == "bf16"):
            loss = self.call(*self.inputs())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        value = float(loss)  # waits for the device
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return value

    def recover(self):
        """After an out-of-memory error: what the failed step held, given back."""
        self.batch = None
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def reset_peak(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_mb(self):
        if self.device.type != "cuda":
            return None, None
        return (torch.cuda.max_memory_allocated(self.device) / 2**20,
                torch.cuda.max_memory_reserved(self.device) / 2**20)


def try_batch(runner, b, s):
    try:
        runner.set_batch(b, s)
        runner.reset_peak()
        t0 = time.perf_counter()
        runner.step()
        return {"batch": b, "fits": True, "peak_reserved_mb": runner.peak_mb()[1],
                "step_s": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001
        if not is_oom(e):
            raise
    # Outside the except block: its traceback holds the failed step's frames and tensors.
    runner.recover()
    return {"batch": b, "fits": False}


def search_batch(runner, s, args, start, upwards, trials):
    """The largest batch that fits: doubling from `start` (if `upwards`) while a step takes at
    most --max-step-s, halving if it does not fit."""
    cap = max(1, args.max_tokens // s)
    b = min(cap, start)
    trials.append(try_batch(runner, b, s))
    if not trials[-1]["fits"]:
        while b > 1 and not trials[-1]["fits"]:
            b //= 2
            trials.append(try_batch(runner, b, s))
        return b if trials[-1]["fits"] else 0
    while upwards and b * 2 <= cap and trials[-1]["step_s"] <= args.max_step_s:
        trials.append(try_batch(runner, b * 2, s))
        if not trials[-1]["fits"]:
            break
        b *= 2
    # Stopped by --max-tokens alone: the cap's own batch too, as mlm_step_bench does.
    if upwards and b < cap and trials[-1]["fits"] and trials[-1]["step_s"] <= args.max_step_s:
        trials.append(try_batch(runner, cap, s))
        if trials[-1]["fits"]:
            b = cap
    return b


def measure(runner, setup, s, args, start, upwards):
    row = dict(framework=framework_name(args), setup=setup,
               device=str(runner.device), precision=args.precision, seq=s,
               head="masked rows" if args.head == "masked" else "all rows")
    trials = []
    b = args.batch or search_batch(runner, s, args, start, upwards, trials)
    row["search"] = trials
    if not b:
        row.update(status="error", message="not even a micro-batch of one sequence fits")
        return row, 0
    runner.set_batch(b, s)
    for _ in range(args.warmup):
        runner.step()
    runner.reset_peak()
    times, loss = [], float("nan")
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = runner.step()
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    allocated, reserved = runner.peak_mb()
    row.update(status="ok" if math.isfinite(loss) else "error", batch=b, tokens=b * s,
               masked=runner.batch.masked, loss=loss, step_ms=1e3 * step_s, tokens_per_s=b * s / step_s,
               peak_allocated_mb=allocated, peak_reserved_mb=reserved, steps=args.steps)
    if not math.isfinite(loss):
        row["message"] = "non-finite loss"
    runner.batch = None
    return row, b


def framework_name(args):
    return "transformers" if args.model == "hf" else "torch stand-in"


def make_module(args, transformers, attn, max_len):
    if args.model == "standin":
        return StandIn(args.size, max_len, args.head == "masked")
    model = build_hf(transformers, args.size, max_len, attn)
    return MaskedRowsLM(model) if args.head == "masked" else FullHeadLM(model)


def free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--seq", default="128,512,1536", help="comma-separated sequence lengths")
    ap.add_argument("--setups", default="eager,sdpa,compile")
    ap.add_argument("--head", choices=["masked", "full"], default="masked")
    ap.add_argument("--precision", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--model", choices=["hf", "standin"], default="hf")
    ap.add_argument("--batch", type=int, default=0, help="this batch only, no search")
    ap.add_argument("--start-batch", type=int, default=0, help="default: 8192 tokens' worth")
    ap.add_argument("--max-tokens", type=int, default=1 << 17)
    ap.add_argument("--max-step-s", type=float, default=3.0,
                    help="the search stops doubling after a step this long (as mlm_step_bench)")
    ap.add_argument("--simulate-oom-tokens", type=int, default=0,
                    help="tests: a step of more tokens fails as out of memory")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    seqs = [int(s) for s in args.seq.split(",") if s]
    setups = [s for s in args.setups.split(",") if s]
    for s in setups:
        if s not in ("eager", "compile", "sdpa"):
            ap.error(f"--setups: unknown set-up {s!r} (eager, compile, sdpa)")
    if "compile" in setups and "eager" not in setups:
        ap.error("--setups: compile takes its batch from the eager search: list eager too")
    if device.type == "cuda" and args.precision == "f32":
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, as ours
    torch.manual_seed(0)
    out = open(args.json, "a") if args.json else None

    transformers, missing = (None, None) if args.model == "standin" else load_transformers()
    print(f"torch {torch.__version__}, transformers "
          f"{getattr(transformers, '__version__', 'missing') if args.model == 'hf' else 'not used (stand-in)'}, "
          f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"{'setup':<22} {'seq':>6} {'batch':>6} {'tokens/s':>12} {'step ms':>9} {'peak MiB':>10} {'reserved':>10}")

    def emit(row):
        if row["status"] == "ok":
            fmt = lambda v: f"{v:10.0f}" if v is not None else f"{'-':>10}"  # noqa: E731
            print(f"{row['setup']:<22} {row['seq']:>6} {row['batch']:>6} {row['tokens_per_s']:>12.0f} "
                  f"{row['step_ms']:>9.1f} {fmt(row['peak_allocated_mb'])} {fmt(row['peak_reserved_mb'])}")
        else:
            print(f"{row['setup']:<22} {row['seq']:>6}  {row['status']}: {row.get('message', '')}")
        sys.stdout.flush()
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    max_len = max(seqs)
    framework = framework_name(args)
    ran = 0
    for s in seqs:
        eager_batch = 0
        for setup in setups:
            prefix = "hf" if args.model == "hf" else "stand-in"
            name = f"{prefix} {setup}" + (" full head" if args.head == "full" else "")
            row = dict(framework=framework, setup=name, device=str(device), precision=args.precision, seq=s)
            if missing:
                emit(dict(row, status="skip", message=missing))
                continue
            if setup == "sdpa" and args.model == "standin":
                emit(dict(row, status="skip", message="the stand-in has one attention implementation"))
                continue
            if setup == "compile" and not hasattr(torch, "compile"):
                emit(dict(row, status="skip", message=f"torch {torch.__version__} has no torch.compile"))
                continue
            if setup == "compile" and not eager_batch:
                emit(dict(row, status="skip", message="no eager batch to compile at"))
                continue
            attn = "sdpa" if setup == "sdpa" else "eager"
            try:
                runner = Runner(make_module(args, transformers, attn, max_len), args, device, args.head)
            except Exception as e:  # noqa: BLE001
                if setup == "sdpa":  # transformers does not offer SDPA for RoFormer
                    emit(dict(row, status="skip", message=f"attn_implementation='sdpa' refused: {e}"))
                else:
                    emit(dict(row, status="error", message=f"building the model: {type(e).__name__}: {e}"))
                continue
            if setup == "compile":
                runner.compile()
            start = eager_batch if setup != "eager" else (args.start_batch or max(1, 8192 // s))
            t0 = time.perf_counter()
            try:
                result, b = measure(runner, name, s, args, start, upwards=setup != "compile")
            except Exception as e:  # noqa: BLE001
                result, b = dict(row, status="error", message=f"{type(e).__name__}: {e}"), 0
            result["wall_s"] = round(time.perf_counter() - t0, 1)
            if setup == "eager":
                eager_batch = b
            ran += result["status"] == "ok"
            emit(result)
            del runner
            free(device)
    if out:
        out.close()
    if missing:
        print(f"SKIP: {missing}")
        return 77
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
