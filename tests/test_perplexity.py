"""Perplexity over consecutive windows, against the model's own full logits, and as a whole job:
metric names, stability for lower-is-better, and scores cached across sparsities."""

from __future__ import annotations

import math

import mlflow
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from conftest import compose_cfg, reordered, shared_file
from prunebench.corpora import TextCorpus
from prunebench.evaluation.encoding import window_prefix
from prunebench.evaluation.perplexity.engine import window_nll
from prunebench.evaluation.registry import evaluation
from prunebench.evaluation.perplexity.windows import token_windows
from prunebench.job import run
from prunebench.models.tiny import load_tiny
from prunebench.tasks.perplexity import PerplexityTask
from helpers.texts import ARTICLE

CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


pytestmark = pytest.mark.usefixtures("one_thread")


class Article(TextCorpus):
    def documents(self):
        return [ARTICLE] * 6

    def data_ids(self):
        return {"article"}


def test_windows_are_consecutive_start_with_bos_and_drop_the_remainder():
    ids = list(range(100, 125))
    windows = token_windows(ids, 6, [1])
    assert windows.tolist() == [[1, *range(100 + 5 * i, 105 + 5 * i)] for i in range(5)]
    assert token_windows(ids, 6, []).tolist() == [list(range(100 + 6 * i, 106 + 6 * i)) for i in range(4)]
    tokenizer = load_tiny(name="t", config=CONFIG).tokenizer
    assert window_prefix(tokenizer) == [tokenizer.bos_token_id]
    assert window_prefix(tokenizer, add_bos=False) == []


def test_window_nll_equals_the_full_logits_computation():
    loaded = load_tiny(name="t", config=CONFIG)
    windows = torch.randint(3, 400, (3, 20), generator=torch.Generator().manual_seed(0))
    logits = loaded.model(windows).logits[:, :-1]
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1),
                               reduction="none").view(3, -1).sum(1)
    # a sum of 19 token losses each from a log-softmax reordered against cross_entropy's, 2 layers deep
    torch.testing.assert_close(window_nll(loaded, windows).float(), expected, **reordered(expected, depth=2))


def test_task_perplexity_is_exp_of_mean_token_nll_and_limit_caps_windows():
    import lightning as L

    loaded = load_tiny(name="t", config=CONFIG)
    task = PerplexityTask(name="article_ppl", source=Article(), seq_len=16)
    options = OmegaConf.create({"batch_tokens": 40, "add_bos": None})
    data, module = evaluation(task, loaded, 5, options)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    result = trainer.test(module, datamodule=data, verbose=False)[0]
    assert len(data.windows) == 5 and len(module.records) == 5
    nll = window_nll(loaded, data.windows)
    assert result["article_ppl/ppl"] == pytest.approx(math.exp(float(nll.sum()) / (5 * 15)), rel=1e-5)
    assert module.stderr("ppl") > 0
    assert task.lower_is_better and task.primary == "ppl"


