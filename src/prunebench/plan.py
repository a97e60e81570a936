"""`prunebench-plan` (and `prunebench -m ... plan=true`): a sweep's jobs before any of them runs.

A preset is hundreds of GPU-hours; before paying for them a user wants to see the grid it expands
to, which jobs the store already holds (a FINISHED run with the job's run key, so a rerun skips
them), what is left and what each remaining job costs: its cost class, and the time it may take.
That time is the median duration of the store's finished runs of the same setting (`TIMING`), the
whole job; else, so that a first run of a setting is not blind, its evaluation's estimate
(`EvalTimer`): the positions it runs (documents x tokens, as its progress bar counts them) at a speed
measured on a machine, the store's runs of the model (a number) or this machine's matmul rate (a
lower bound); else "unknown", with the reason. Nothing is assumed of a machine: each speed is
measured. Every job is composed and validated as the sweep would (so a bad cell shows here, not an
hour in) and no model weights, score or MLflow run are made: the store is only read, a store that
does not exist yet is not created, and the tokenizers are read from local files only."""

from __future__ import annotations

import copy
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from prunebench.cache import content_key
from prunebench.inputs import job_inputs
from prunebench.tracking import store
from prunebench.tracking.run_key import dense_config, dense_key, is_dense, run_key
from prunebench.tracking.tags import flatten, setting_tags

DENSE = "(dense baseline)"


@dataclass
class PlannedJob:
    overrides: list[str]
    status: str  # done | left | invalid | repeat (the same run key as an earlier job)
    cost: str = ""
    note: str = ""
    serves: list[int] = field(default_factory=list)  # a dense baseline: the grid jobs it is the baseline of
    durations: list[float] = field(default_factory=list)  # a left job's: its setting's finished runs', in s
    evaluation: EvalTime | None = None  # a left job's without durations: its evaluation's estimate

    @property
    def estimate(self) -> str:
        if self.status != "left":
            return ""
        if self.durations:
            return f"~{readable(median(self.durations))} ({runs(len(self.durations))})"
        if self.evaluation and self.evaluation.seconds is not None:
            return f"{self.evaluation.prefix}{readable(self.evaluation.seconds)} eval ({self.evaluation.basis})"
        return "unknown"


def runs(count: int) -> str:
    return f"{count} run{'s' * (count > 1)}"


@dataclass
class EvalTime:
    """A job's evaluation time: its positions (the progress bar's count) at a speed, `basis` naming
    which; `bound`: a lower bound (this machine's matmul rate); `why`: the reason it is unknown."""

    seconds: float | None = None
    positions: int | None = None
    basis: str = ""
    bound: bool = False
    why: str = ""

    @property
    def prefix(self) -> str:
        return ">=" if self.bound else "~"


