"""OWL against a reference written here step by step from the released code (luuyin/OWL,
lib/prune_all.py at 1f0912de: prune_wanda_outlier, prune_sparsegpt_outlier, prune_mag_outlier, with
Wanda's WrappedGPT.add_batch), and its scores shared through the score cache."""

from __future__ import annotations


import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pytest
import torch

from conftest import compose_cfg
from prunebench.api.errors import ConfigError
from prunebench.job import run
from prunebench.pruning import score_identity
from prunebench.pruners.owl import OWLPruner, layer_sparsities
from prunebench.report.build import write_report
from prunebench.validate import validate
from helpers.unstructured import calib
from helpers.owl import LAYERS, released_layer_sparsities, released_outlier_ratios, tiny_with_outliers

pytestmark = pytest.mark.usefixtures("one_thread")










def released_pruned_count(base: str, weight: torch.Tensor, sparsity: float) -> int:
    """How many weights of one Linear the release's base removes at `sparsity` (no ties in float
    scores): Wanda int(cols x s) per row; magnitude `W <= sort(W)[int(numel x s)]`, int(numel x s) + 1;
    SparseGPT the same rule per block of 128 columns (fasterprune's mask1)."""
    rows, cols = weight.shape
    if base == "wanda":
        return rows * int(cols * sparsity)
    if base == "magnitude":
        return int(weight.numel() * sparsity) + 1
    return sum(int(rows * min(128, cols - start) * sparsity) + 1 for start in range(0, cols, 128))


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
@pytest.mark.parametrize("m, lamda", [(5, 0.08), (3, 0.2)])
def test_layer_sparsities_are_the_released_ones(sparsity, m, lamda):
    loaded = tiny_with_outliers()
    cal = calib()
    reference = released_outlier_ratios(loaded.model, cal.samples(loaded.tokenizer), m)
    expected = released_layer_sparsities(reference, sparsity, lamda)
    pruner = OWLPruner(m=m, lamda=lamda)
    scores = pruner.score(loaded, cal)
    # rounding-level differences in the metric (float64 sums vs a float32 running mean) could move a
    # score across M x mean only if one sat within an ulp of it: none does here, so counts match exactly
    assert list(scores["outliers"].values()) == reference
    assert pruner.block_sparsities(scores["outliers"], LAYERS, sparsity) == expected
    assert max(expected) - min(expected) > lamda  # far from uniform: a uniform pruner fails every check here
    assert np.mean(expected) == pytest.approx(sparsity, abs=1e-12)  # float64 sums of four numbers


@pytest.mark.parametrize("base", ["wanda", "sparsegpt", "magnitude"])
def test_each_block_is_pruned_at_its_released_sparsity(base):
    loaded = tiny_with_outliers()
    cal = calib()
    ratios = released_outlier_ratios(loaded.model, cal.samples(loaded.tokenizer), 5)
    expected = released_layer_sparsities(ratios, 0.6, 0.08)
    pruner = OWLPruner(base=base)
    stats = pruner.apply(loaded, pruner.score(loaded, cal), 0.6)
    for index, layer in enumerate(loaded.model.model.layers):
        weights = [m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)]
        count = sum(released_pruned_count(base, w, expected[index]) for w in weights)
        assert stats[f"sparsity/layer_{index}"] == count / sum(w.numel() for w in weights), index
        assert sum(int((w == 0).sum()) for w in weights) == count, index
    assert stats["sparsity/actual"] == pytest.approx(0.6, abs=0.01)  # per-row floors and +1s


def test_the_edges_the_release_leaves_open():
    # equal outlier ratios: the release divides 0 by 0 (NaN sparsities); every block gets the target
    assert layer_sparsities([2.0, 2.0, 2.0], 0.5, 0.08) == [0.5, 0.5, 0.5]
    # a block pushed to or below 0 takes the release's 0.01; one pushed past 1 is refused
    assert layer_sparsities([0.0, 1.0], 0.05, 0.08) == [pytest.approx(0.13, abs=1e-12), 0.01]
    with pytest.raises(ValueError, match="lower pruner.lamda"):
        layer_sparsities([0.0, 1.0], 0.95, 0.08)


