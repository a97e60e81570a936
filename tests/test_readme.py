"""The README runs as written: every command of its ```bash blocks, split into arguments by bash
itself (its quoting is part of what is tested), with tiny models substituted for real ones and
small limits. Local multiple-choice runs are real runs (composed and run in this process, as the
CLI's thin app does: the process is not what is tested); the others compose, validate and plan every
job (`prunebench-plan`, which loads no model), since their models, data or cluster are not here.
The Python block and the UI filter example run against the store those runs wrote."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import mlflow
import pytest

from conftest import MC_FIXTURE, compose_cfg
from prunebench import job
from prunebench.export.cli import main as export_main
from prunebench.cli import plan_main
from prunebench.report.cli import main as report_main
from prunebench.report.compare import main as compare_main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the README's commands and the guide that carries the rest of the options (docs/usage.md) are held alike
PAGES = (README, ROOT / "docs" / "usage.md")
# the random test model of each family stands in for the README's real one
TINY = {"causal_lm": "tiny-llama", "moe": "tiny-mixtral", "encoder": "tiny-bert-cls", "vision": "tiny-vit",
        "vlm": "tiny-llava"}
# overrides that name what a test machine has not: the real model's files, a cluster, a tracking server
DROPPED = ("model.", "hydra/launcher=", "hydra.launcher.", "tracking=", "tracking.uri=")
# the files the README's examples read from the working directory: questions, and calibration text
LOCAL_FILES = ("questions.jsonl", "my.jsonl", "notes.txt")
# `pip install examples/mylab` (test_outside_package.py installs it for real): here it is put on the path
MYLAB = ROOT / "examples" / "mylab"


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def commands(text: str) -> list[list[str]]:
    """Each command line of the bash blocks (continuations joined), as the argument list bash makes."""
    found = []
    for block in blocks(text, "(?:bash|sh)"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                script = f"set -f; printf '%s\\0' {line}"  # no globbing; comments and quotes as bash reads them
                out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
                found.append(out.split("\0")[:-1])
    return found


def tiny(arguments: list[str]) -> list[str]:
    """The same overrides on the tiny model of the named model's family, two documents per task."""
    out = []
    for arg in arguments:
        if arg.startswith("model="):
            family = compose_cfg([arg]).model.family  # composed: a named model inherits its loader's family
            arg = f"model={TINY[family]}"
        if arg.startswith(DROPPED) or arg.startswith("limit="):
            continue
        out.append(arg)
    if not any(a.startswith("model=") for a in out):
        out.append("model=tiny-llama")  # the default, Gemma 3 270M, is a real model
    return [*out, "limit=2", "trainer.enable_progress_bar=false"]


def is_real_run(arguments: list[str]) -> bool:
    return "-m" not in arguments and "task=local_mc" in arguments


@pytest.fixture(scope="module")
def readme_commands() -> list[list[str]]:
    found = [command for page in PAGES for command in commands(page.read_text())]
    assert len(found) >= 8, found  # the Quick start, Using it, local file and cluster examples
    return found


