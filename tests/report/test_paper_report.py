"""The paper layout: rows keyed by the pruner's whole config, mean +- std over seeds, flips and the
exact McNemar test against the dense run and between rows, re-derived here from the logged
per-document predictions."""

from __future__ import annotations

import json
import math

import mlflow
import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from conftest import TINY_MC, compose_cfg, opened_store_in
from prunebench.job import run
from prunebench.report.cli import main as report_main
from prunebench.report.paper import mcnemar, paper_table, task_results
from prunebench.report.table import load_runs


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs():
    # 2 x 0.5^3, summed by scipy in floating point: approx's default 1e-6 is far below any other outcome
    assert mcnemar([1, 1, 1, 0, 1], [0, 0, 0, 0, 1]) == (3, 0, pytest.approx(0.25))
    assert mcnemar([1, 0], [1, 0]) == (0, 0, 1.0)


def correct(run_id: str) -> dict[int, float]:
    path = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="predictions/local_mc.jsonl")
    return {r["doc_id"]: r["acc_norm"] for r in map(json.loads, open(path))}


@pytest.fixture(scope="module")
def grid(first_opened_store, tmp_path_factory):
    """Five pruned jobs and their dense baseline in a store of their own, run once for the three tests
    that only read them (their reports go to each test's own folder)."""
    folder = tmp_path_factory.mktemp("grid")
    text = folder / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    calib = ["calib=file", f"calib.path={text}", "calib.n_samples=2", "calib.seq_len=16"]
    jobs = [["pruner=heads_l2"], ["pruner=heads_random", "seed=0"], ["pruner=heads_random", "seed=1"],
            ["pruner=hies", "pruner.alpha=0.3", *calib], ["pruner=hies", "pruner.alpha=0.7", *calib]]
    with pytest.MonkeyPatch.context() as patch:
        uri = opened_store_in(folder, patch, first_opened_store)
        for overrides in jobs:  # the dense baseline runs first
            run(compose_cfg([*TINY_MC, "sparsity=0.5", *overrides]))
        mlflow.set_tracking_uri(uri)
        yield load_runs("prunebench")


def test_rows_are_keyed_by_the_whole_config_and_seeds_averaged(grid):
    table = paper_table(task_results(grid))
    assert list(table.label) == ["none", "heads_l2", "heads_random", "hies (alpha=0.3)", "hies (alpha=0.7)"]
    random_runs = grid[grid["tags.prunebench.pruner"] == "heads_random"]["metrics.local_mc/acc_norm"]
    row = table[table.label == "heads_random"].iloc[0]
    # the same two values averaged again: only the order of a two-term sum can differ
    assert row["local_mc/seeds"] == 2
    assert row["local_mc/acc_norm"] == pytest.approx(random_runs.mean(), abs=1e-12)
    assert row["local_mc/acc_norm_std"] == pytest.approx(random_runs.std(), abs=1e-12, nan_ok=True)
    for alpha in ("0.3", "0.7"):
        logged = grid[grid["params.pruner.alpha"] == alpha].iloc[0]
        assert table[table.label == f"hies (alpha={alpha})"].iloc[0]["local_mc/acc_norm"] == \
            logged["metrics.local_mc/acc_norm"]