def test_skipped_blocks_stay_dense_and_the_others_average_the_target():
    loaded = tiny_with_outliers()
    pruner = OWLPruner(skip_layers=[0], base="magnitude")
    scores = pruner.score(loaded, calib())
    assert list(scores["outliers"]) == [1, 2, 3]
    per_block = pruner.block_sparsities(scores["outliers"], LAYERS, 0.5)
    assert per_block[0] == 0.0 and np.mean(per_block[1:]) == pytest.approx(0.5, abs=1e-12)
    stats = pruner.apply(loaded, scores, 0.5)
    assert stats["sparsity/layer_0"] == 0.0 and stats["sparsity/layer_1"] != stats["sparsity/layer_2"]


def test_n_m_patterns_and_owl_owned_options_are_refused():
    with pytest.raises(ValueError, match="N:M"):
        OWLPruner(base_options={"pattern": "2:4"})
    with pytest.raises(ValueError, match="modules"):
        OWLPruner(base="sparsegpt", base_options={"modules": ["mlp"]})
    with pytest.raises(ValueError, match="base="):
        OWLPruner(base="dsnot")
    with pytest.raises(ConfigError, match="N:M"):
        validate(compose_cfg(["model=tiny-llama", "pruner=owl", "+pruner.base_options.pattern='2:4'", "sparsity=0.5"]))
    with pytest.raises(ConfigError, match="owl_wanda.*cannot apply"):
        validate(compose_cfg(["model=tiny-mixtral", "pruner=owl", "sparsity=0.5"]))


def test_the_score_key_leaves_out_base_lambda_and_sparsity_but_not_m():
    def key(*overrides):
        return score_identity(compose_cfg(["model=tiny-llama", "calib=wikitext2", *overrides]), True)

    first = key("pruner=owl", "sparsity=0.5")
    assert first == key("pruner=owl_sparsegpt", "sparsity=0.7", "pruner.lamda=0.2", "+pruner.base_options.damp=0.1")
    assert first == key("pruner=owl", "pruner.base=magnitude")
    assert first == key("pruner=owl", "pruner.sequential=false")  # the outlier pass is on the dense model either way
    assert first != key("pruner=owl", "pruner.m=3")
    assert key("pruner=wanda")["pruner"]["scope"] == "row"  # other pruners' keys keep every option


def test_one_scoring_serves_every_base_and_sparsity(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    words = " ".join(f"w{i % 37}x{i % 11}" for i in range(3000))
    for split in ("train", "test"):
        (tmp_path / "wikitext2" / f"wiki.{split}.raw").write_text(f" = {split} = \n {words} \n")
    common = ["model=tiny-llama", "model.config.num_hidden_layers=3", "task=wikitext2_ppl", f"++data_dir={tmp_path}",
              "task.tasks.wikitext2_ppl.seq_len=32", "task.tasks.wikitext2_ppl.max_windows=2", "calib=wikitext2",
              "calib.n_samples=4", "calib.seq_len=32", "trainer.enable_progress_bar=false"]
    jobs = [["pruner=owl", "sparsity=0.5"], ["pruner=owl_sparsegpt", "sparsity=0.7"],
            ["pruner=owl", "pruner.base=magnitude", "pruner.lamda=0.2", "sparsity=0.6"]]
    results = [run(compose_cfg([*common, *job])) for job in jobs]
    mlflow.set_tracking_uri(store)
    runs = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])
    pruned = runs[runs["tags.prunebench.pruner"] != "none"]
    assert list(pruned["tags.prunebench.pruner"]) == ["owl_wanda", "owl_sparsegpt", "owl_magnitude"]
    assert list(pruned["tags.prunebench.score_cache"]) == ["miss", "hit", "hit"]
    for metrics, (*_, sparsity) in zip(results, jobs):
        layers = [metrics[f"sparsity/layer_{i}"] for i in range(3)]
        target = float(sparsity.split("=")[1])
        assert max(layers) - min(layers) > 0.01 and np.mean(layers) == pytest.approx(target, abs=0.02)
        assert all(metrics[f"outliers/layer_{i}"] == results[0][f"outliers/layer_{i}"] for i in range(3))
    out = write_report("prunebench", None, tmp_path / "report")
    figure = plt.imread(out / "layer_sparsity.png")  # a row for the model, a panel per target sparsity
    assert figure.shape[1] > 2.5 * figure.shape[0]
