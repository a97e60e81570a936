"""Verdicts across a grid: a scripted model's answers (logged as jobs log them: tags, metrics and
`predictions/<task>.jsonl`) with a known true difference on some cells and none on others; Holm's
and Benjamini-Hochberg's adjusted p against statsmodels' `multipletests`, the intervals, verdicts and
minimum detectable difference against the formulas computed here by hand; `prunebench-compare`'s
exit codes."""

from __future__ import annotations

import json
import math

import mlflow
import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from prunebench.inputs import log_inputs
from prunebench.report.cli import main as report_main
from prunebench.report.compare import main as compare_main
from prunebench.report.paper import dense_verdicts, task_results
from prunebench.report.predictions import Predictions
from prunebench.report.table import load_runs
from prunebench.report.verdicts import adjust

N = 400
TASKS = ("arc_easy", "piqa")


def answers(drop: int, noise: int, seed: int) -> list[float]:
    """The dense model gets the first 240 of 400 right. A pruned cell loses `drop` right answers
    for good and swaps `noise` right answers for `noise` wrong ones (no net change)."""
    dense = np.array([1.0] * 240 + [0.0] * 160)
    rng = np.random.default_rng(seed)
    right, wrong = rng.permutation(240), 240 + rng.permutation(160)
    out = dense.copy()
    out[right[:drop + noise]] = 0.0
    out[wrong[:noise]] = 1.0
    return out.tolist()


def log_job(pruner: str, sparsity: float, values: dict[str, list[float]], parent: str | None = None,
            inputs: dict[str, dict[str, str]] | None = None) -> str:
    tags = {"prunebench.run_key": f"{pruner}-{sparsity}-{parent}", "prunebench.model": "scripted",
            "prunebench.pruner": pruner, "prunebench.sparsity": str(sparsity), "prunebench.task": "suite",
            "prunebench.avg_metrics": json.dumps({t: "acc" for t in values}), "prunebench.limit": "null",
            **({"mlflow.parentRunId": parent} if parent else {})}
    with mlflow.start_run(tags=tags, nested=parent is not None) as run:
        mlflow.log_params({"seed": "0", "pruner.name": pruner})
        for task, docs in values.items():
            mlflow.log_metrics({f"{task}/acc": sum(docs) / len(docs), f"{task}/n_docs": len(docs)})
            mlflow.log_text("\n".join(json.dumps({"doc_id": i, "acc": v}) for i, v in enumerate(docs)),
                            f"predictions/{task}.jsonl")
        log_inputs(inputs or {})  # as a job logs the local data it read
    return run.info.run_id


# (pruner, sparsity) -> per task (right answers lost for good, swapped answers): a true 10-point
# drop, a true 0.5-point drop, no change at all, and no net change under heavy swapping
CELLS = {("a", 0.3): {"arc_easy": (0, 0), "piqa": (2, 3)}, ("a", 0.5): {"arc_easy": (40, 10), "piqa": (40, 5)},
         ("b", 0.3): {"arc_easy": (0, 30), "piqa": (0, 1)}, ("b", 0.5): {"arc_easy": (2, 40), "piqa": (40, 40)}}


def seed_of(pruner: str, sparsity: float, task: str) -> int:
    return 1 + 2 * list(CELLS).index((pruner, sparsity)) + TASKS.index(task)


@pytest.fixture
def grid(store):
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    with mlflow.start_run(tags={"prunebench.sweep": "true"}) as parent:
        pass
    ids = {"dense": log_job("none", 0.0, {t: answers(0, 0, 0) for t in TASKS}, parent.info.run_id)}
    for (pruner, sparsity), cell in CELLS.items():
        ids[pruner, sparsity] = log_job(pruner, sparsity, {t: answers(*cell[t], seed=seed_of(pruner, sparsity, t))
                                                           for t in TASKS}, parent.info.run_id)
    return parent.info.run_id, ids


Z, Z_POWER = 1.959963984540054, 0.8416212335729143


