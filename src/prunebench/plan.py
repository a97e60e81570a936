"""`prunebench-plan` (and `prunebench -m ... plan=true`): a sweep's jobs before any of them runs.

A preset is hundreds of GPU-hours; before paying for them a user wants to see the grid it expands
to, which jobs the store already holds (a FINISHED run with the job's run key, so a rerun skips
them), what is left and what each remaining job costs. Every job is composed and validated as the
sweep would (so a bad cell shows here, not an hour in) and no model, score or MLflow run is made:
the store is only read, and a store that does not exist yet is not created."""

from __future__ import annotations

import copy
import functools
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from prunebench.cache import content_key
from prunebench.inputs import job_inputs
from prunebench.tracking import store
from prunebench.tracking.run_key import dense_config, is_dense, run_key

DENSE = "(dense baseline)"


@dataclass
class PlannedJob:
    overrides: list[str]
    status: str  # done | left | invalid | repeat (the same run key as an earlier job)
    cost: str = ""
    note: str = ""
    serves: list[int] = field(default_factory=list)  # a dense baseline: the grid jobs it is the baseline of


def sweep_jobs(params: dict, arguments: list[str]) -> list[list[str]]:
    """Each job's overrides, expanded as Hydra's basic sweeper expands `hydra.sweeper.params` and
    the command line (the command line wins over a preset's axis of the same key)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(arguments))
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


def fixed_overrides(arguments: list[str]) -> list[str]:
    """The command line without its sweeps: what composes the config that holds a preset's axes."""
    return [o.input_line for o in OverridesParser.create().parse_overrides(list(arguments))
            if not o.is_sweep_override()]


def finished_keys(uri: str, experiment: str) -> set[str]:
    """Run keys with a FINISHED run, read only: a SQLite file or experiment that does not exist has none."""
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return set()
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    keys, token = set(), None
    while found is not None:
        page = client.search_runs([found.experiment_id], "attributes.status = 'FINISHED'", max_results=1000,
                                  page_token=token)
        keys |= {run.data.tags[store.KEY_TAG] for run in page if store.KEY_TAG in run.data.tags}
        token = page.token
        if not token:
            break
    return keys


def size_class(model: DictConfig) -> str:
    """From the model config's `params_b` hint (billions of parameters); tiny-* test models are tiny."""
    billions = model.get("params_b")
    if billions is None:
        return "tiny" if str(model.name).startswith("tiny-") else "size?"
    return "<1B" if billions < 1 else "1-10B" if billions <= 10 else ">10B"


def work_class(cfg: DictConfig, scored: set[str]) -> str:
    """What the job computes: scoring is paid by the first job of a (model, scorer, calib) group and
    read from the score cache by the others; MoP re-scores as it prunes, in every job."""
    from prunebench.pruning import score_identity

    pruner = instantiate(cfg.pruner, _convert_="all")  # an option may decide `cacheable` (wanda's sequential)
    if is_dense(cfg) or not pruner.needs_calibration:
        work = "eval"
    elif not pruner.cacheable:
        work = "iterative+eval"
    else:
        key = content_key(score_identity(cfg, True))
        work = "eval (scores shared)" if key in scored else "score+eval"
        scored.add(key)
    return work + ("+latency" if cfg.bench.name != "none" else "")


def sweeper_params(config: DictConfig) -> dict:
    """A preset's `hydra.sweeper.params` (an empty node when the command line alone sweeps)."""
    params = config.hydra.sweeper.params
    return OmegaConf.to_container(params, resolve=False) if params else {}