def test_sweep_logs_ppl_and_stability_and_scores_once_for_all_ratios(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    for split in ("train", "test"):
        (tmp_path / "wikitext2" / f"wiki.{split}.raw").write_text(ARTICLE.replace("III", split) * 10)
    base = ["model=tiny-llama", "task=wikitext2_ppl", f"++data_dir={tmp_path}", "task.tasks.wikitext2_ppl.seq_len=32",
            "pruner=wanda", "pruner.sequential=false", "calib=wikitext2", "calib.n_samples=4", "calib.seq_len=32",
            "trainer.enable_progress_bar=false"]
    first = run(compose_cfg(base + ["sparsity=0.3"]))
    second = run(compose_cfg(base + ["sparsity=0.6"]))
    mlflow.set_tracking_uri(store)
    df = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"])
    dense = df[df["tags.prunebench.pruner"] == "none"].iloc[0]
    assert dense["metrics.stability/wikitext2_ppl"] == 100.0
    for metrics in (first, second):
        assert metrics["wikitext2_ppl/ppl"] > 1 and not math.isnan(metrics["wikitext2_ppl/ppl_stderr"])
        assert metrics["stability/wikitext2_ppl"] == pytest.approx(
            100 * dense["metrics.wikitext2_ppl/ppl"] / metrics["wikitext2_ppl/ppl"])
    pruned = df[df["tags.prunebench.pruner"] == "wanda"]
    assert list(pruned["tags.prunebench.score_cache"]) == ["miss", "hit"]
    assert second["sparsity/actual"] == pytest.approx(0.6, abs=0.01)
    # the interval is of the same ratio (dense / pruned, pooled tokens), so it holds its point; it
    # once held pruned / dense x 100 and the sweep's report then failed on negative error bars
    for metrics in (first, second):
        assert metrics["stability/wikitext2_ppl_ci_low"] <= metrics["stability/wikitext2_ppl"] \
            <= metrics["stability/wikitext2_ppl_ci_high"]
    from prunebench.report.build import write_report

    assert (write_report("prunebench", None, tmp_path / "report") / "stability_vs_sparsity.png").exists()
    # the paper layout pairs documents with the dense run's; a perplexity's windows are none (it once
    # failed on their missing doc_id)
    paper = (write_report("prunebench", None, tmp_path / "paper", layout="paper") / "paper.md").read_text()
    assert "wanda" in paper and "wikitext2_ppl" in paper


@pytest.mark.real_model
@pytest.mark.shared_data
def test_gemma_wikitext2_perplexity_is_sane():
    import lightning as L

    from prunebench.corpora import WikiText2
    from prunebench.models.gemma_gguf import load_gemma3_270m

    data_dir = shared_file("wikitext2", "wiki.test.raw").parent.parent
    try:
        loaded = load_gemma3_270m(name="gemma3-270m")
    except ImportError as err:
        pytest.skip(f"gemma3-270m is not installed: {err}")
    task = PerplexityTask(name="wikitext2_ppl", source=WikiText2("test", str(data_dir)), seq_len=128)
    data, module = evaluation(task, loaded, 2, OmegaConf.create({"batch_tokens": 256, "add_bos": None}))
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    ppl = trainer.test(module, datamodule=data, verbose=False)[0]["wikitext2_ppl/ppl"]
    assert 5 < ppl < 100


@pytest.mark.parametrize("task", ["wikitext2_ppl", "c4_ppl"])
def test_default_windows_are_the_papers_2048_tokens_capped_at_the_context(task):
    from hydra.utils import instantiate

    from prunebench.evaluation.perplexity.engine import window_length

    ppl = instantiate(compose_cfg(["model=gemma3-270m", f"task={task}"]).task.tasks[task], _convert_="all")
    assert window_length(ppl.seq_len, 32768) == 2048 and window_length(ppl.seq_len, 512) == 512


def test_a_suite_of_perplexity_and_accuracy_averages_the_accuracies_only(store, tmp_path, monkeypatch):
    """exp(NLL) and a fraction have no mean: avg/score is the accuracies', with its standard error,
    and a tag names the tasks it averages."""
    from omegaconf import open_dict

    from conftest import TINY_MC

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    (tmp_path / "wikitext2" / "wiki.test.raw").write_text(ARTICLE * 10)
    cfg = compose_cfg(["model=tiny-llama", "task=wikitext2_ppl", f"++data_dir={tmp_path}", "pruner=none",
                       "task.tasks.wikitext2_ppl.seq_len=32", "trainer.enable_progress_bar=false"])
    with open_dict(cfg):
        cfg.task.tasks.local_mc = compose_cfg(TINY_MC).task.tasks.local_mc
    metrics = run(cfg)
    assert metrics["wikitext2_ppl/ppl"] > 1
    assert metrics["avg/score"] == metrics["local_mc/acc_norm"]
    assert metrics["avg/score_stderr"] == pytest.approx(metrics["local_mc/acc_norm_stderr"])
    mlflow.set_tracking_uri(store)
    (tag,) = mlflow.search_runs(experiment_names=["prunebench"])["tags.prunebench.avg_tasks"]
    assert tag == '["local_mc"]'
    # the paper layout's avg is the same mean (it once averaged the perplexity in)
    from prunebench.report.paper import paper_table, task_results

    (avg,) = paper_table(task_results(mlflow.search_runs(experiment_names=["prunebench"]))).avg
    assert avg == metrics["avg/score"]