def bonett_price(lost: int, gained: int, n: int) -> tuple[float, float]:
    """Bonett and Price (2012), eq. 4: p12 = (n12 + 1) / (n + 2), p21 = (n21 + 1) / (n + 2),
    (p21 - p12) +- z sqrt((p12 + p21 - (p21 - p12)^2) / (n + 2)); as (centre, se) in points."""
    p12, p21 = (lost + 1) / (n + 2), (gained + 1) / (n + 2)
    return 100 * (p21 - p12), 100 * math.sqrt((p12 + p21 - (p21 - p12) ** 2) / (n + 2))


def by_hand(reference: list[float], candidate: list[float], max_drop: float) -> dict:
    d = 100 * (np.array(candidate) - np.array(reference))
    lost = sum(r > c for r, c in zip(reference, candidate))
    gained = sum(c > r for r, c in zip(reference, candidate))
    centre, se = bonett_price(lost, gained, len(d))
    low, high, mdd = centre - Z * se, centre + Z * se, (Z + Z_POWER) * se
    return {"diff": d.mean(), "ci_low": low, "ci_high": high, "mdd": mdd,
            "p": binomtest(lost, lost + gained).pvalue if lost + gained else 1.0,
            "verdict": "kept" if low > -max_drop and mdd <= max_drop else "lost" if high < -max_drop else "inconclusive"}