def test_paper_report_files_flips_and_comparisons(grid, tmp_path, capsys):
    out = tmp_path / "rep"
    assert report_main(["--experiment", "prunebench", "--out", str(out), "--layout", "paper"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("## Paper layout\n\n### tiny-llama · task=local_mc · limit=null · data=mc_questions")
    assert "\n\n| model | pruner | ratio | local_mc/acc_norm |" in printed, printed
    assert {"paper.md", "paper.csv", "paper.tex", "flips.csv", "comparisons.csv", "paper.png",
            "results.md"} <= {p.name for p in out.iterdir()}
    # no run recovered: no tune column, no verdicts against an unrecovered run, no recovery plot
    assert not {"verdicts_tune.csv", "recovery_loss.png"} & {p.name for p in out.iterdir()}
    assert not {"tune", "recovery", "vs untuned"} & set(pd.read_csv(out / "paper.csv").columns)
    assert "Recovery" not in (out / "results.md").read_text()
    tex = (out / "paper.tex").read_text()
    assert "\\toprule" in tex and "\\bottomrule" in tex and "$\\pm$" in tex and "heads\\_random" in tex
    flips = pd.read_csv(out / "flips.csv")
    assert len(flips) == 5
    dense = correct(grid[grid["tags.prunebench.pruner"] == "none"].run_id.iloc[0])
    for _, row in flips.iterrows():
        seed = json.loads(row.seed)
        runs = grid[(grid["tags.prunebench.pruner"] == row.pruner.split(" ")[0])
                    & (grid["params.seed"] == seed["seed"])]
        if row.pruner.startswith("hies"):
            runs = runs[runs["params.pruner.alpha"] == row.pruner.split("=")[1].rstrip(")")]
        pruned = correct(runs.run_id.iloc[0])
        lost = sum(dense[d] == 1 and pruned[d] == 0 for d in dense)
        gained = sum(dense[d] == 0 and pruned[d] == 1 for d in dense)
        assert (row["right->wrong"], row["wrong->right"], row.docs) == (lost, gained, len(dense))
        # the same scipy call on the same counts: approx only for the float's last bit
        assert row.p == pytest.approx(binomtest(lost, lost + gained).pvalue if lost + gained else 1.0)
    compared = pd.read_csv(out / "comparisons.csv")
    # four pruned rows at one ratio: six pairs; heads_random pairs both seeds with the others' one run
    assert len(compared) == 6
    assert set(compared[compared.a == "heads_random"].pairs) | set(compared[compared.b == "heads_random"].pairs) == {5}


def test_a_sweep_at_one_ratio_plots_its_methods_side_by_side(grid):
    """At one ratio every method sits at one x: on a numeric axis they hid each other on a band
    0.04 wide around the ratio (and the flat plots drew a line from dense for each). Each figure
    names the methods on its x axis instead; titles are the model and task, the rest of the setting
    the caption."""
    from prunebench.report import plots
    from prunebench.report.paper import figure
    from prunebench.report.table import results_table, task_columns

    flat = results_table(grid)
    seeds = ["heads_random seed=0, pruner.seed=0", "heads_random seed=1, pruner.seed=1"]
    for fig, methods, xlabel in (
            (figure(paper_table(task_results(grid)), {}),
             ["heads_l2", "heads_random", "hies (alpha=0.3)", "hies (alpha=0.7)"], "method at ratio 0.5"),
            (plots.metric_vs_sparsity(flat, task_columns(flat)),
             ["heads_l2", *seeds, "hies pruner.alpha=0.3", "hies pruner.alpha=0.7"], "method at sparsity 0.5"),
            (plots.stability_vs_sparsity(flat),
             ["heads_l2", *seeds, "hies pruner.alpha=0.3", "hies pruner.alpha=0.7"], "method at sparsity 0.5")):
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.get_xticklabels()] == methods
        assert ax.get_xlim() == (-0.6, len(methods) - 0.4) and ax.get_xlabel() == xlabel
        # one point per method, at its place, and the dense level beside them
        drawn = [line for line in ax.get_lines() if line.get_marker() == "o"]
        assert [float(line.get_xdata()[0]) for line in drawn] == list(range(len(methods)))
        assert "dense" in ax.get_legend_handles_labels()[1]
        title = ax.get_title().split("\n")
        assert len(title) == 2 and title[0] == "tiny-llama · local_mc"
        (caption,) = fig.texts
        assert caption.get_text().startswith("limit=null · data=mc_questions.jsonl@")
        assert "dtype=float32" in caption.get_text() and "tiny-llama" not in caption.get_text()


def test_checkpoints_per_task_share_a_row_though_each_calibrates_on_its_own_task(glue_dir, store):
    labels = {"sst2": "[negative,positive]", "cola": "[unacceptable,acceptable]"}
    for task in ("sst2", "cola"):
        run(compose_cfg(["model=tiny-bert-cls", f"model.name=bert-{task}", f"model.labels={labels[task]}",
                         f"task={task}", f"data_dir={glue_dir}", "pruner=hies_paper", "calib=glue_train",
                         f"task@calib.task={task}", "calib.n_samples=4", "sparsity=0.5",
                         "trainer.enable_progress_bar=false"]))
    mlflow.set_tracking_uri(store)
    table = paper_table(task_results(load_runs("prunebench")))
    assert list(zip(table.model, table.label)) == [("(one per task)", "none"), ("(one per task)", "hies")]
    assert list(table.tasks) == ["2/2", "2/2"]


def sweep_parent(uri: str) -> str:
    """A sweep's parent run, as the sweep callback makes it, for jobs run in this process."""
    from prunebench.tracking import store as tracking_store

    exp_id = tracking_store.experiment_id(uri, "prunebench")
    return mlflow.MlflowClient(uri).create_run(exp_id, tags={"prunebench.sweep": "true"}).info.run_id


def test_two_sweeps_of_other_models_and_limits_never_share_a_table_or_a_panel(store, tmp_path, capsys):
    from prunebench.report.paper import figure

    for model, limit in (("tiny-llama", 3), ("tiny-llama-2", 2)):
        parent = sweep_parent(store)
        run(compose_cfg([*TINY_MC, f"model.name={model}", f"limit={limit}", "sparsity=0.5"]), [], parent)
    # by default the latest sweep alone
    assert report_main(["--out", str(tmp_path / "latest"), "--layout", "paper"]) == 0
    assert f"(report of sweep {parent} (--all: the whole experiment)" in capsys.readouterr().out
    latest = pd.read_csv(tmp_path / "latest" / "paper.csv")
    assert set(latest.model) == {"tiny-llama-2"} and len(latest) == 2
    # the whole experiment on request: a table per setting, each headed by its model and limit
    assert report_main(["--all", "--out", str(tmp_path / "all"), "--layout", "paper"]) == 0
    text = (tmp_path / "all" / "paper.md").read_text()
    headings = [line[4:] for line in text.splitlines() if line.startswith("### ")]
    assert [h.split(" · ")[0] + " " + h.split(" · ")[2] for h in headings] == ["tiny-llama limit=3",
                                                                               "tiny-llama-2 limit=2"]
    table = pd.read_csv(tmp_path / "all" / "paper.csv")
    for heading in headings:
        rows = table[table.setting == heading]
        assert list(rows.label) == ["none", "magnitude"] and set(rows.tasks) == {"1/1"}
    # one row of panels per setting, each with its own dense level only
    fig = figure(paper_table(task_results(load_runs("prunebench"))), {})
    assert len(fig.axes) == 2
    (caption,) = fig.texts
    for number, ax, heading in zip((1, 2), fig.axes, headings):
        # a number ties the panel to its line of the caption, where the limit that tells them apart is
        assert ax.get_title().split("\n")[0] == f"({number}) {heading.split(' · ')[0]} · local_mc"
        assert f"({number}) {heading.split(' · ')[2]} · data=" in caption.get_text()
        assert ax.get_legend_handles_labels()[1].count("dense") == 1


@pytest.fixture
def tuned(store, tmp_path, one_thread):
    """Three sweeps as `recovery=none,lora` grids make them: magnitude at 0.5 w/o tune (and the dense
    run), the same w/ tune (a 2-step LoRA on a text file, validated each step), and 0.3 w/ tune
    alone, which has no counterpart w/o tune. Returns the parents' run ids."""
    from helpers.recovery import TEXT, recovery_overrides

    text = tmp_path / "recovery.txt"
    text.write_text(TEXT * 60)
    lora = recovery_overrides(text, "recovery.max_steps=2", "recovery.val_every=1")
    parents = {}
    for name, overrides in (("none", ["sparsity=0.5"]), ("lora", ["sparsity=0.5", *lora]),
                            ("lora_0.3", ["sparsity=0.3", *lora])):
        parents[name] = sweep_parent(store)
        run(compose_cfg([*TINY_MC, *overrides]), overrides, parents[name])
    mlflow.set_tracking_uri(store)
    return parents


def test_recovered_rows_stand_beside_their_unrecovered_rows_with_a_verdict_against_them(tuned, tmp_path):
    from prunebench.report import plots
    from prunebench.report.build import recovery_curves

    out = tmp_path / "rep"
    assert report_main(["--all", "--out", str(out), "--layout", "paper"]) == 0
    paper = pd.read_csv(out / "paper.csv", keep_default_na=False)
    # LLM-Pruner's Table 1: under each pruner and ratio the row w/o tune, then w/ tune; dense stands alone
    assert list(zip(paper.label, paper.ratio, paper.tune)) == [("none", 0.0, ""), ("magnitude", 0.3, "w/ tune (lora)"),
                                                               ("magnitude", 0.5, "w/o tune"),
                                                               ("magnitude", 0.5, "w/ tune (lora)")]
    assert (paper.differs == "").all()  # the recovery's params and data are the tune column, not a difference
    flat = pd.read_csv(out / "results.csv", keep_default_na=False)  # the flat table: the recipe, a line of its own
    assert list(zip(flat.sparsity, flat.recovery)) == [(0.0, ""), (0.3, "lora"), (0.5, ""), (0.5, "lora")]
    assert "differs" not in flat
    runs = load_runs("prunebench")
    tuned_run = runs[(runs["tags.prunebench.recovery"] == "lora") & (runs["tags.prunebench.sparsity"] == "0.5")].iloc[0]
    plain = runs[runs["tags.prunebench.recovery"].isna() & (runs["tags.prunebench.sparsity"] == "0.5")].iloc[0]
    # against its counterpart w/o tune, paired on the same documents; the 0.3 row has none, and is
    # never paired with the 0.5 run w/o tune
    (judged,) = pd.read_csv(out / "verdicts_tune.csv").itertuples()
    before, after = correct(plain.run_id), correct(tuned_run.run_id)
    assert (judged.ratio, judged.tune, judged.docs) == (0.5, "w/ tune (lora)", len(before))
    # the paired difference in points, from the same per-document values
    assert judged.diff == pytest.approx(100 * sum(after[d] - before[d] for d in before) / len(before))
    assert judged.reference == pytest.approx(100 * plain["metrics.local_mc/acc_norm"])
    assert list(paper["vs untuned"]) == ["", "", "", judged.verdict]
    assert list(paper.verdict[1:]) != [""] * 3  # each pruned row keeps its verdict against dense
    text = (out / "paper.md").read_text()
    assert "| model | pruner | ratio | tune | local_mc/acc_norm |" in text
    assert "## Verdicts against the unrecovered run (w/ tune against w/o tune on the same documents; " \
           "tolerance 1 points; p adjusted by Holm across the 1 comparisons)" in text
    # the sweep's recovery losses: one line per recovered run, its logged history
    assert "![recovery loss per step](recovery_loss.png)" in (out / "results.md").read_text()
    assert (out / "recovery_loss.png").stat().st_size > 0
    fig = plots.recovery_loss(recovery_curves(runs))
    client = mlflow.MlflowClient()
    for ax, metric in zip(fig.axes, plots.RECOVERY_LOSSES, strict=True):
        drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
        assert set(drawn) == {"magnitude 0.3 lora", "magnitude 0.5 lora"}
        for _, run_ in runs[runs["tags.prunebench.recovery"] == "lora"].iterrows():
            history = client.get_metric_history(run_.run_id, metric)
            label = f"magnitude {float(run_['tags.prunebench.sparsity']):g} lora"
            assert drawn[label] == ([1, 2], [m.value for m in sorted(history, key=lambda m: m.step)])


def test_compare_takes_a_recovered_run_or_sweep_with_its_unrecovered_counterpart(tuned, capsys):
    from prunebench.report.compare import main as compare_main

    def job(parent: str, sparsity: str) -> str:
        runs = load_runs("prunebench", parent)
        return runs[runs["tags.prunebench.sparsity"] == sparsity].run_id.iloc[0]

    # 2 steps of a random model at lr 1e-4 move 5 documents' answers little or not at all: not "kept"
    assert compare_main([job(tuned["none"], "0.5"), job(tuned["lora"], "0.5")]) in (1, 2)
    out = capsys.readouterr().out
    assert "\nrecovery: A: w/o tune; B: w/ tune (lora) (one pruned model w/o and w/ tune)\n" in out
    assert compare_main([job(tuned["none"], "0.5"), job(tuned["lora_0.3"], "0.3")]) in (1, 2)
    assert "B: w/ tune (lora) (they differ in more than the recovery)" in capsys.readouterr().out
    # two sweeps: the pruned runs paired across the recovery; the dense run both share is not compared
    # with itself, and the output says so
    assert compare_main([tuned["none"], tuned["lora"]]) in (1, 2)
    out, err = capsys.readouterr()
    assert "\nrecovery: A: w/o tune; B: w/ tune (lora)\n" in out and "acc_norm |" in out
    assert "pair(s) not compared: A and B name the same run" in err
    # a sweep that differs in its ratio too shares only the dense run with it, which compared with
    # itself says nothing: nothing to compare (exit 3), and the reason named
    assert compare_main([tuned["none"], tuned["lora_0.3"]]) == 3
    assert "name the same run" in capsys.readouterr().err


def pooled_rise(reference: list[tuple[float, int]], candidate: list[tuple[float, int]]) -> dict:
    """The perplexity verdict's numbers by hand: each side's exp(sum NLL / sum tokens), the rise in
    percent, and over the verdicts' 10,000 seeded resamples of the windows (seed 1234) the 2.5 / 97.5
    percentiles of the rise and p = 2 (1 + resamples on the far side of 0) / 10,001."""
    ref, new = np.array(reference, dtype=float), np.array(candidate, dtype=float)
    ppl = [math.exp(side[:, 0].sum() / side[:, 1].sum()) for side in (ref, new)]
    index = np.random.default_rng(1234).integers(0, len(ref), (10_000, len(ref)))
    rises = [100 * (math.exp(new[i, 0].sum() / new[i, 1].sum()) / math.exp(ref[i, 0].sum() / ref[i, 1].sum()) - 1)
             for i in index]
    far = min(sum(r <= 0 for r in rises), sum(r >= 0 for r in rises))
    return {"reference": ppl[0], "candidate": ppl[1], "diff": 100 * (ppl[1] / ppl[0] - 1),
            "ci_low": np.percentile(rises, 2.5), "ci_high": np.percentile(rises, 97.5),
            "p": min(1.0, 2 * (1 + far) / 10_001), "tokens": int(ref[:, 1].sum())}


def test_perplexity_gets_a_verdict_against_dense_and_against_the_unrecovered_run(store, tmp_path, monkeypatch):
    """Issue 51's shape on tiny-llama: magnitude at 90% raises WikiText-2 perplexity (lost against
    dense at a 1% tolerance), a LoRA recovery on the test text lowers it below the unrecovered
    model's; both verdicts re-derived here from the windows' logged (NLL, tokens)."""
    from prunebench.report.paper import paired_with
    from prunebench.report.predictions import Predictions
    from helpers.texts import ARTICLE
    from helpers.recovery import recovery_overrides

    monkeypatch.setenv("PRUNEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "wikitext2").mkdir()
    for split in ("train", "test"):
        (tmp_path / "wikitext2" / f"wiki.{split}.raw").write_text(ARTICLE.replace("III", split) * 10)
    text = tmp_path / "recovery.txt"
    text.write_text(ARTICLE * 40)
    base = ["model=tiny-llama", "task=wikitext2_ppl", f"++data_dir={tmp_path}", "trainer.enable_progress_bar=false"]
    pruned = [*base, "task.tasks.wikitext2_ppl.seq_len=32", "pruner=magnitude", "sparsity=0.9"]
    for overrides in (pruned, [*pruned, *recovery_overrides(text, "recovery.max_steps=4", "recovery.lr=1e-2")]):
        run(compose_cfg(overrides), overrides, sweep_parent(store))  # the first also runs the dense baseline
    other_windows = [*base, "task.tasks.wikitext2_ppl.seq_len=16", "pruner=none"]
    run(compose_cfg(other_windows), other_windows, sweep_parent(store))
    mlflow.set_tracking_uri(store)
    out = tmp_path / "rep"
    assert report_main(["--all", "--out", str(out), "--layout", "paper", "--max-drop", "1"]) == 0

    runs = load_runs("prunebench")
    windows = {}
    for _, r in runs.iterrows():
        path = mlflow.artifacts.download_artifacts(run_id=r.run_id, artifact_path="predictions/wikitext2_ppl.jsonl")
        windows[r.run_id] = {w["window"]: (w["nll"], w["tokens"]) for w in map(json.loads, open(path))}
    lengths = {run_id: {t for _, t in w.values()} for run_id, w in windows.items()}
    dense = runs[(runs["tags.prunebench.pruner"] == "none") & runs.run_id.map(lambda i: lengths[i] == {31})]
    plain = runs[(runs["tags.prunebench.pruner"] == "magnitude") & runs["tags.prunebench.recovery"].isna()]
    tuned = runs[runs["tags.prunebench.recovery"] == "lora"]
    dense_id, plain_id, tuned_id = (side.run_id.iloc[0] for side in (dense, plain, tuned))

    def agrees(row, reference_id: str, candidate_id: str):
        ids = sorted(windows[reference_id])
        expected = pooled_rise([windows[reference_id][i] for i in ids], [windows[candidate_id][i] for i in ids])
        assert (row["docs"], row["tokens"], row["metric"], row["test"]) == (len(ids), expected["tokens"], "ppl",
                                                                  "paired bootstrap (ppl)")
        # the same sums and draws in another order of operations: only float rounding can differ
        for key in ("reference", "candidate", "diff", "ci_low", "ci_high", "p"):
            assert row[key] == pytest.approx(expected[key], rel=1e-9), key

    judged = pd.read_csv(out / "verdicts.csv", keep_default_na=False).set_index("run_id")
    assert set(judged.index) == {plain_id, tuned_id}
    agrees(judged.loc[plain_id], dense_id, plain_id)
    # 90% of a random model's weights gone: a rise clearly past 1%, its interval's lower end too
    assert judged.loc[plain_id].ci_low > 1 and judged.loc[plain_id].verdict == "lost"
    untuned = pd.read_csv(out / "verdicts_tune.csv", keep_default_na=False).iloc[0]
    agrees(untuned, plain_id, tuned_id)
    # the recovery lowers perplexity below the unrecovered model's, the whole interval below 0: kept
    assert untuned["ci_high"] < 0 and untuned["verdict"] == "kept" and len(pd.read_csv(out / "verdicts_tune.csv")) == 1
    paper = pd.read_csv(out / "paper.csv", keep_default_na=False)
    assert list(paper["vs untuned"][paper.tune == "w/ tune (lora)"]) == ["kept"]
    text = (out / "paper.md").read_text()
    assert "tolerance 1 points, a 1% rise for perplexity (diff in %)" in text and "| docs | tokens |" in text
    assert "## Flips" not in text  # no window is right or wrong

    # runs of other windows: the same ids (0, 1, ...) but 15 tokens each, not 31, are never paired
    short = runs[runs.run_id.map(lambda i: lengths[i] == {15})].run_id.iloc[0]
    assert set(windows[short]) & set(windows[dense_id])
    results = task_results(runs)
    row = results[results.run_id == plain_id].iloc[0]
    assert paired_with(row, short, Predictions()) is None
    assert paired_with(row, dense_id, Predictions())[1] == "ppl"
