"""A non-editable install works: the wheel carries the configs, and its `prunebench` runs a job from
a folder that is not the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from conftest import MC_FIXTURE

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_in_a_fresh_venv_composes_its_own_configs_and_runs_a_job(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools leaves build/ in the tree it builds
    for folder in ("src", "conf"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True)
    wheel, = (tmp_path / "dist").glob("prunebench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"prunebench/conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs <= names, sorted(configs - names)[:5]
    # the launcher of prunebench_slurm / slurm_gpu: Hydra loads launchers only from the hydra_plugins namespace
    assert "hydra_plugins/prunebench_launcher/detachable_launcher.py" in names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # the dependencies are borrowed from this environment (a second 6 GB torch install proves nothing);
    # a path added by a .pth runs none of that folder's own .pth files, so this checkout's editable
    # install stays out of the new venv
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True)

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the wheel may provide prunebench
    located = subprocess.run([venv / "bin" / "python", "-c", "import prunebench.paths as c; print(c.CONF_DIR)"],
                             cwd=work, check=True, capture_output=True, text=True, env=env).stdout.strip()
    assert located == str(site / "prunebench" / "conf")
    job = subprocess.run([venv / "bin" / "prunebench", "model=tiny-llama", "pruner=none", "task=local_mc",
                          f"task.tasks.local_mc.source.path={MC_FIXTURE}", f"tracking.uri=sqlite:///{work}/mlflow.db"],
                         cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert job.returncode == 0, job.stderr[-3000:]
    assert (work / "mlflow.db").is_file()
