#!/usr/bin/python3
"""The most-frequent-token baseline of masked-language-model accuracy for a
prepared corpus: always predict the token most frequent in the train shards;
its accuracy on the validation shards is that token's share of their tokens
(masking picks positions uniformly among the non-special tokens).
Usage: scripts/mlm_baseline.py SHARD_DIR VOCAB   (needs python3-h5py, numpy)"""
import json
import os
import sys

import h5py
import numpy as np

shard_dir, vocab_path = sys.argv[1], sys.argv[2]
with open(vocab_path, encoding="utf-8") as f:
    vocab = f.read().split("\n")
special = [vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in vocab]
with open(os.path.join(shard_dir, "manifest.json")) as f:
    manifest = json.load(f)


def counts(split):
    total = np.zeros(len(vocab), dtype=np.int64)
    for name in manifest[split]:
        with h5py.File(os.path.join(shard_dir, name), "r") as h:
            total += np.bincount(h["tokens"][:].astype(np.int64), minlength=len(vocab))
    total[special] = 0
    return total


train, val = counts("train"), counts("validation")
best = int(np.argmax(train))
print(f"most frequent train token: {vocab[best]!r} (id {best}), "
      f"{train[best] / train.sum():.2%} of train tokens")
print(f"baseline accuracy on validation: {val[best] / val.sum():.2%} "
      f"({val[best]} of {val.sum()} tokens)")