def test_every_readme_command_runs_or_plans_with_tiny_models(readme_commands, store, tmp_path, monkeypatch,
                                                              caplog):
    for name in LOCAL_FILES:
        shutil.copy(MC_FIXTURE, tmp_path / name)
    monkeypatch.syspath_prepend(str(MYLAB))
    mlflow.set_tracking_uri(store)
    ran, planned, reports, compares = [], [], [], []
    for tool, *arguments in readme_commands:
        if tool in ("make", "export", "pip"):  # the CI's own steps; a sign-in for a server not here; an install
            continue
        assert tool in ("prunebench", "prunebench-plan", "prunebench-report", "prunebench-export",
                        "prunebench-compare"), f"README runs an unknown tool: {tool}"
        if tool == "prunebench-report":
            reports.append(arguments)
        elif tool == "prunebench-compare":
            compares.append(arguments)
        elif tool == "prunebench-export":  # RUN_ID: the run the README's export=hf example made
            exported = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time DESC"],
                                          filter_string="tags.`hydra.overrides` LIKE '%export=hf%'").run_id[0]
            arguments = [exported if a == "RUN_ID" else str(tmp_path / a) if a == "exports" else a for a in arguments]
            assert export_main([*arguments, "--tracking-uri", store]) == 0, arguments
            assert (tmp_path / "exports" / exported / "pruning.json").is_file()
        elif tool == "prunebench-plan" or not is_real_run(arguments):
            shown = io.StringIO()
            with contextlib.redirect_stdout(shown):
                status = plan_main([a for a in tiny(arguments) if a != "-m"])
            assert status == 0, (arguments, shown.getvalue()[-3000:])
            planned.append(arguments)
        else:  # the CLI's app hands the composed config to job.run: composed here, in this process
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="prunebench"):
                job.run(compose_cfg(tiny(arguments)), tiny(arguments))
            # a single run ends by saying what it measured, which run holds it and where the store is
            assert re.search(r"FINISHED .*avg/score=.* \(run [0-9a-f]{32} in sqlite:", caplog.text), arguments
            ran.append(arguments)
    assert len(ran) >= 2 and len(planned) >= 3 and reports
    for arguments in reports:
        assert report_main(arguments) == 0, arguments
    # RUN_A RUN_B: the local-file example's dense baseline and its pruned run, judged task by task
    local = mlflow.search_runs(experiment_names=["prunebench"], order_by=["attributes.start_time ASC"],
                               filter_string="tags.`prunebench.task` = 'local_mc' and attributes.status = 'FINISHED'")
    names = {"RUN_A": local.run_id.iloc[0], "RUN_B": local.run_id.iloc[-1]}
    for arguments in compares:
        assert compare_main([names.get(a, a) for a in arguments] + ["--tracking-uri", store]) in (0, 1, 2), arguments
    # the local-file example's template reaches the prompt with a newline, not a backslash and an n
    run_id = mlflow.search_runs(experiment_names=["prunebench"],  # the pruned run and its dense baseline
                                filter_string="tags.`hydra.overrides` LIKE '%doc_to_text%'").run_id[0]
    records = mlflow.artifacts.load_text(f"runs:/{run_id}/predictions/local_mc.jsonl").splitlines()
    context = json.loads(records[0])["context"]
    assert context.startswith("Q: ") and context.endswith("\nA:") and "\\n" not in context


def test_the_python_block_and_the_ui_filter_run_against_a_store(store, tmp_path):
    text = "\n".join(page.read_text() for page in PAGES)
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    with mlflow.start_run(tags={"prunebench.pruner": "magnitude", "prunebench.sparsity": "0.5"}):
        mlflow.log_metrics({"avg/score": 0.4, "stability/avg": 80.0, "sparsity/actual": 0.5})
    (source,) = blocks(text, "python")
    exec(compile(source.replace("sqlite:///mlflow.db", store), "README.md", "exec"), {})
    (ui_filter,) = re.findall(r"filter \(e\.g\. ``(.+?)``", text, flags=re.S)
    found = mlflow.search_runs(experiment_names=["prunebench"], filter_string=" ".join(ui_filter.split()))
    assert len(found) == 1


def test_the_readme_is_a_newcomers_page():
    """Quick start, one worked example, the config groups and links; the rest lives in docs/. Each
    measured time is stated once (they contradicted each other when stated in several places)."""
    text = README.read_text()
    assert len(text.encode()) < 25_000, "the README grew back: move detail into docs/"
    for heading in ("## Quick start", "## A worked example", "## Config groups", "## Guides"):
        assert heading in text
    assert len(re.findall(r"`make run`[^|\n]*? \d+ s\b", text)) <= 1
    assert len(re.findall(r"`make test`[^|\n]*? \d+ min", text)) <= 1
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every guide it points to exists
        assert (ROOT / link).is_file(), link


def test_the_readme_shows_a_local_mc_line_the_task_reads(tmp_path):
    """The JSONL line the README shows is a document `task=local_mc` accepts as it stands."""
    from prunebench.tasks.build import build_tasks

    (line,) = blocks(README.read_text(), "json")
    path = tmp_path / "questions.jsonl"
    path.write_text(line)
    cfg = compose_cfg(["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={path}"])
    (task,) = build_tasks(cfg).values()
    (doc,) = task.docs()
    assert doc["choices"][doc["label"]] == json.loads(line)["choices"][0]
