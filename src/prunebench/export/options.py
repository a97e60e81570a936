"""The export options of a job (`export`, `export_dir`, `export_padded`, docs/export.md), checked
when built: their types and combinations, then what the model and the pruner allow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from prunebench.api.errors import ConfigError
from prunebench.cache import check_writable


@dataclass(frozen=True)
class ExportOptions:
    export: bool = False
    export_dir: str | None = None
    export_padded: bool = False

    @classmethod
    def of(cls, cfg: DictConfig) -> ExportOptions:
        return cls(cfg.get("export", False), cfg.get("export_dir"), cfg.get("export_padded", False))

    def __post_init__(self) -> None:
        if not isinstance(self.export, bool):
            raise ConfigError(f"export={self.export!r}: use true (write the pruned model, docs/export.md) or false")
        if self.export_dir is not None and not self.export:
            raise ConfigError(f"export_dir={self.export_dir!r} is set but export=false; add export=true to write "
                              f"the model there")
        if not isinstance(self.export_padded, bool):
            raise ConfigError(f"export_padded={self.export_padded!r}: use false (layers of different widths stored at "
                              f"their own, for prunebench's loader) or true (padded to one stock shape for plain "
                              f"from_pretrained)")
        if self.export_padded and not self.export:
            raise ConfigError("export_padded=true is set but export=false; add export=true to write the model")

    def check(self, cfg: DictConfig, pruner_cls) -> None:
        """What the model and the pruner allow, and a folder that can be written: a Hugging Face
        folder needs a model that has one and a pruner that changes weights."""
        if not self.export:
            return
        if cfg.model.family == "vision":
            raise ConfigError(f"export=true writes a Hugging Face folder, but model={cfg.model.name!r} is a timm "
                              f"model (family vision), which has none; export works for the causal_lm, moe, vlm and "
                              f"encoder families")
        if not pruner_cls.exportable:
            reason = pruner_cls.export_refusal or ("changes how the model runs, not its weights, so there is no "
                                                   "pruned checkpoint to write")
            raise ConfigError(f"export=true: pruner={cfg.pruner.name!r} {reason}; set export=false")
        self.check_dir()

    def check_dir(self) -> None:
        """export_dir must be a folder this process can make and write (`check_writable` tries it), or
        the job would evaluate the model, and its dense baseline, before failing at the write."""
        if not self.export or self.export_dir is None:
            return
        try:
            check_writable(Path(str(self.export_dir)).expanduser().resolve())
        except OSError as err:
            raise ConfigError(f"export_dir={self.export_dir!r}: {err}; give a folder this process can write (the "
                              f"model goes to <export_dir>/<run id>)") from None
