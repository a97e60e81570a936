"""A tiny Llama config, a character-level calibration and the weights of its prunable linears, for the unstructured pruners' tests."""

from __future__ import annotations

import string

import torch

from prunebench.calibration import Calibration
from prunebench.corpora import TextCorpus

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


CHARS = string.ascii_letters + string.digits + string.punctuation + "    "


class Chars(TextCorpus):
    """Seeded random characters: many distinct tokens, so calibration inputs span every direction
    (a few repeated words would give a rank-deficient Hessian), and no file is needed."""

    def documents(self):
        gen = torch.Generator().manual_seed(0)
        return ["".join(CHARS[i] for i in torch.randint(len(CHARS), (6000,), generator=gen).tolist())]

    def data_ids(self):
        return {"chars"}


def calib(seed=0, n_samples=8, seq_len=32):
    return Calibration(Chars(), name="chars", n_samples=n_samples, seq_len=seq_len, seed=seed)


def linears(model):
    return {n: m for n, m in model.named_modules() if n.split(".")[-1] in PROJ}


def weights(model):
    return {n: m.weight.detach().clone() for n, m in linears(model).items()}