def job_composer(config_name: str) -> Callable[[list[str]], DictConfig]:
    """Hydra's compose of a job's overrides, the defaults tree built once per set of config-group
    choices: a grid's jobs differ mostly in values (sparsity, seed, limit), and building the tree
    costs 0.25-0.5 s a job on a 2-core CPU where copying the composed config and applying the values
    as Hydra applies them takes about 4 ms. The overrides are split by Hydra's own rule (a dict
    value, or a key naming no config group on the search path, sets a value; the rest choose); a
    job with a `hydra.*` override composes in full. Call inside Hydra's initialization."""
    from hydra import compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra

    repo = GlobalHydra.instance().config_loader().repository
    trees: dict[tuple[str, ...], DictConfig] = {}

    def compose_job(overrides: list[str]) -> DictConfig:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        if any(o.is_hydra_override() for o in parsed):
            with yaml_parsed_once():
                return compose(config_name, overrides=list(overrides))
        values = [o for o in parsed if isinstance(o.value(), dict) or not repo.group_exists(o.key_or_group)]
        choices = tuple(o.input_line for o in parsed if o not in values)
        if choices not in trees:
            with yaml_parsed_once():
                trees[choices] = compose(config_name, overrides=list(choices))
        cfg = copy.deepcopy(trees[choices])
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return cfg

    return compose_job


@contextmanager
def yaml_parsed_once() -> Iterator[None]:
    """Hydra's config files (file:// sources) parsed once per process while each one's size and
    modification time stay (`parsed_config_file`): Hydra parses every file of the tree again for every
    compose (a tree of the default config 128 -> 111 ms with them parsed once). Hydra's own reading
    otherwise: the header, and a new OmegaConf config each time (Hydra merges a loaded config's nodes
    into the job's config, so a config is never handed out twice)."""
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra.plugins.config_source import ConfigLoadError, ConfigResult

    def load_config(source: FileConfigSource, config_path: str) -> ConfigResult:
        path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            raise ConfigLoadError(f"Config not found : {path}") from None
        header, content = parsed_config_file(path, stat.st_mtime_ns, stat.st_size)
        config = OmegaConf.create() if content is None else OmegaConf.create(copy.deepcopy(content))
        return ConfigResult(config=config, path=f"{source.scheme()}://{source.path}", provider=source.provider,
                            header=dict(header))

    read = FileConfigSource.load_config
    FileConfigSource.load_config = load_config
    try:
        yield
    finally:
        FileConfigSource.load_config = read


@functools.cache
def parsed_config_file(path: str, mtime_ns: int, size: int) -> tuple[dict, object]:
    """A config file's header and YAML content as Hydra and OmegaConf read them, keyed by mtime and
    size too, so a file rewritten in the process is parsed again."""
    from hydra.plugins.config_source import ConfigSource
    from omegaconf._utils import get_yaml_loader

    text = Path(path).read_text(encoding="utf-8")
    return ConfigSource._get_header_dict(text[:512]), yaml.load(text, Loader=get_yaml_loader())


def plan(arguments: list[str], params: dict, compose: Callable[[list[str]], DictConfig]) -> list[PlannedJob]:
    """The sweep's jobs in launch order, then the dense baselines they would evaluate first
    (`tracking.ensure_dense`) that are not grid jobs themselves."""
    from prunebench.tasks.lm_eval_task import PLANNED
    from prunebench.validate import validate

    PLANNED.clear()  # this plan's lm-eval tasks, built once for its jobs; another plan reads the files again
    jobs, by_key, dense, scored, finished = [], {}, {}, set(), {}
    for overrides in sweep_jobs(params, arguments):
        deferred = []  # checks needing a hub file not cached here: a plan asks no network (validate)
        try:
            cfg = compose(overrides)
            inputs = job_inputs(cfg, validate(cfg, deferred))
            key = run_key(cfg, inputs)
        except Exception as err:  # any reason a job cannot run is the plan's to show
            message = " ".join(str(err).split())
            jobs.append(PlannedJob(overrides, "invalid", note=f"{type(err).__name__}: {message[:400]}"))
            continue
        where = (store.tracking_uri(cfg.tracking.uri), cfg.tracking.experiment)
        if where not in finished:
            finished[where] = finished_keys(*where)
        if key in by_key:
            jobs.append(PlannedJob(overrides, "repeat", note=f"same run key as #{by_key[key]}"))
            continue
        by_key[key] = len(jobs)
        jobs.append(PlannedJob(overrides, "done" if key in finished[where] else "left",
                               f"{size_class(cfg.model)}/{work_class(cfg, scored)}", note="; ".join(deferred)))
        if not is_dense(cfg) and cfg.tracking.ensure_dense:
            baseline = dense_config(cfg)
            dense.setdefault(run_key(baseline, inputs), (baseline, where, []))[2].append(len(jobs) - 1)
    for key, (cfg, where, serves) in dense.items():
        if key not in by_key:
            jobs.append(PlannedJob([DENSE, f"model={cfg.model.name}", f"task={cfg.task.name}"],
                                   "done" if key in finished[where] else "left",
                                   f"{size_class(cfg.model)}/{work_class(cfg, scored)}", serves=serves))
    return jobs


