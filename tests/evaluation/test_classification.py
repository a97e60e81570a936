"""GLUE on a tiny random BERT classifier: both sources (the release's tsv files, the hub's schema)
read from self-written files in their real layouts, metrics checked against sklearn/scipy formulas
re-derived here and applied to the logged predictions."""

from __future__ import annotations

import json
import math
import random

import datasets
import mlflow
import numpy as np
import pytest
import torch

from hydra.utils import instantiate
from omegaconf import OmegaConf

from conftest import TINY_MC, compose_cfg, identity_model
from prunebench import job
from prunebench.api.requests import Loglikelihood
from prunebench.evaluation.loglikelihood import engine as loglikelihood_engine
from prunebench.evaluation.classification.engine import ClassificationModule
from prunebench.evaluation.loglikelihood.engine import EncodedDoc, LoglikelihoodModule
from prunebench.evaluation.registry import evaluation
from prunebench.models.cache import get_model
from prunebench.tasks.glue import LAYOUTS, GlueSource
from prunebench.tasks.multiple_choice import Instance, MultipleChoiceTask
from prunebench.calibration import calibration_config
from prunebench.validate import ConfigError, validate

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


HUB_FIELDS = {"sst2": ["sentence"], "cola": ["sentence"], "mrpc": ["sentence1", "sentence2"],
              "qqp": ["question1", "question2"], "stsb": ["sentence1", "sentence2"],
              "qnli": ["question", "sentence"], "mnli": ["premise", "hypothesis"], "rte": ["sentence1", "sentence2"]}


@pytest.mark.parametrize("task", sorted(LAYOUTS))
def test_tsv_layouts_read_into_the_hub_schema(glue_dir, tmp_path, task):
    split = "validation_matched" if task == "mnli" else "validation"
    docs = GlueSource(task, split, data_dir=str(glue_dir)).load()
    assert len(docs) == 24 and all(set(HUB_FIELDS[task]) <= set(d) for d in docs)
    labels = {d["label"] for d in docs}
    if task == "stsb":
        assert all(isinstance(v, float) and 0 <= v <= 5 for v in labels)
    else:
        assert labels <= set(range(3 if task == "mnli" else 2))
    assert '"odd' in " ".join(d[HUB_FIELDS[task][0]] for d in docs)  # quotes kept verbatim (QUOTE_NONE)
    # the same documents in the hub's schema (nyu-mll/glue's parquet shard, a JSON lines export) read the same
    hub = tmp_path / f"{task}.jsonl"
    hub.write_text("".join(json.dumps(d) + "\n" for d in docs))
    assert GlueSource(task, split, path=str(hub)).load() == docs
    shard = tmp_path / f"{split}-00000-of-00001.parquet"
    datasets.Dataset.from_list(docs).to_parquet(str(shard))
    assert GlueSource(task, split, path=str(shard)).load() == docs


