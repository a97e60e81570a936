"""`prunebench --help` describes prunebench: its groups with their options (those on hydra.searchpath
too) and the common keys, without the internal groups (task_base) Hydra's own help would list."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_help_lists_the_groups_and_common_keys_and_hides_internal_groups():
    proc = subprocess.run([sys.executable, "-m", "prunebench", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert text.startswith("prunebench: evaluate pruned models")
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ": " in line}
    assert "magnitude" in lines["pruner"] and "tiny-llama" in lines["model"] and "local_mc" in lines["task"]
    assert "joblib" in lines["hydra/launcher"]
    for key in ("sparsity=0.5", "limit=N", "data_dir=DIR", "tracking.uri=URI", "$MLFLOW_TRACKING_URI"):
        assert key in text, key
    assert "task_base" not in text and "powered by Hydra" not in text


def test_help_and_plan_help_list_the_options_found_on_the_search_path(tmp_path, capsys, monkeypatch):
    """A lab's package (pkg://) and a folder (file://, here with a space and a quote in its path)
    add options and whole groups: both helps list them beside prunebench's own."""
    from prunebench.cli import plan_main

    folder = tmp_path / "lab's configs"
    for group, option in (("pruner", "scratch"), ("sweep_notes", "first")):
        (folder / group).mkdir(parents=True)
        (folder / group / f"{option}.yaml").write_text("name: x\n")
    searchpath = f"hydra.searchpath=[pkg://mylab.conf,'file://{str(folder).replace(chr(39), chr(92) + chr(39))}']"
    example = Path(__file__).resolve().parents[1] / "examples" / "mylab"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(example), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "prunebench", "--help", searchpath], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    monkeypatch.syspath_prepend(str(example))
    assert plan_main(["--help", searchpath]) == 0
    for text in (proc.stdout, capsys.readouterr().out):
        lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ": " in line}
        assert {"ria", "scratch", "magnitude"} <= options(lines["pruner"])
        assert {"ria_vs_wanda", "mop_llama2"} <= options(lines["experiment"])
        assert "units_mc" in options(lines["task"]) and options(lines["sweep_notes"]) == {"first"}
        assert "task_base" not in text


def options(line: str) -> set[str]:
    return set(line.split(":", 1)[1].replace(" ", "").split(","))
