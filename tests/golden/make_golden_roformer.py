#!/usr/bin/env python3
"""Writes the golden RoFormer fixtures the C++ model tests compare against.

  tests/fixtures/golden_roformer_mlm.h5  RoFormerForMaskedLM
  tests/fixtures/golden_roformer_cls.h5  RoFormerForSequenceClassification (3 labels)

Each file holds a small model's weights under their Hugging Face names
(group `weights`), the inputs (input_ids, token_type_ids, attention_mask,
labels), the logits, the loss and the gradient of every parameter (group
`grads`), all computed in float64 from float32-representable weights, and
attributes saying which reference produced them.

The reference is transformers' RoFormerForMaskedLM / RoFormerForSequence-
Classification when `import transformers` works. Otherwise (as on the machine
that made the committed files: Debian's python3-torch, no PyPI) it is the
independent re-implementation below, which mirrors transformers'
modeling_roformer.py line by line: the sinusoidal table of
RoFormerSinusoidalPositionalEmbedding (sin | cos halves, float32 values),
apply_rotary_position_embeddings with the
`torch.stack([-q[..., 1::2], q[..., ::2]], -1).reshape_as(q)` rotation, the
extended attention mask (1 - mask) * finfo.min, post-LN layers, erf GELU,
LayerNorm eps 1e-12 and the decoder tied to the word embedding plus
cls.predictions.bias.

Run with the system interpreter (torch, numpy, h5py from Debian):
  /usr/bin/python3 tests/golden/make_golden_roformer.py

On a machine with transformers (the GPU machine: scripts/gpu_check.sh run),
`--require-transformers --out-dir DIR` refuses the fallback, and also runs
the re-implementation on the same weights and inputs and prints how far it
is from transformers (kept in the attribute `reimplementation_max_rel_diff`).
"""

import argparse
import json
import math
import os

import h5py
import numpy as np
import torch
from torch import nn

try:
    import transformers  # noqa: F401

    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

CONFIG = dict(
    vocab_size=1000,
    embedding_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    hidden_act="gelu",
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    max_position_embeddings=64,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    initializer_range=0.02,
    rotary_value=False,
    pad_token_id=0,
)
BATCH, SEQ, PAD_ROW_LENGTH, NUM_LABELS = 2, 48, 37, 3
SEED = 20240611


# --- independent re-implementation of transformers' modeling_roformer.py -----------------


class SinusoidalPositionalEmbedding(nn.Module):
    """RoFormerSinusoidalPositionalEmbedding: sin in the first half, cos in the second."""

    def __init__(self, num_positions, dim):
        super().__init__()
        position_enc = np.array(
            [[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(num_positions)]
        )
        out = torch.empty(num_positions, dim, dtype=torch.float64)
        sentinel = dim // 2
        # transformers builds the table as a FloatTensor: float32 values.
        out[:, 0:sentinel] = torch.FloatTensor(np.sin(position_enc[:, 0::2])).double()
        out[:, sentinel:] = torch.FloatTensor(np.cos(position_enc[:, 1::2])).double()
        self.register_buffer("weight", out, persistent=False)

    def forward(self, seq_len):
        return self.weight[:seq_len]


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["embedding_size"], padding_idx=c["pad_token_id"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["embedding_size"])
        self.LayerNorm = nn.LayerNorm(c["embedding_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, input_ids, token_type_ids):
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c["num_attention_heads"]
        self.head_size = c["hidden_size"] // self.heads
        self.query = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.key = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.value = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.dropout = nn.Dropout(c["attention_probs_dropout_prob"])
        self.rotary_value = c["rotary_value"]

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_size).transpose(1, 2)

    @staticmethod
    def rotate(sinusoidal_pos, x):
        sin, cos = sinusoidal_pos.chunk(2, dim=-1)
        sin_pos = torch.stack([sin, sin], dim=-1).reshape_as(sinusoidal_pos)
        cos_pos = torch.stack([cos, cos], dim=-1).reshape_as(sinusoidal_pos)
        rotate_half = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape_as(x)
        return x * cos_pos + rotate_half * sin_pos

    def forward(self, hidden, extended_mask, sinusoidal_pos):
        q = self.split(self.query(hidden))
        k = self.split(self.key(hidden))
        v = self.split(self.value(hidden))
        q = self.rotate(sinusoidal_pos, q)
        k = self.rotate(sinusoidal_pos, k)
        if self.rotary_value:
            v = self.rotate(sinusoidal_pos, v)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        scores = scores + extended_mask
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)


class ResidualOutput(nn.Module):
    def __init__(self, c, fan_in):
        super().__init__()
        self.dense = nn.Linear(fan_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = ResidualOutput(c, c["hidden_size"])

    def forward(self, hidden, extended_mask, sinusoidal_pos):
        return self.output(self.self(hidden, extended_mask, sinusoidal_pos), hidden)


class Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        return nn.functional.gelu(self.dense(x))  # erf form, transformers' "gelu"


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = ResidualOutput(c, c["intermediate_size"])

    def forward(self, hidden, extended_mask, sinusoidal_pos):
        attended = self.attention(hidden, extended_mask, sinusoidal_pos)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_positions = SinusoidalPositionalEmbedding(
            c["max_position_embeddings"], c["hidden_size"] // c["num_attention_heads"]
        )
        self.layer = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])

    def forward(self, hidden, extended_mask):
        sinusoidal_pos = self.embed_positions(hidden.shape[1])[None, None, :, :]
        for layer in self.layer:
            hidden = layer(hidden, extended_mask, sinusoidal_pos)
        return hidden


class RoFormerModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embeddings = Embeddings(c)
        if c["embedding_size"] != c["hidden_size"]:
            self.embeddings_project = nn.Linear(c["embedding_size"], c["hidden_size"])
        self.encoder = Encoder(c)

    def forward(self, input_ids, attention_mask, token_type_ids):
        dtype = self.embeddings.LayerNorm.weight.dtype
        extended = attention_mask[:, None, None, :].to(dtype)
        extended = (1.0 - extended) * torch.finfo(dtype).min
        x = self.embeddings(input_ids, token_type_ids)
        if hasattr(self, "embeddings_project"):
            x = self.embeddings_project(x)
        return self.encoder(x, extended)


class PredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["embedding_size"])
        self.LayerNorm = nn.LayerNorm(c["embedding_size"], eps=c["layer_norm_eps"])

    def forward(self, x):
        return self.LayerNorm(nn.functional.gelu(self.dense(x)))


class LMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = PredictionHeadTransform(c)
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))

    def forward(self, x, decoder_weight):
        return nn.functional.linear(self.transform(x), decoder_weight, self.bias)


class OnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = LMPredictionHead(c)


class RoFormerForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.roformer = RoFormerModel(c)
        self.cls = OnlyMLMHead(c)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        hidden = self.roformer(input_ids, attention_mask, token_type_ids)
        logits = self.cls.predictions(hidden, self.roformer.embeddings.word_embeddings.weight)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return loss, logits


class ClassificationHead(nn.Module):
    def __init__(self, c, num_labels):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])
        self.out_proj = nn.Linear(c["hidden_size"], num_labels)

    def forward(self, features):
        x = self.dropout(features[:, 0, :])
        x = nn.functional.gelu(self.dense(x))
        return self.out_proj(self.dropout(x))


class RoFormerForSequenceClassification(nn.Module):
    def __init__(self, c, num_labels):
        super().__init__()
        self.roformer = RoFormerModel(c)
        self.classifier = ClassificationHead(c, num_labels)

    def forward(self, input_ids, attention_mask, token_type_ids, labels):
        logits = self.classifier(self.roformer(input_ids, attention_mask, token_type_ids))
        return nn.functional.cross_entropy(logits, labels), logits


# --- transformers, when it is installed -----------------------------------------------------


def transformers_model(kind):
    cfg = transformers.RoFormerConfig(**CONFIG, num_labels=NUM_LABELS)
    if kind == "mlm":
        model = transformers.RoFormerForMaskedLM(cfg)
    else:
        model = transformers.RoFormerForSequenceClassification(cfg)
    return model.double().eval()


def run_transformers(model, kind, weights, inputs):
    try:  # tied parameters under every name (torch >= 2.0)
        own = dict(model.named_parameters(remove_duplicate=False))
    except TypeError:
        own = dict(model.named_parameters())
    state = {name: torch.from_numpy(value).double() for name, value in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    # Only the tied decoder and the fixed sinusoidal table may be absent.
    assert all(("decoder" in m) or ("embed_positions" in m) for m in missing), missing
    out = model(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        token_type_ids=inputs["token_type_ids"],
        labels=inputs["labels"],
    )
    out.loss.backward()
    grads = {name: own[name].grad for name in weights}
    return out.loss, out.logits, grads


# --- data -------------------------------------------------------------------------------------


def make_weights(model, gen):
    """Random float32-representable weights, larger than BERT's init so that
    attention is peaked and rotation errors show in the logits."""
    weights = {}
    for name, p in model.named_parameters():
        if name.endswith("LayerNorm.weight"):
            w = 1.0 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        elif name.endswith("bias"):
            w = 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        elif "embeddings" in name:
            w = 0.25 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        else:
            w = 0.15 * torch.randn(p.shape, generator=gen, dtype=torch.float64)
        weights[name] = w.float().numpy()
    return weights


def make_inputs(gen, kind):
    ids = torch.randint(5, CONFIG["vocab_size"], (BATCH, SEQ), generator=gen)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, PAD_ROW_LENGTH:] = 0
    ids[1, PAD_ROW_LENGTH:] = CONFIG["pad_token_id"]
    types = torch.zeros(BATCH, SEQ, dtype=torch.long)
    types[0, 20:] = 1
    types[1, 15:PAD_ROW_LENGTH] = 1
    if kind == "mlm":
        labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
        for b, length in ((0, SEQ), (1, PAD_ROW_LENGTH)):
            picks = torch.randperm(length, generator=gen)[: max(5, int(0.15 * length) + 1)]
            labels[b, picks] = torch.randint(0, CONFIG["vocab_size"], (len(picks),), generator=gen)
    else:
        labels = torch.tensor([2, 0], dtype=torch.long)
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels)