class EvalTimer:
    """The evaluation time of a left job whose setting the store has not timed: its positions (the
    job's own engines build their data modules on its tokenizer and max_length, read from local
    files, models/stated.py: no weights) at the median speed (positions/s, `time/eval_positions` over
    `time/eval_s`) of the store's finished runs of the same model, dtype and device, whatever their
    task or pruner; where it has none, at this machine's matmul rate in the job's dtype on its device
    (bench/probe.py) for 2 x the model's forward parameters per position: a lower bound. What is
    counted once per plan: a model's files, a task's positions per (model, task, limit, eval options),
    the rate per (dtype, device). Unknown, with the reason, where any of it is not at hand here: a hub
    id not cached, a device this machine lacks (for the matmul rate), an engine that counts no
    positions (a classifier's). A generation's positions hold its whole `max_gen_toks`, which a stop
    string may cut short; its bound holds still in practice, a decoding step running far below the
    matmul rate."""

    def __init__(self):
        self.known: dict[tuple, object] = {}  # (what, key): a value, or the Unstated that answered it

    def __call__(self, cfg: DictConfig, tasks: dict, speeds: list[float]) -> EvalTime:
        from prunebench.bench.probe import matmul_rate
        from prunebench.models.stated import Unstated

        try:
            setting = (model_identity(cfg), content_key(OmegaConf.to_container(cfg.task, resolve=True)),
                       cfg.get("limit"), content_key(OmegaConf.to_container(cfg.eval, resolve=True)))
            work = sum(self.positions(cfg, setting, name, task) for name, task in tasks.items())
            if speeds:
                return EvalTime(work / median(speeds), work, f"{runs(len(speeds))}'{'s' * (len(speeds) == 1)} speed")
            rate = self.once("rate", machine(cfg), lambda: matmul_rate(*machine(cfg)))
            flops = 2 * self.once("parameters", model_identity(cfg), lambda: self.model(cfg).forward_parameters())
            return EvalTime(work * flops / rate, work, "matmul", bound=True)
        except Unstated as err:
            return EvalTime(why=str(err))

    def once(self, what: str, key, compute: Callable):
        from prunebench.models.stated import Unstated

        if (what, key) not in self.known:
            try:
                self.known[what, key] = compute()
            except Exception as err:  # Unstated, or any reason the files or the task do not count here
                self.known[what, key] = err if isinstance(err, Unstated) else Unstated(
                    f"{type(err).__name__}: {' '.join(str(err).split())[:160]}")
        if isinstance(self.known[what, key], Unstated):
            raise self.known[what, key]
        return self.known[what, key]

    def model(self, cfg: DictConfig):
        from prunebench.models.stated import stated_model

        return self.once("model", model_identity(cfg), lambda: stated_model(cfg.model))

    def positions(self, cfg: DictConfig, setting: tuple, name: str, task) -> int:
        """`setting`: what the count depends on besides the task's name, resolved once per job (the
        model's identity, the task config, limit and the eval options)."""
        from prunebench.evaluation.registry import prepared
        from prunebench.models.stated import Unstated

        def count() -> int:  # on the job's device, present here or not: it decides the batches, not their sum
            unloaded = self.model(cfg).unloaded(str(cfg.model.get("device") or "cpu"))
            work = prepared(task, unloaded, cfg.get("limit"), cfg.eval)[2]
            if work is None:
                raise Unstated(f"task {name}: its engine counts no positions")
            return work

        return self.once("positions", (*setting, name), count)


def model_identity(cfg: DictConfig) -> str:
    """What a model's tokenizer, context and architecture depend on: its config but where it runs."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    return content_key({k: v for k, v in model.items() if k not in ("dtype", "device", "seed", "params_b")})


def machine(cfg: DictConfig) -> tuple:
    """(torch dtype, device) the job runs in; Unstated where this machine has not the device."""
    from prunebench.api.model_keys import run_dtype
    from prunebench.bench.probe import present
    from prunebench.models.loaded import resolve_dtype
    from prunebench.models.stated import Unstated

    device = str(cfg.model.get("device") or "cpu")
    try:
        here = present(device)
    except RuntimeError:  # not a torch device: accelerate's device_map="auto", say
        here = False
    if not here:
        raise Unstated(f"model.device={device} is not on this machine")
    return resolve_dtype(run_dtype(cfg.model)), device


@dataclass(frozen=True)
class Setting:
    """The tags and params of a run that a stored number holds for: a tuple, read off a stored run
    (`of_run`) or off a job not yet run, as it would log them (`of_job`, tags.py)."""

    tags: tuple[str, ...]
    params: tuple[str, ...]

    def of_run(self, tags: dict[str, str], params: dict[str, str]) -> tuple:
        return (*(tags.get(t) for t in self.tags), *(params.get(p) for p in self.params))

    def of_job(self, cfg: DictConfig) -> tuple:
        return self.of_run(setting_tags(cfg), flatten({key: OmegaConf.select(cfg, key) for key in self.params}))


# what a job's duration depends on besides its sparsity and seed: a stored run with these equal is
# the same work on the same kind of device (its scores computed or read from the cache aside)
TIMING = Setting(("prunebench.model", "prunebench.task", "prunebench.pruner", "prunebench.protocol",
                  "prunebench.dtype", "prunebench.recovery"),
                 ("limit", "bench.name", "trainer.accelerator", "trainer.devices", "model.device"))
# what a run's evaluation speed (positions/s) holds for: its model, dtype and device, whatever it
# evaluated or how it was pruned (a pruned model runs the dense model's kernels)
SPEED = Setting(("prunebench.model", "prunebench.dtype"), ("trainer.accelerator", "model.device"))


@dataclass
class Finished:
    """A store's FINISHED runs: their run keys, their durations by `TIMING` and their evaluation
    speeds (positions/s) by `SPEED`."""

    keys: set[str] = field(default_factory=set)
    durations: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))
    speeds: dict[tuple, list[float]] = field(default_factory=lambda: defaultdict(list))


def finished_runs(uri: str, experiment: str) -> Finished:
    """Read only: a SQLite file or experiment that does not exist has none."""
    from mlflow.tracking import MlflowClient

    finished = Finished()
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return finished
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    token = None
    while found is not None:
        page = client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'", max_results=1000,
                                  page_token=token)
        for run in page:
            if store.KEY_TAG not in run.data.tags:  # a sweep's parent
                continue
            finished.keys.add(run.data.tags[store.KEY_TAG])
            if run.info.end_time and run.info.start_time:
                finished.durations[TIMING.of_run(run.data.tags, run.data.params)].append(
                    (run.info.end_time - run.info.start_time) / 1000)
            positions, seconds = run.data.metrics.get("time/eval_positions"), run.data.metrics.get("time/eval_s")
            if positions and seconds:
                finished.speeds[SPEED.of_run(run.data.tags, run.data.params)].append(positions / seconds)
        token = page.token
        if not token:
            break
    return finished


def readable(seconds: float) -> str:
    if seconds < 10:  # an estimate of a small job: its two significant digits, not "0 s", above 10 ms
        return "0 s" if seconds < 0.01 else f"{seconds:.2g} s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def size_class(model: DictConfig) -> str:
    """From the model config's `params_b` hint (billions of parameters); tiny-* test models are tiny."""
    billions = model.get("params_b")
    if billions is None:
        return "tiny" if str(model.name).startswith("tiny-") else "size?"
    return "<1B" if billions < 1 else "1-10B" if billions <= 10 else ">10B"


