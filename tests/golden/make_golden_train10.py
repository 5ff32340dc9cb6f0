#!/usr/bin/env python3
"""Writes tests/fixtures/golden_train10.h5: ten training steps of a small
RoFormer MLM, the end-to-end golden state the C++ trainer APIs are checked
against (as llm.c's test_gpt2 checks its training loop against PyTorch).

The model is transformers' RoFormerForMaskedLM when `import transformers`
works, else the independent PyTorch re-implementation of Hugging Face's
modeling_roformer.py in make_golden_roformer.py (imported, not copied); the
`reference` attribute says which. It runs in float64 from
float32-representable weights with dropout off, so the reference is
deterministic. Each step: forward on that step's batch, backward, global-norm
clipping (torch.nn.utils.clip_grad_norm_), torch.optim.AdamW with two parameter
groups (no weight decay for biases and LayerNorm parameters, the rule of
optim::decays_by_default), and the learning rate of optim::LrSchedule (linear
warm-up (s + 1) / W, then linear decay to min_lr_ratio at the last step)
through torch.optim.lr_scheduler.LambdaLR.

The file holds:
  attrs     reference, config and optim (JSON), torch version, generator, and
            f32_noise (JSON): how far the same run in float32 PyTorch lands
            from the float64 one, the scale the C++ tolerances are set against
  weights/  initial parameters (Hugging Face names, float32)
  input_ids, token_type_ids, attention_mask, labels   [steps, batch, seq] int32
  logits    [batch, seq, vocab] at step 0 (float32), loss (float64, step 0)
  grads/    every parameter's gradient at step 0 (before clipping, float32)
  losses, grad_norms, lrs   [steps] float64: loss, pre-clip norm and learning
            rate of each step
  final_weights/   parameters after the last step (float32)

Run with the system interpreter (torch, numpy, h5py from Debian):
  /usr/bin/python3 tests/golden/make_golden_train10.py
"""

import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_roformer as ref  # noqa: E402  (the model only; its outputs are untouched)

CONFIG = dict(
    ref.CONFIG,
    vocab_size=100,
    embedding_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
)
OPTIM = dict(
    lr=5e-3,
    warmup_steps=3,
    min_lr_ratio=0.1,
    betas=[0.9, 0.999],
    eps=1e-6,
    weight_decay=0.1,
    clip_grad_norm=5.0,  # between the norms seen: some steps clip, some do not
)
STEPS, BATCH, SEQ = 10, 4, 16
ROW_LENGTHS = (SEQ, 11, SEQ, 13)  # rows 1 and 3 end in padding
SEED = 20261122


def decays(name):
    """optim::decays_by_default: no decay for biases and LayerNorm parameters."""
    return not name.endswith(".bias") and "LayerNorm" not in name


def lr_factor(step):
    """optim::LrSchedule (linear kind, one stage of STEPS steps) over the peak lr."""
    w = OPTIM["warmup_steps"]
    if step < w:
        return (step + 1) / w
    progress = min(max((step - w) / max(STEPS - w, 1), 0.0), 1.0)
    return 1.0 - (1.0 - OPTIM["min_lr_ratio"]) * progress


def make_batches(gen):
    v = CONFIG["vocab_size"]
    ids = torch.randint(5, v, (STEPS, BATCH, SEQ), generator=gen)
    mask = torch.zeros(STEPS, BATCH, SEQ, dtype=torch.long)
    types = torch.zeros(STEPS, BATCH, SEQ, dtype=torch.long)
    labels = torch.full((STEPS, BATCH, SEQ), -100, dtype=torch.long)
    for s in range(STEPS):
        for b, length in enumerate(ROW_LENGTHS):
            mask[s, b, :length] = 1
            ids[s, b, length:] = CONFIG["pad_token_id"]
            split = int(torch.randint(2, length - 1, (1,), generator=gen))
            types[s, b, split:length] = 1
            picks = torch.randperm(length, generator=gen)[: max(2, int(0.15 * length) + 1)]
            labels[s, b, picks] = torch.randint(0, v, (len(picks),), generator=gen)
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)