def write(path, kind, weights, inputs, loss, logits, grads, reference):
    with h5py.File(path, "w") as f:
        f.attrs["reference"] = reference
        f.attrs["model"] = "RoFormerForMaskedLM" if kind == "mlm" else "RoFormerForSequenceClassification"
        f.attrs["config"] = json.dumps(dict(CONFIG, num_labels=NUM_LABELS) if kind == "cls" else CONFIG)
        f.attrs["torch_version"] = str(torch.__version__)
        f.attrs["computed_in"] = "float64 from float32 weights and inputs; stored as float32 (loss float64)"
        f.attrs["generator"] = "tests/golden/make_golden_roformer.py"
        for name, value in inputs.items():
            f.create_dataset(name, data=value.numpy().astype(np.int32))
        f.create_dataset("loss", data=np.float64(loss.item()))
        f.create_dataset("logits", data=logits.detach().numpy().astype(np.float32))
        w = f.create_group("weights")
        g = f.create_group("grads")
        for name in weights:
            w.create_dataset(name, data=weights[name])
            g.create_dataset(name, data=grads[name].numpy().astype(np.float32))


def max_rel_diff(a, b):
    """max |a - b| / max |b| over tensors of one shape."""
    a, b = a.detach().double(), b.detach().double()
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def reimplementation_diff(ours, weights, inputs, loss, logits, grads):
    """How far the in-repo re-implementation is from transformers on the same data."""
    ours.load_state_dict({k: torch.from_numpy(v).double() for k, v in weights.items()})
    ours.zero_grad()
    l2, z2 = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], inputs["labels"])
    l2.backward()
    own = dict(ours.named_parameters())
    worst = max(max_rel_diff(own[name].grad, grads[name]) for name in weights)
    return dict(
        loss=abs(l2.item() - loss.item()) / abs(loss.item()),
        logits=max_rel_diff(z2, logits),
        grads=worst,
    )


def build(kind, out_dir, gen):
    c = CONFIG
    ours = RoFormerForMaskedLM(c) if kind == "mlm" else RoFormerForSequenceClassification(c, NUM_LABELS)
    ours = ours.double()
    weights = make_weights(ours, gen)
    inputs = make_inputs(gen, kind)
    if HAVE_TRANSFORMERS:
        model = transformers_model(kind)
        loss, logits, grads = run_transformers(model, kind, weights, inputs)
        reference = f"transformers {transformers.__version__} {type(model).__name__} (float64)"
        diff = reimplementation_diff(ours, weights, inputs, loss, logits, grads)
        print(f"{kind}: in-repo re-implementation vs {reference}: " + ", ".join(f"{k} {v:.2e}" for k, v in diff.items()))
    else:
        ours.load_state_dict({k: torch.from_numpy(v).double() for k, v in weights.items()})
        loss, logits = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"], inputs["labels"])
        loss.backward()
        grads = {name: p.grad for name, p in ours.named_parameters()}
        target = "RoFormerForMaskedLM" if kind == "mlm" else "RoFormerForSequenceClassification"
        reference = (
            f"independent PyTorch re-implementation of transformers {target}; "
            "transformers not available"
        )
    path = os.path.join(out_dir, f"golden_roformer_{kind}.h5")
    write(path, kind, weights, inputs, loss, logits, grads, reference)
    if HAVE_TRANSFORMERS:
        with h5py.File(path, "a") as f:
            f.attrs["reimplementation_max_rel_diff"] = json.dumps(diff)
    print(f"{path}: {os.path.getsize(path)} bytes, loss {loss.item():.10f}, reference: {reference}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.join(here, "..", "fixtures"))
    parser.add_argument(
        "--require-transformers",
        action="store_true",
        help="fail instead of falling back to the in-repo re-implementation",
    )
    args = parser.parse_args()
    if args.require_transformers and not HAVE_TRANSFORMERS:
        raise SystemExit("make_golden_roformer: --require-transformers, but `import transformers` failed")
    os.makedirs(args.out_dir, exist_ok=True)
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(SEED)
    for kind in ("mlm", "cls"):
        build(kind, args.out_dir, gen)


if __name__ == "__main__":
    main()