def work_class(cfg: DictConfig, scored: set[str]) -> str:
    """What the job computes: scoring is paid by the first job of a (model, scorer, calib) group and
    read from the score cache by the others; MoP re-scores as it prunes, in every job; a recovery
    adds its training (hours on a real model), in optimizer steps or epochs."""
    from prunebench.pruning import score_identity
    from prunebench.tracking.run_key import recovering

    pruner = instantiate(cfg.pruner, _convert_="all")  # an option may decide `cacheable` (wanda's sequential)
    if is_dense(cfg) or not pruner.needs_calibration:
        work = "eval"
    elif not pruner.cacheable:
        work = "iterative+eval"
    else:
        key = content_key(score_identity(cfg, True))
        work = "eval (scores shared)" if key in scored else "score+eval"
        scored.add(key)
    if recovering(cfg) and not is_dense(cfg):
        rec = cfg.recovery
        work += f"+recovery({rec.max_steps} steps)" if rec.max_steps else f"+recovery({rec.epochs} epochs)"
    return work + ("+latency" if cfg.bench.name != "none" else "")


def memory_class(cfg: DictConfig) -> str:
    """With pruning.onload set: whether the job onloads and the GB its device holds (`/onload 13.1GB`,
    `/whole 146GB`: pruning.footprint); nothing where the option is `none` or the checkpoint's config
    is not at hand (a hub id not cached: the job checks it when it starts)."""
    from prunebench.models.checks import stated_config
    from prunebench.pruning import footprint, onload_option, onloads

    if onload_option(cfg) == "none":
        return ""
    config = stated_config(cfg.model, [])
    if config is None:
        return ""
    pruner = instantiate(cfg.pruner, _convert_="all")
    need = footprint(cfg, config, pruner)
    return f"/onload {need.onloaded / 1e9:.3g}GB" if onloads(cfg, pruner, config) else f"/whole {need.whole / 1e9:.3g}GB"