def test_cola_tsv_has_no_header_and_maps_columns(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\nbc01\t0\t*\tThe more books.\n")
    docs = GlueSource("cola", path=str(path)).load()
    assert [(d["sentence"], d["label"]) for d in docs] == [("The sailors rode the breeze clear of the rocks.", 1),
                                                          ("The more books.", 0)]


def sklearn_f1(gold, pred):
    tp = sum(g == p == 1 for g, p in zip(gold, pred))
    fp = sum(p == 1 and g == 0 for g, p in zip(gold, pred))
    fn = sum(p == 0 and g == 1 for g, p in zip(gold, pred))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def sklearn_mcc(gold, pred, k):
    """sklearn's multiclass matthews_corrcoef from the confusion matrix."""
    c = np.zeros((k, k))
    for g, p in zip(gold, pred):
        c[g, p] += 1
    t, p, n, s = c.sum(1), c.sum(0), c.trace(), c.sum()
    denom = math.sqrt((s * s - p @ p) * (s * s - t @ t))
    return 0.0 if denom == 0 else (n * s - t @ p) / denom


def pearson(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(((x - x.mean()) * (y - y.mean())).sum() / math.sqrt(((x - x.mean()) ** 2).sum() * ((y - y.mean()) ** 2).sum()))


def ranks(values):
    """Average ranks for ties, as scipy.stats.rankdata."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def test_metrics_match_direct_formulas():
    torch.manual_seed(0)
    module = ClassificationModule(identity_model(), "t", ["acc", "mcc", "f1"], 2)
    logits, gold = torch.randn(50, 2), torch.randint(0, 2, (50,))
    for chunk in range(0, 50, 16):
        module.test_step({"pixel_values": logits[chunk:chunk + 16], "labels": gold[chunk:chunk + 16]}, 0)
    pred = logits.argmax(-1).tolist()
    g = gold.tolist()
    assert module.metrics["acc"].compute().item() == pytest.approx(np.mean([a == b for a, b in zip(g, pred)]))
    # torchmetrics in fp32 against float64 references, values in [-1, 1]: ~10 fp32 eps
    assert module.metrics["mcc"].compute().item() == pytest.approx(sklearn_mcc(g, pred, 2), abs=1e-6)
    assert module.metrics["f1"].compute().item() == pytest.approx(sklearn_f1(g, pred), abs=1e-6)
    assert 0 < module.stderr("mcc") < 0.5 and 0 < module.stderr("f1") < 0.5
    reg = ClassificationModule(identity_model(), "s", ["pearson", "spearman"], 1)
    scores, target = torch.randn(40, 1), torch.rand(40) * 5
    reg.test_step({"pixel_values": scores, "labels": target}, 0)
    x, y = scores[:, 0].tolist(), target.tolist()
    # fp32 sums of 40 products against float64: ~100 fp32 eps
    assert reg.metrics["pearson"].compute().item() == pytest.approx(pearson(x, y), abs=1e-5)
    assert reg.metrics["spearman"].compute().item() == pytest.approx(pearson(ranks(x), ranks(y)), abs=1e-5)


def run_job(overrides, store):
    cfg = compose_cfg([*overrides, *QUIET, "tracking.ensure_dense=false"])
    return job.run(cfg)


def predictions(task: str) -> list[dict]:
    run = mlflow.search_runs(search_all_experiments=True, output_format="list")[0]
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path=f"predictions/{task}.jsonl")
    return [json.loads(line) for line in open(path)]


def test_glue_suite_averages_the_metrics_hies_reports(glue_dir):
    tasks = validate(compose_cfg(["model=tiny-bert-cls", "task=glue", f"data_dir={glue_dir}", "sparsity=0"]))
    assert {name: t.primary for name, t in tasks.items()} == {
        "sst2": "acc", "cola": "mcc", "mrpc": "f1", "qqp": "acc", "stsb": "pearson", "qnli": "acc", "mnli": "acc",
        "rte": "acc"}
    assert tasks["mnli"].source.split == "validation_matched"


def test_mrpc_f1_and_stsb_correlations_match_the_predictions(glue_dir, store):
    metrics = run_job(["model=tiny-bert-cls", "model.labels=[not_equivalent,equivalent]", "task=mrpc",
                       f"data_dir={glue_dir}", "sparsity=0"], store)
    records = predictions("mrpc")
    gold, pred = [r["gold"] for r in records], [r["pred"] for r in records]
    assert len(records) == 24
    assert metrics["mrpc/f1"] == pytest.approx(sklearn_f1(gold, pred), abs=1e-6)
    assert metrics["mrpc/acc"] == pytest.approx(np.mean(np.equal(gold, pred)))
    assert metrics["avg/score"] == metrics["mrpc/f1"]


def test_stsb_regression_head(glue_dir, store):
    metrics = run_job(["model=tiny-bert-cls", "model.labels=[]", "task=stsb", f"data_dir={glue_dir}", "sparsity=0"],
                      store)
    records = predictions("stsb")
    gold, pred = [r["gold"] for r in records], [r["pred"] for r in records]
    assert metrics["stsb/pearson"] == pytest.approx(pearson(pred, gold), abs=1e-5)
    assert metrics["stsb/spearman"] == pytest.approx(pearson(ranks(pred), ranks(gold)), abs=1e-5)


def test_label_order_and_count_are_checked(glue_dir, store):
    loaded = get_model(compose_cfg(["model=tiny-bert-cls"]).model)
    tasks = validate(compose_cfg(["model=tiny-bert-cls", "task=rte", f"data_dir={glue_dir}", "sparsity=0"]))
    with pytest.raises(ValueError, match=r"orders its labels \['negative', 'positive'\].*expects"):
        evaluation(tasks["rte"], loaded, 4, None)
    tasks = validate(compose_cfg(["model=tiny-bert-cls", "task=mnli", f"data_dir={glue_dir}", "sparsity=0"]))
    with pytest.raises(ValueError, match="has 3 label"):
        evaluation(tasks["mnli"], loaded, 4, None)
    loaded.model.config.id2label = {0: "LABEL_0", 1: "LABEL_1"}  # generic names: only the count is checked
    tasks["rte"] = validate(compose_cfg(["model=tiny-bert-cls", "task=rte", f"data_dir={glue_dir}",
                                         "sparsity=0"]))["rte"]
    evaluation(tasks["rte"], loaded, 4, None)


def test_his_calibrates_on_train_never_the_evaluated_split(glue_dir, store):
    base = ["model=tiny-bert-cls", "task=sst2", f"data_dir={glue_dir}", "pruner=heads_his", "calib=glue_train",
            "sparsity=0.5", "calib.n_samples=8"]
    metrics = run_job(base, store)
    assert metrics["sparsity/actual"] == 0.5 and 0 <= metrics["sst2/acc"] <= 1
    with pytest.raises(ConfigError, match="reads data that is evaluated"):
        validate(compose_cfg([*base, "calib=labelled", "task@calib.task=sst2"]))


@pytest.mark.parametrize("calib", ["glue_train", "labelled"])
@pytest.mark.parametrize("task", ["cola", "mrpc", "stsb"])
def test_labelled_calibration_defaults_to_the_evaluated_tasks_own_train_split(glue_dir, calib, task):
    cfg = compose_cfg(["model=tiny-bert-cls", f"task={task}", f"data_dir={glue_dir}", "pruner=heads_his",
                       f"calib={calib}", "sparsity=0.5"])
    validate(cfg)
    calibration = instantiate(calibration_config(cfg), _convert_="all")
    assert calibration.task.name == task
    assert calibration.task.source.describe() == str(glue_dir / "glue" / LAYOUTS[task].folder / "train.tsv")


@pytest.mark.parametrize("calib_task, task", [("sst2", "cola"), ("sst2", "mrpc"), ("rte", "stsb")])
def test_calibration_labels_of_another_task_are_refused_before_any_model_loads(glue_dir, calib_task, task):
    """SST-2's negative/positive are not CoLA's unacceptable/acceptable though both count two."""
    cfg = compose_cfg(["model=tiny-bert-cls", f"task={task}", f"data_dir={glue_dir}", "pruner=heads_his",
                       "calib=glue_train", f"task@calib.task={calib_task}", "sparsity=0.5"])
    with pytest.raises(ConfigError, match=rf"calib='glue_train' draws labelled examples from task {calib_task} "
                                          rf"\(.*train.tsv\), labels \[.*\], but task {task} is evaluated with "
                                          rf"labels \[.*\]"):
        validate(cfg)


def test_labelled_calibration_without_a_task_needs_one_evaluated_task(glue_dir):
    cfg = compose_cfg(["model=tiny-bert-cls", "task=glue", f"data_dir={glue_dir}", "pruner=heads_his",
                       "calib=glue_train", "sparsity=0.5"])
    with pytest.raises(ConfigError, match=r"evaluates \['sst2', .*choose one: task@calib.task=NAME"):
        validate(cfg)


def test_prompted_glue_for_causal_lms(glue_dir):
    """lm-eval's GLUE prompts (spec section 4) on the same sources."""
    tasks = validate(compose_cfg(["model=tiny-llama", "task=glue_mc", f"data_dir={glue_dir}", "sparsity=0",
                                  "pruner=none"]))
    assert len(tasks) == 8
    mnli = tasks["mnli_mc"].instances(1)[0]
    doc = tasks["mnli_mc"].docs(1)[0]
    hypothesis = doc["hypothesis"].strip()
    assert mnli.contexts[0] == (f"{doc['premise']}\nQuestion: {hypothesis}{'' if hypothesis.endswith('.') else '.'}"
                                f" True, False or Neither?\nAnswer:")
    assert mnli.continuations == [" True", " Neither", " False"] and mnli.gold == doc["label"]
    qnli = tasks["qnli_mc"].instances(1)[0]
    assert qnli.continuations == [" yes", " no"]


GLUE_MC_PRIMARY = {"sst2_mc": "acc", "cola_mc": "mcc", "mrpc_mc": "f1", "qqp_mc": "acc", "qnli_mc": "acc",
                   "mnli_mc": "acc", "mnli_mismatch_mc": "acc", "rte_mc": "acc"}


def test_prompted_glue_metrics_follow_lm_eval_and_the_glue_average(glue_dir):
    tasks = validate(compose_cfg(["model=tiny-llama", "task=glue_mc", f"data_dir={glue_dir}", "sparsity=0"]))
    assert {name: t.primary for name, t in tasks.items()} == GLUE_MC_PRIMARY
    assert {name: t.metrics for name, t in tasks.items() if t.metrics != ["acc"]} == {
        "cola_mc": ["mcc", "acc"], "mrpc_mc": ["acc", "f1"], "qqp_mc": ["acc", "f1"]}
    for name in GLUE_MC_PRIMARY:  # each member is also a task option of its own
        assert list(validate(compose_cfg(["model=tiny-llama", f"task={name}", f"data_dir={glue_dir}",
                                          "sparsity=0"]))) == [name]


def fixed_loglik_module(monkeypatch, lls: list[list[float]], golds: list[int], metrics: list[str]):
    """The log-likelihood engine's module fed documents whose log-likelihoods are given, in batches of 16."""
    monkeypatch.setattr(loglikelihood_engine, "score_documents",
                        lambda model, batch, **options: [[(ll, False) for ll in lls[d.document.doc_id]] for d in batch])
    k = len(lls[0])
    task = MultipleChoiceTask("t", None, "{{q}}", "{{c}}", "{{a}}", metrics=metrics, primary=metrics[0])
    instances = [Instance(i, [Loglikelihood("ctx", f" c{j}") for j in range(k)], {}, g, [2] * k)
                 for i, g in enumerate(golds)]
    module = LoglikelihoodModule(identity_model(), task, task.metric_objects(instances))
    docs = [EncodedDoc(instance, [], [1] * k, []) for instance in instances]
    for start in range(0, len(docs), 16):
        module.test_step(docs[start:start + 16], 0)
    return module


def first_argmax(values):
    return int(np.argmax(values))  # numpy's rule: the first index wins ties, as lm-eval


def loglik_case(seed: int, n: int, k: int):
    rng = random.Random(seed)
    golds = [rng.randrange(k) for _ in range(n)]
    # rounded so ties occur: the first index must win them
    lls = [[round(rng.gauss(0, 1) + (j == g) * 0.7, 1) for j in range(k)] for g in golds]
    return lls, golds


@pytest.mark.parametrize("k", [2, 3])
def test_multiple_choice_mcc_and_f1_match_direct_formulas(monkeypatch, k):
    lls, golds = loglik_case(k, 70, k)
    metrics = ["acc", "mcc", "f1"] if k == 2 else ["acc", "mcc"]
    module = fixed_loglik_module(monkeypatch, lls, golds, metrics)
    preds = [first_argmax(ll) for ll in lls]
    assert any(len(set(ll)) < k and max(ll) == ll[p] for ll, p in zip(lls, preds))  # a tie was broken
    assert [r["pred"] for r in module.records] == preds
    assert module.metrics["mcc"].compute().item() == pytest.approx(sklearn_mcc(golds, preds, k), abs=1e-6)
    assert module.metrics["acc"].compute().item() == pytest.approx(np.mean(np.equal(golds, preds)))
    if k == 2:
        assert module.metrics["f1"].compute().item() == pytest.approx(sklearn_f1(golds, preds), abs=1e-6)
    for name in metrics[1:]:  # bootstrap: deterministic, and of the size a 70-document estimate has
        assert 0.02 < module.stderr(name) < 0.3 and module.stderr(name) == module.stderr(name)
        assert "mcc" not in module.records[0] and "f1" not in module.records[0]


def test_mcc_of_a_constant_prediction_is_zero_as_sklearn(monkeypatch):
    """A collapsed model answering "yes" everywhere: sklearn (lm-eval, GLUE) says MCC 0; torchmetrics'
    own two-class reduction would say 0.36 here."""
    golds = [0, 1, 1, 1, 0, 1, 1]
    module = fixed_loglik_module(monkeypatch, [[-2.0, -1.0]] * len(golds), golds, ["mcc", "f1"])
    assert module.metrics["mcc"].compute().item() == 0.0 == sklearn_mcc(golds, [1] * 7, 2)
    assert module.metrics["f1"].compute().item() == pytest.approx(sklearn_f1(golds, [1] * 7))
    classifier = ClassificationModule(identity_model(), "t", ["mcc"], 2)
    classifier.test_step({"pixel_values": torch.tensor([[0.0, 1.0]] * 7), "labels": torch.tensor(golds)}, 0)
    assert classifier.metrics["mcc"].compute().item() == 0.0


@pytest.mark.lm_eval
def test_multiple_choice_mcc_and_f1_equal_lm_evals_metric_functions(monkeypatch):
    metrics = pytest.importorskip("lm_eval.api.metrics")
    for seed in range(4):
        lls, golds = loglik_case(seed, 50, 2)
        module = fixed_loglik_module(monkeypatch, lls, golds, ["mcc", "f1"])
        items = [(r["gold"], r["pred"]) for r in module.records]  # lm-eval's (gold, pred) per document
        assert module.metrics["mcc"].compute().item() == pytest.approx(metrics.matthews_corrcoef(items), abs=1e-6)
        assert module.metrics["f1"].compute().item() == pytest.approx(metrics.f1_score(items), abs=1e-6)
    items = [(g, 1) for g in golds]
    module = fixed_loglik_module(monkeypatch, [[-2.0, -1.0]] * len(golds), golds, ["mcc"])
    assert module.metrics["mcc"].compute().item() == metrics.matthews_corrcoef(items) == 0.0


def test_prompted_glue_job_logs_mcc_f1_and_the_glue_convention_average(glue_dir, store):
    metrics = run_job(["model=tiny-llama", "task=[cola_mc,mrpc_mc,qqp_mc]", "task.name=cola_mc", f"data_dir={glue_dir}",
                       "sparsity=0"], store)
    for task in ("cola_mc", "mrpc_mc", "qqp_mc"):
        records = predictions(task)
        assert len(records) == 24
        gold, pred = [r["gold"] for r in records], [r["pred"] for r in records]
        assert pred == [first_argmax(r["loglikelihoods"]) for r in records]
        assert metrics[f"{task}/acc"] == pytest.approx(np.mean(np.equal(gold, pred)))
        if task == "cola_mc":
            assert metrics["cola_mc/mcc"] == pytest.approx(sklearn_mcc(gold, pred, 2), abs=1e-6)
        else:
            assert metrics[f"{task}/f1"] == pytest.approx(sklearn_f1(gold, pred), abs=1e-6)
    assert all(math.isfinite(metrics[f"{t}/{m}_stderr"]) for t, m in [("cola_mc", "mcc"), ("mrpc_mc", "f1"),
                                                                     ("qqp_mc", "f1"), ("qqp_mc", "acc")])
    assert metrics["avg/score"] == pytest.approx((metrics["cola_mc/mcc"] + metrics["mrpc_mc/f1"]
                                                  + metrics["qqp_mc/acc"]) / 3)


def test_corpus_metrics_refuse_documents_they_cannot_score(tmp_path):
    loaded = get_model(compose_cfg(["model=tiny-llama"]).model)
    options = OmegaConf.create({"batch_tokens": 512, "add_bos": None})
    three_choices = validate(compose_cfg([*TINY_MC, "task.tasks.local_mc.metrics=[acc,f1]",
                                         "task.tasks.local_mc.primary=acc", "sparsity=0"]))
    with pytest.raises(ValueError, match=r"f1 is binary.*\(0, 3\)"):
        evaluation(three_choices["local_mc"], loaded, None, options)
    path = tmp_path / "bad_gold.jsonl"
    path.write_text(json.dumps({"question": "q?", "choices": ["a", "b"], "label": 5}) + "\n")
    with pytest.raises(ConfigError, match=r"document 0 .*gold answer 5 is not one of its 2 choices"):
        validate(compose_cfg([*TINY_MC, f"task.tasks.local_mc.source.path={path}", "task.tasks.local_mc.metrics=[mcc]",
                              "task.tasks.local_mc.primary=mcc", "sparsity=0"]))


def test_classifier_task_refuses_a_causal_lm_before_loading(glue_dir):
    with pytest.raises(ConfigError, match=r"task sst2 \(classify requests\) cannot evaluate model='tiny-llama'.*encoder"):
        validate(compose_cfg(["model=tiny-llama", "task=sst2", f"data_dir={glue_dir}", "sparsity=0"]))