def make_model(weights, dtype):
    """(model, forward(batch) -> (loss, logits)): transformers' RoFormerForMaskedLM
    when it is installed, else the re-implementation in make_golden_roformer.py."""
    state = {k: torch.from_numpy(w).to(dtype) for k, w in weights.items()}
    if ref.HAVE_TRANSFORMERS:
        model = ref.transformers.RoFormerForMaskedLM(ref.transformers.RoFormerConfig(**CONFIG)).to(dtype)
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        # Only the tied decoder and the fixed sinusoidal table may be absent.
        assert all(("decoder" in m) or ("embed_positions" in m) for m in missing), missing

        def forward(b):
            out = model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"],
                labels=b["labels"],
            )
            return out.loss, out.logits

    else:
        model = ref.RoFormerForMaskedLM(CONFIG).to(dtype)
        model.load_state_dict(state)

        def forward(b):
            return model(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"])

    model.train()  # dropout probabilities are 0: training mode changes nothing else
    return model, forward


def train(weights, batches, dtype):
    """The ten steps in `dtype`; returns the recorded state."""
    model, forward = make_model(weights, dtype)
    # Trainable parameters, each once (transformers' sinusoidal table is frozen,
    # its decoder weight and bias are the word embedding and cls.predictions.bias).
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(n for n, _ in named) == sorted(weights), sorted(n for n, _ in named)
    groups = [
        dict(params=[p for n, p in named if decays(n)], weight_decay=OPTIM["weight_decay"]),
        dict(params=[p for n, p in named if not decays(n)], weight_decay=0.0),
    ]
    opt = torch.optim.AdamW(groups, lr=OPTIM["lr"], betas=tuple(OPTIM["betas"]), eps=OPTIM["eps"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    out = dict(losses=[], grad_norms=[], lrs=[])
    for s in range(STEPS):
        opt.zero_grad()
        b = {k: v[s] for k, v in batches.items()}
        loss, logits = forward(b)
        loss.backward()
        if s == 0:
            out["logits"] = logits.detach().double().numpy()
            out["grads"] = {n: p.grad.double().numpy().copy() for n, p in named}
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in named], OPTIM["clip_grad_norm"])
        out["losses"].append(loss.item())
        out["grad_norms"].append(float(norm))
        out["lrs"].append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    out["final_weights"] = {n: p.detach().double().numpy().copy() for n, p in named}
    return out


def max_rel(a, b):
    """max |a - b| / max |b|, the measure the C++ test uses."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "fixtures", "golden_train10.h5"))
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(SEED)
    weights = ref.make_weights(ref.RoFormerForMaskedLM(CONFIG), gen)
    batches = make_batches(gen)
    r = train(weights, batches, torch.float64)
    r32 = train(weights, batches, torch.float32)
    noise = dict(
        f32_noise_logits=max_rel(r32["logits"], r["logits"]),
        f32_noise_grads=max(max_rel(r32["grads"][n], r["grads"][n]) for n in weights),
        f32_noise_losses=max(abs(a - b) / abs(b) for a, b in zip(r32["losses"], r["losses"])),
        f32_noise_final_weights=max(
            max_rel(r32["final_weights"][n], r["final_weights"][n]) for n in weights
        ),
    )
    with h5py.File(args.out, "w") as f:
        model = (
            f"transformers {ref.transformers.__version__} RoFormerForMaskedLM"
            if ref.HAVE_TRANSFORMERS
            else "independent PyTorch re-implementation of transformers RoFormerForMaskedLM "
            "(tests/golden/make_golden_roformer.py; transformers not available)"
        )
        f.attrs["reference"] = f"{model}, torch.optim.AdamW, clip_grad_norm_, LambdaLR"
        f.attrs["model"] = "RoFormerForMaskedLM"
        f.attrs["config"] = json.dumps(CONFIG)
        f.attrs["optim"] = json.dumps(dict(OPTIM, steps=STEPS))
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["computed_in"] = "float64 from float32 weights; stored as float32 (losses, norms, lrs float64)"
        f.attrs["generator"] = "tests/golden/make_golden_train10.py"
        f.attrs["f32_noise"] = json.dumps(noise)
        for name, value in batches.items():
            f.create_dataset(name, data=value.numpy().astype(np.int32))
        f.create_dataset("logits", data=r["logits"].astype(np.float32))
        f.create_dataset("loss", data=np.float64(r["losses"][0]))
        for key in ("losses", "grad_norms", "lrs"):
            f.create_dataset(key, data=np.asarray(r[key], np.float64))
        for group, values in (("weights", weights), ("grads", r["grads"]), ("final_weights", r["final_weights"])):
            g = f.create_group(group)
            for name in weights:
                g.create_dataset(name, data=np.asarray(values[name], np.float32))
    print(f"{args.out}: {os.path.getsize(args.out)} bytes")
    print("losses    ", " ".join(f"{x:.6f}" for x in r["losses"]))
    print("grad norms", " ".join(f"{x:.4f}" for x in r["grad_norms"]))
    print("lrs       ", " ".join(f"{x:.2e}" for x in r["lrs"]))
    print("float32 torch vs float64:", ", ".join(f"{k} {v:.2e}" for k, v in noise.items()))


if __name__ == "__main__":
    main()