def plan(grid: list[list[str]], compose: Callable[[list[str]], DictConfig]) -> list[PlannedJob]:
    """The sweep's jobs in launch order, then the dense baselines they would evaluate first
    (`tracking.ensure_dense`) that are not grid jobs themselves."""
    from prunebench.tasks.lm_eval_task import PLANNED
    from prunebench.pruning import key_by_removed
    from prunebench.validate import validate

    PLANNED.clear()  # this plan's lm-eval tasks, built once for its jobs; another plan reads the files again
    jobs, by_key, dense, scored, finished, timer = [], {}, {}, set(), {}, EvalTimer()

    def timed(job: PlannedJob, cfg: DictConfig, tasks: dict, where: tuple) -> PlannedJob:
        """A left job the store has not timed: its evaluation's estimate, or why there is none."""
        if job.status == "left" and not job.durations:
            job.evaluation = timer(cfg, tasks, finished[where].speeds.get(SPEED.of_job(cfg), []))
            if job.evaluation.why:
                job.note = "; ".join(filter(None, [job.note, f"time unknown: {job.evaluation.why}"]))
        return job

    for overrides in grid:
        deferred = []  # checks needing a hub file not cached here: a plan asks no network (validate)
        try:
            cfg = compose(overrides)
            tasks = validate(cfg, deferred, overrides)
            key_by_removed(cfg)
            inputs = job_inputs(cfg, tasks)
            key = run_key(cfg, inputs)
        except Exception as err:  # any reason a job cannot run is the plan's to show
            message = " ".join(str(err).split())
            jobs.append(PlannedJob(overrides, "invalid", note=f"{type(err).__name__}: {message[:400]}"))
            continue
        where = (store.tracking_uri(cfg.tracking.uri), cfg.tracking.experiment)
        if where not in finished:
            finished[where] = finished_runs(*where)
        if key in by_key:
            jobs.append(PlannedJob(overrides, "repeat", note=f"same run key as #{by_key[key]}"))
            continue
        by_key[key] = len(jobs)
        jobs.append(timed(PlannedJob(overrides, "done" if key in finished[where].keys else "left",
                                     f"{size_class(cfg.model)}/{work_class(cfg, scored)}{memory_class(cfg)}",
                                     note="; ".join(deferred), durations=finished[where].durations.get(TIMING.of_job(cfg), [])),
                          cfg, tasks, where))
        if not is_dense(cfg) and cfg.tracking.ensure_dense:
            baseline = dense_key(cfg, inputs)
            if baseline not in dense:
                dense[baseline] = dense_config(cfg), where, tasks, []
            dense[baseline][3].append(len(jobs) - 1)
    for key, (cfg, where, tasks, serves) in dense.items():
        if key not in by_key:
            jobs.append(timed(PlannedJob([DENSE, f"model={cfg.model.name}", f"task={cfg.task.name}"],
                                         "done" if key in finished[where].keys else "left",
                                         f"{size_class(cfg.model)}/{work_class(cfg, scored)}", serves=serves,
                                         durations=finished[where].durations.get(TIMING.of_job(cfg), [])),
                              cfg, tasks, where))
    return jobs


def format_plan(jobs: list[PlannedJob], title: str = "") -> str:
    """One line per job (the overrides every job shares are printed once), then the totals."""
    grid = [j.overrides for j in jobs if j.overrides[:1] != [DENSE]]
    shared = [o for o in grid[0] if all(o in g for g in grid)] if grid else []
    width = max([len(j.cost) for j in jobs] + [4])
    timed = max([len(j.estimate) for j in jobs] + [len("time")])
    lines = [f"plan{': ' + title if title else ''}", f"every job: {' '.join(shared) or '(no shared overrides)'}",
             f"{'#':>4}  {'status':<7}  {'cost':<{width}}  {'time':<{timed}}  overrides"]
    for i, job in enumerate(jobs):
        shown = " ".join(o for o in job.overrides if o not in shared)
        note = "; ".join(filter(None, [f"baseline of {span(job.serves)}" if job.serves else "", job.note]))
        lines.append(f"{i:>4}  {job.status:<7}  {job.cost:<{width}}  {job.estimate:<{timed}}  {shown}"
                     + (f"  [{note}]" if note else ""))
    status = Counter(j.status for j in jobs)
    dense = sum(j.overrides[:1] == [DENSE] for j in jobs)
    left = [j for j in jobs if j.status == "left"]
    lines.append(f"{len(jobs) - dense} grid jobs + {dense} dense baseline(s): {status['done']} done, "
                 f"{status['left']} left, {status['invalid']} invalid, {status['repeat']} repeated")
    if left:
        lines.append("left by cost: " + ", ".join(f"{cost} x{n}" for cost, n in sorted(Counter(j.cost for j in left).items())))
        lines += time_lines(left)
    return "\n".join(lines)