@pytest.mark.parametrize("n, kept", [(2, False), (20, False), (2000, True)])
def test_no_flipped_document_is_kept_only_where_the_documents_can_say_so(n, kept):
    """Identical answers: the plain Wald interval is [0, 0] at any n, so 2 documents were "kept". The
    adjusted interval leaves +-69 points at 2 documents, +-13 at 20 and +-0.14 at 2,000."""
    from prunebench.report.verdicts import compare

    answers = [1.0, 0.0] * (n // 2)
    row = compare(answers, answers, 100.0, 1.0)
    centre, se = bonett_price(0, 0, n)
    assert (row["diff"], centre) == (0.0, 0.0) and row["ci_low"] == pytest.approx(-Z * se) == -row["ci_high"]
    assert row["verdict"] == ("kept" if kept else "inconclusive"), row
    assert {2: 69.3, 20: 12.6, 2000: 0.14}[n] == pytest.approx(row["ci_high"], abs=0.05)
    if not kept:  # the documents that would settle it, were the answers as alike as now: the detectable difference's
        assert row["docs_to_settle"] == math.ceil(((Z + Z_POWER) * se) ** 2 * (n + 2) / 1.0 ** 2 - 2) > n


@pytest.mark.parametrize("correction", ["holm", "bh"])
def test_adjusted_p_verdicts_and_detectable_difference_across_the_grid(grid, correction):
    statsmodels = pytest.importorskip("statsmodels.stats.multitest")
    parent, ids = grid
    table = dense_verdicts(task_results(load_runs("prunebench", parent)), Predictions(), 1.0, correction)
    assert len(table) == 8  # 4 pruned cells x 2 tasks, every one against the dense run
    dense = {t: answers(0, 0, 0) for t in TASKS}
    for _, row in table.iterrows():
        pruner = row.pruner
        cell = CELLS[pruner, row.ratio][row.task]
        expected = by_hand(dense[row.task], answers(*cell, seed=seed_of(pruner, row.ratio, row.task)), 1.0)
        for key in ("diff", "ci_low", "ci_high", "mdd"):
            assert row[key] == pytest.approx(expected[key], abs=1e-9), (key, row.pruner, row.ratio, row.task)
        assert row.p == pytest.approx(expected["p"], rel=1e-12) and row.verdict == expected["verdict"]
        assert row["diff"] == pytest.approx(-100 * cell[0] / N)  # the scripted true difference
    method = {"holm": "holm", "bh": "fdr_bh"}[correction]
    assert table.p_adj.tolist() == pytest.approx(statsmodels.multipletests(table.p.tolist(), method=method)[1].tolist(),
                                                 rel=1e-12)
    verdicts = dict(zip(zip(table.pruner, table.ratio, table.task), table.verdict))
    # 10 points lost: lost; nothing changed: kept; heavy swapping, no net change: too noisy to settle at 400
    assert verdicts["a", 0.5, "arc_easy"] == verdicts["b", 0.5, "piqa"] == "lost"
    assert verdicts["a", 0.3, "arc_easy"] == "kept"
    assert verdicts["b", 0.5, "arc_easy"] == "inconclusive"
    row = table[(table.pruner == "b") & (table.ratio == 0.5) & (table.task == "arc_easy")].iloc[0]
    # the documents at which the interval's half-width would reach the gap to -1 point
    centre, se = (row.ci_low + row.ci_high) / 2, (row.ci_high - row.ci_low) / (2 * Z)
    needed = max((Z * se) ** 2 / (centre + 1.0) ** 2, ((Z + Z_POWER) * se) ** 2 / 1.0 ** 2) * (N + 2)
    assert row.docs_to_settle == math.ceil(needed - 2) > N


def test_holm_equals_statsmodels_on_ties_and_the_cap():
    statsmodels = pytest.importorskip("statsmodels.stats.multitest")
    p = [0.01, 0.04, 0.04, 0.3, 0.001, 0.9, 0.02]
    assert adjust(p, "holm") == pytest.approx(statsmodels.multipletests(p, method="holm")[1].tolist(), rel=1e-12)
    with pytest.raises(ValueError, match="valid: \\['holm', 'bh'\\]"):
        adjust(p, "bonferroni")


def test_paper_report_has_a_verdict_per_row(grid, tmp_path):
    parent, _ = grid
    out = tmp_path / "rep"
    assert report_main(["--sweep", parent, "--out", str(out), "--layout", "paper", "--max-drop", "1"]) == 0
    paper = pd.read_csv(out / "paper.csv")
    verdict = dict(zip(zip(paper.pruner, paper.ratio), paper.verdict.fillna("")))
    assert verdict == {("none", 0.0): "", ("a", 0.3): "inconclusive", ("a", 0.5): "lost",
                       ("b", 0.3): "inconclusive", ("b", 0.5): "lost"}
    text = (out / "paper.md").read_text()
    assert "## Verdicts against the dense run (tolerance 1 points; p adjusted by Holm across the 8 comparisons)" in text
    # the sweep's run page shows the table as its description, and says where the jobs and plots are
    note = mlflow.MlflowClient().get_run(parent).data.tags["mlflow.note.content"]
    # where the jobs and plots are first: the lines the folded description shows
    where, report = note.split("\n\n", 1)
    assert "**Model training**" in where and "**Artifacts**, `report/`" in where
    assert report.startswith((out / "results.md").read_text()[:200]) and "| scripted | a | 0.5 |" in note
    assert len(pd.read_csv(out / "verdicts.csv")) == 8


def test_a_long_report_is_cut_to_what_mlflow_keeps_as_a_description(store):
    from prunebench.tracking.sweep import DESCRIPTION_CHARS, describe

    client = mlflow.MlflowClient(store)
    run = client.create_run(client.create_experiment("described"))
    describe(client, run.info.run_id, "\n".join(f"| row {i} | 0.5 |" for i in range(2000)))
    note = client.get_run(run.info.run_id).data.tags["mlflow.note.content"]
    assert len(note) <= DESCRIPTION_CHARS and "(cut here: report/results.md has it all)" in note
    assert "| row 0 | 0.5 |" in note and "| row 1999 |" not in note
    # results.md's plot, relative to its folder, drew a broken image on the run page: named instead
    describe(client, run.info.run_id, "| a |\n\n![quality against measured speedup](speed_front.png)\n")
    note = client.get_run(run.info.run_id).data.tags["mlflow.note.content"]
    assert note.endswith("| a |\n\n(quality against measured speedup: Artifacts, `report/speed_front.png`)\n")


def test_compare_exit_codes(grid, capsys):
    parent, ids = grid
    # a true 10-point drop on both tasks: lost
    assert compare_main([ids["dense"], ids["a", 0.5]]) == 1
    assert "2 lost: exit 1" in capsys.readouterr().out
    # the same answers in another run: kept on both (an interval of width 0 at 0)
    copy = log_job("none", 0.0, {t: answers(0, 0, 0) for t in TASKS})
    assert compare_main([ids["dense"], copy]) == 0
    # no net change under heavy swapping on arc_easy, and 40 lost on piqa: lost wins
    assert compare_main([ids["dense"], ids["b", 0.5], "--max-drop", "1"]) == 1
    # arc_easy's 30 swapped answers are inconclusive at 1 point, and at 5: its interval lies within
    # -5 but a 5.5-point difference is the least 400 documents detect; with 6 points it is kept
    assert compare_main([ids["a", 0.3], ids["b", 0.3], "--max-drop", "0.5"]) == 2
    assert compare_main([ids["a", 0.3], ids["b", 0.3], "--max-drop", "5"]) == 2
    assert compare_main([ids["a", 0.3], ids["b", 0.3], "--max-drop", "6"]) == 0
    capsys.readouterr()


def test_one_run_or_sweep_on_both_sides_is_refused_not_kept(grid, capsys):
    parent, ids = grid
    assert compare_main([ids["dense"], ids["dense"]]) == 3
    out = capsys.readouterr()
    assert f"A ({ids['dense']}) and B ({ids['dense']}) are one run" in out.err and out.out == ""
    assert compare_main([parent, "latest"]) == 3
    assert "are one sweep" in capsys.readouterr().err
    assert compare_main(["latest", "latest"]) == 3


def test_compare_refuses_a_bad_id_and_bad_usage_with_their_own_codes(grid, capsys):
    parent, ids = grid
    assert compare_main(["0123456789abcdef", ids["dense"]]) == 3
    err = capsys.readouterr()
    assert "no run '0123456789abcdef'" in err.err and err.out == ""
    assert compare_main([parent, ids["dense"]]) == 3
    assert "is a sweep and" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        compare_main([ids["dense"]])
    assert exit_.value.code == 64
    for bad in ("-1", "nan", "inf"):  # -1 would judge a zero difference lost; nan judges nothing
        with pytest.raises(SystemExit) as exit_:
            compare_main([ids["dense"], ids["a", 0.5], "--max-drop", bad])
        assert exit_.value.code == 64
        with pytest.raises(SystemExit) as exit_:
            report_main(["--layout", "paper", "--max-drop", bad])
        assert exit_.value.code == 2
        assert f"--max-drop {float(bad)}: a tolerance is a drop" in capsys.readouterr().err


def test_an_unknown_id_a_job_for_a_sweep_and_a_missing_store_are_one_line(grid, tmp_path, capsys):
    from prunebench.tracking.status import main as status_main

    parent, ids = grid
    assert status_main(["deadbeef"]) == 3
    assert capsys.readouterr().err.startswith("prunebench-status: no run 'deadbeef' in sqlite:///")
    assert status_main([ids["dense"]]) == 3
    assert f"run {ids['dense']} is a job, not a sweep's parent run; its sweep is {parent}" in capsys.readouterr().err
    assert report_main(["--sweep", "deadbeef", "--out", str(tmp_path / "r")]) == 3
    assert "prunebench-report: no run 'deadbeef'" in capsys.readouterr().err
    assert report_main(["--sweep", ids["dense"], "--out", str(tmp_path / "r")]) == 3
    assert "is a job, not a sweep's parent run" in capsys.readouterr().err
    missing = tmp_path / "nowhere" / "mlflow.db"
    for call in (lambda: status_main(["latest", "--uri", f"sqlite:///{missing}"]),
                 lambda: report_main(["--tracking-uri", f"sqlite:///{missing}", "--out", str(tmp_path / "r")]),
                 lambda: compare_main(["latest", "latest", "--tracking-uri", f"sqlite:///{missing}"])):
        assert call() == 3
        err = capsys.readouterr().err
        assert f"no MLflow store at sqlite:///{missing}" in err and "Traceback" not in err
    assert not missing.parent.exists()  # nothing created


def test_compare_pairs_only_documents_of_the_same_data_and_says_how_many(grid, tmp_path, capsys):
    """The same task name over two files is not paired document by document (it was, and "kept");
    another limit pairs the documents both runs evaluated, and says so."""
    one, other = {"task:arc_easy": {str(tmp_path / "a.jsonl"): "a" * 64}}, {"task:arc_easy": {str(tmp_path / "b.jsonl"): "b" * 64}}
    a = log_job("none", 0.0, {"arc_easy": answers(0, 0, 0)}, inputs=one)
    b = log_job("none", 0.0, {"arc_easy": answers(0, 0, 0)}, inputs=other)
    assert compare_main([a, b]) == 3
    err = capsys.readouterr().err
    assert "arc_easy: not compared, A and B read other data (A: a.jsonl@aaaaaaaa; B: b.jsonl@bbbbbbbb)" in err
    assert compare_main([a, log_job("none", 0.0, {"arc_easy": answers(0, 0, 0)})]) == 3  # local data against the hub
    assert "B: the hub" in capsys.readouterr().err
    renamed = log_job("none", 0.0, {"arc_easy": answers(0, 0, 0)}, inputs={"task:arc_easy": {str(tmp_path / "c.jsonl"): "a" * 64}})
    assert compare_main([a, renamed]) == 0  # the same bytes under another name are the same documents
    shorter = log_job("magnitude", 0.5, {"arc_easy": answers(0, 0, 0)[:100]}, inputs=one)
    assert compare_main([a, shorter, "--max-drop", "10"]) == 0
    out = capsys.readouterr()
    assert "arc_easy: A evaluated 400 documents and B 100; the 100 both evaluated are paired" in out.err
    assert "| arc_easy | acc | 100 |" in out.out



@pytest.mark.parametrize("tolerance", ["0", "-0", "1e308", "100"])
def test_a_zero_or_huge_tolerance_gives_verdicts_not_a_traceback(grid, capsys, tolerance):
    parent, ids = grid
    code = compare_main([ids["a", 0.3], ids["b", 0.3], "--max-drop", tolerance])
    out = capsys.readouterr().out
    if float(tolerance) == 0:  # no interval rules out a drop of any size: nothing is kept
        assert code == 2 and "kept" not in out.split("\n\n")[-1], out
    else:
        assert code == 0, out
    assert ("every score is within it" in out) == (float(tolerance) >= 100), out


def test_a_sweep_against_one_that_holds_only_its_dense_run_compares_nothing_with_itself(grid, capsys):
    from prunebench.tracking.sweep import CELL_TAG

    parent, ids = grid
    with mlflow.start_run(tags={"prunebench.sweep": "true"}) as interrupted:
        pass
    dense = mlflow.MlflowClient().get_run(ids["dense"])
    mlflow.MlflowClient().set_tag(interrupted.info.run_id, CELL_TAG + dense.data.tags["prunebench.run_key"],
                                  ids["dense"])
    assert compare_main([parent, interrupted.info.run_id]) == 3
    err = capsys.readouterr().err
    assert "A and B name the same run" in err and ids["dense"] in err and "nothing else is shared" in err, err


def test_a_report_out_that_is_a_file_is_refused(grid, tmp_path, capsys):
    taken = tmp_path / "report.md"
    taken.write_text("mine")
    for out in (taken, taken / "sub"):
        assert report_main(["--all", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"{taken} is a file, not a folder" in err and "Traceback" not in err, err
    assert taken.read_text() == "mine"