def format_plan(jobs: list[PlannedJob], title: str = "") -> str:
    """One line per job (the overrides every job shares are printed once), then the totals."""
    grid = [j.overrides for j in jobs if j.overrides[:1] != [DENSE]]
    shared = [o for o in grid[0] if all(o in g for g in grid)] if grid else []
    width = max([len(j.cost) for j in jobs] + [4])
    lines = [f"plan{': ' + title if title else ''}", f"every job: {' '.join(shared) or '(no shared overrides)'}",
             f"{'#':>4}  {'status':<7}  {'cost':<{width}}  overrides"]
    for i, job in enumerate(jobs):
        shown = " ".join(o for o in job.overrides if o not in shared)
        note = job.note or (f"baseline of {span(job.serves)}" if job.serves else "")
        lines.append(f"{i:>4}  {job.status:<7}  {job.cost:<{width}}  {shown}" + (f"  [{note}]" if note else ""))
    status = Counter(j.status for j in jobs)
    dense = sum(j.overrides[:1] == [DENSE] for j in jobs)
    left = Counter(j.cost for j in jobs if j.status == "left")
    lines.append(f"{len(jobs) - dense} grid jobs + {dense} dense baseline(s): {status['done']} done, "
                 f"{status['left']} left, {status['invalid']} invalid, {status['repeat']} repeated")
    if left:
        lines.append("left by cost: " + ", ".join(f"{cost} x{n}" for cost, n in sorted(left.items())))
    return "\n".join(lines)


def span(indices: list[int]) -> str:
    return f"#{indices[0]}" if len(indices) == 1 else f"{len(indices)} jobs #{indices[0]}-#{indices[-1]}"


def main(argv: list[str] | None = None) -> int:
    """prunebench-plan [OVERRIDES]: the same overrides as `prunebench -m`, e.g. experiment=mop_llama2."""
    from hydra import compose, initialize_config_dir

    from prunebench.paths import CONF_DIR

    arguments = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(arguments):
        print(main.__doc__ + "\n\nGroups (group=option)\n" + help_listing(arguments))
        return 0
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        base = compose("config", overrides=fixed_overrides(arguments), return_hydra_config=True)
        params = sweeper_params(base)
        jobs = plan(arguments, params, job_composer("config"))
    print(format_plan(jobs, " ".join(arguments)))
    return 1 if any(j.status == "invalid" for j in jobs) else 0


def help_listing(arguments: list[str]) -> str:
    """The groups' options, those on a `hydra.searchpath=[...]` among `arguments` too."""
    from hydra import initialize_config_dir

    from prunebench.groups import listing
    from prunebench.paths import CONF_DIR

    searchpath = [o.value() for o in OverridesParser.create().parse_overrides(
        [a for a in arguments if a.startswith("hydra.searchpath=")])]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        return listing(tuple(searchpath[-1]) if searchpath else ())


def sweep_plan(config) -> int:
    """A plan=true multirun (the sweep callback calls this before anything launches): prints the
    grid; exit status 1 when any job is invalid."""
    arguments = list(config.hydra.overrides.task)
    params = sweeper_params(config)
    jobs = plan(arguments, params, job_composer(config.hydra.job.config_name))
    print(format_plan(jobs, " ".join(arguments)))
    return 1 if any(j.status == "invalid" for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