def time_lines(left: list[PlannedJob]) -> list[str]:
    """The left jobs' time, one at a time, summed by kind (a whole job's time, an evaluation's
    estimate, an evaluation's lower bound are not one quantity): what each kind means and how many
    jobs it covers."""
    whole = [median(j.durations) for j in left if j.durations]
    evals = [j.evaluation for j in left if not j.durations and j.evaluation and j.evaluation.seconds is not None]
    speed = [e.seconds for e in evals if not e.bound]
    bound = [e.seconds for e in evals if e.bound]
    kinds = [(whole, "~", "whole job: the median duration of the store's finished runs of its model, task, pruner, "
                          "recovery, limit, bench and device"),
             (speed, "~", "evaluation only (no pruning, recovery or latency): its positions (documents x tokens) at "
                          "the median speed of the store's finished runs of its model, dtype and device"),
             (bound, ">=", "evaluation only, a lower bound: its positions x 2 x the model's parameters at this "
                           "machine's matmul rate (a forward never reaches it)")]
    lines = [f"  {prefix}{readable(sum(seconds))} for {len(seconds)} job{'s' * (len(seconds) > 1)}, {meaning}"
             for seconds, prefix, meaning in kinds if seconds]
    unknown = len(left) - len(whole) - len(evals)
    if not lines:
        return [f"time: none of the {len(left)} left jobs has one (see each job's note)"]
    return [f"time of the {len(left)} left jobs, one at a time, by kind:", *lines,
            *([f"  {unknown} unknown (see each job's note)"] if unknown else [])]


def span(indices: list[int]) -> str:
    return f"#{indices[0]}" if len(indices) == 1 else f"{len(indices)} jobs #{indices[0]}-#{indices[-1]}"


def sweep_plan(config: DictConfig) -> int:
    """A plan=true multirun (`prunebench-plan` is one): the sweep callback calls this before anything
    launches. Prints the grid; exit status 1 when any job is invalid or the sweep does not expand."""
    arguments = " ".join(config.hydra.overrides.task)
    try:
        jobs = planned(config)
    except Exception as err:  # Hydra refuses the whole sweep so: a job that does not compose, a bad sweep
        print(f"plan: {arguments}\nthe sweep does not expand: {type(err).__name__}: {' '.join(str(err).split())}")
        return 1
    print(format_plan(jobs, arguments))
    return 1 if any(j.status == "invalid" for j in jobs) else 0


def planned(config: DictConfig) -> list[PlannedJob]:
    """The plan of a multirun's config (with its `hydra` node), inside Hydra's initialization: the
    grid as the config's own sweeper expands it (`sweep_grid`), each job composed and validated."""
    from prunebench.composer import Composer

    composer = Composer(config.hydra.job.config_name, config.hydra.overrides.hydra)
    checked: dict[tuple[str, ...], DictConfig] = {}  # the sweeper's check composed each job already
    grid = sweep_grid(config, composer, checked)

    def composed(overrides: list[str]) -> DictConfig:
        cfg = checked.pop(tuple(overrides), None)
        return composer(overrides) if cfg is None else cfg

    return plan(grid, composed)


def sweep_grid(config: DictConfig, composer=None, checked: dict | None = None) -> list[list[str]]:
    """Each job's overrides in launch order, as the config's own sweeper expands them for
    `prunebench -m` (a preset's axes, `glob()`, `range()`, interpolations), handed to a launcher that
    runs nothing (hydra_plugins' PlanLauncher), in a scratch sweep folder. The sweeper's check that
    every job composes goes through `composer` (the defaults tree once per set of group choices, not
    once per job), and what it composed stays in `checked` (`ComposingLoader`)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext

    from prunebench.composer import Composer, ComposingLoader

    composer = composer or Composer(config.hydra.job.config_name, config.hydra.overrides.hydra)
    planning = copy.deepcopy(config)
    with tempfile.TemporaryDirectory() as scratch:
        with open_dict(planning):
            planning.hydra.launcher = {"_target_": "hydra_plugins.prunebench_launcher.plan_launcher.PlanLauncher"}
            planning.hydra.sweep.dir = scratch  # the sweeper writes its multirun.yaml there
        loader = ComposingLoader(GlobalHydra.instance().config_loader(), composer, checked)
        sweeper = Plugins.instance().instantiate_sweeper(config=planning, task_function=lambda cfg: None,
                                                         hydra_context=HydraContext(config_loader=loader, callbacks=None))
        arguments = [o for o in config.hydra.overrides.task if not o.startswith("plan=")]
        return [list(job.overrides) for batch in sweeper.sweep(arguments=arguments) for job in batch]
