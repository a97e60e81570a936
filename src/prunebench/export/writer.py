"""An export format: the writer `export=<name>` chooses. `conf/export/<name>.yaml` names its class
with `_target_` (as a pruner's config does), so a lab adds a format with one class and one YAML on
its search path. The options check themselves when the writer is built (validation builds it before
any model loads); `check` then asks what the model and the pruner allow; `write` fills a folder that
`logged_model.export_model` puts in MLflow, as a logged model of the run, or in `<dir>/<run id>`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from prunebench.api.errors import ConfigError
from prunebench.cache import check_writable

# the command-line spellings from before `export` was a group: Hydra's own refusal of them does not
# say what replaced them (a bool is no group choice; `export_dir` "is not in struct mode")
MOVED = {"export": "export=hf to write the model (export=none, the default, writes none)", "export_dir": "export=hf export.dir=DIR",
         "export_padded": "export=hf export.padded=true"}
SWITCH = {"true", "false", "yes", "no", "on", "off", "1", "0"}


@dataclass(frozen=True)
class Writer:
    """What every export format has: its `name` (the option's) and `dir`, a folder for models too
    large to copy into the artifact store (the model goes to `<dir>/<run id>`; null: an MLflow logged
    model). A subclass adds its own options as fields, checked in `__post_init__`, and implements `write`."""

    name: str
    dir: str | None = None
    # the model families it can write (a model's `family`)
    families: ClassVar[frozenset[str]] = frozenset({"causal_lm", "moe", "vlm", "encoder"})
    # the logged model's `model_type` in MLflow
    model_type: ClassVar[str] = ""
    # False: the option that writes nothing (export=none)
    writes: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.dir is not None and not isinstance(self.dir, str):
            raise ConfigError(f"export.dir={self.dir!r}: give a folder path (the model goes to <export.dir>/<run id>) "
                              f"or null (an MLflow logged model of the run)")

    def check(self, cfg: DictConfig, pruner_cls) -> None:
        """What the model and the pruner allow, before any model loads: a family this format writes, a
        pruner that changes weights (`Pruner.exportable`), and a `dir` that can be written."""
        if cfg.model.family not in self.families:
            raise ConfigError(f"export={self.name}: model={cfg.model.name!r} is of family {cfg.model.family!r}, which "
                              f"this format does not write; it writes the families {sorted(self.families)}")
        if not pruner_cls.exportable:
            reason = pruner_cls.export_refusal or ("changes how the model runs, not its weights, so there is no "
                                                   "pruned checkpoint to write")
            raise ConfigError(f"export={self.name}: pruner={cfg.pruner.name!r} {reason}; set export=none")
        self.check_dir()

    def check_dir(self) -> None:
        """`dir` must be a folder this process can make and write (`check_writable` tries it), or the
        job would evaluate the model, and its dense baseline, before failing at the write."""
        if self.dir is None:
            return
        try:
            check_writable(Path(self.dir).expanduser().resolve())
        except OSError as err:
            raise ConfigError(f"export.dir={self.dir!r}: {err}; give a folder this process can write (the model goes "
                              f"to <export.dir>/<run id>)") from None

    def before_pruning(self, model) -> dict | None:
        """What `write` needs to know of the model as it was before pruning, taken then (its `before`)."""
        return None

    def write(self, loaded, folder: Path, record: dict, before: dict | None) -> None:
        """Writes the pruned `loaded` (a LoadedModel) into the empty `folder`, with a `pruning.json`
        holding `record` (the run's id and key, model, pruner and what pruning achieved), whose
        `run_id` lets a later export of the same run replace the folder. `before`: what
        `before_pruning` returned."""
        raise NotImplementedError(f"{type(self).__name__} (export={self.name}) writes nothing")


@dataclass(frozen=True)
class NoExport(Writer):
    """export=none, the default: the job writes no model."""

    name: str = "none"
    writes: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.dir is not None:
            raise ConfigError(f"export.dir={self.dir!r} is set but export=none; choose a format to write the model "
                              f"there, such as export=hf")

    def check(self, cfg: DictConfig, pruner_cls) -> None:
        """Nothing is written, so anything goes."""


def export_writer(cfg: DictConfig) -> Writer:
    """The writer `cfg.export` configures, built: its options' own refusal as one line."""
    try:
        writer = instantiate(cfg.export, _convert_="all")
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"export={cfg.export.get('name')!r} is misconfigured: {cause}") from err
    if not isinstance(writer, Writer):
        raise ConfigError(f"export._target_={cfg.export.get('_target_')!r} is no export format (a subclass of "
                          f"prunebench.export.writer.Writer)")
    return writer


def moved(arguments: list[str]) -> str | None:
    """The refusal of a command-line override spelled as before `export` was a group (`export=true`,
    `export_dir=X`, `export_padded=true`), naming its new spelling; None for anything else."""
    for argument in arguments:
        key, sep, value = argument.partition("=")
        key = key.lstrip("+~")
        choices = {choice.strip(" '\"").lower() for choice in value.split(",")}
        if sep and key in MOVED and (key != "export" or choices & SWITCH):
            return f"{argument}: export is a config group now; write {MOVED[key]} (docs/export.md)"
    return None
