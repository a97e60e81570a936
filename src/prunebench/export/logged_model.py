"""Where a pruned model goes (export=<format>, docs/export.md): the folder the format's writer fills
(export/writer.py) becomes an MLflow logged model of its run, which the Model Registry registers
from the UI, or goes to `<export.dir>/<run id>` for a model too large to copy into the artifact
store. The run's tag `prunebench.export` says which: `mlflow-model:models:/<id>` or `dir:<path>`.

The logged model is that plain folder, not an MLflow flavour: the `mlflow.transformers` flavour's
local-checkpoint path fails under transformers 5 with MLflow 3.17 (it reads the pipeline registry's
old layout), and export=hf's folder loads with `from_pretrained` after
`mlflow.artifacts.download_artifacts("models:/<id>")`."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import mlflow
from mlflow.entities import LoggedModelOutput, LoggedModelStatus
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from prunebench.export.writer import Writer
from prunebench.models.loaded import LoadedModel
from prunebench.tracking.run_key import is_dense, recovering
from prunebench.tracking.store import KEY_TAG

log = logging.getLogger(__name__)
EXPORT_TAG = "prunebench.export"
FORMAT_TAG = "prunebench.export_format"  # a logged model's: the format that wrote it (the run's is its param export.name)


def record(cfg: DictConfig, stats: dict[str, float | str], run) -> dict:
    """pruning.json's account of the run: which run, which pruner, what it achieved (its sparsity,
    parameter and FLOP measures, MoP's sequence)."""
    achieved = {key: value for key, value in stats.items()
                if not key.startswith(("time/", "prunebench."))}
    return {"run_id": run.info.run_id, "run_key": run.data.tags.get(KEY_TAG),
            "model": OmegaConf.to_container(cfg.model, resolve=True),
            "pruner": {"name": "none"} if is_dense(cfg) else OmegaConf.to_container(cfg.pruner, resolve=True),
            "sparsity": 0.0 if is_dense(cfg) else float(cfg.sparsity), "achieved": achieved}


def log_folder(folder: Path, run, tags: dict[str, str], model_type: str) -> str:
    """The folder as a logged model whose source is `run`, listed among the run's outputs. Returns its URI."""
    client = MlflowClient()
    # MLflow refuses / : . % and quotes in a logged model's name (a run name holds | and the ratio's dot)
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", run.info.run_name or "pruned").strip("-")
    model = mlflow.initialize_logged_model(name=name, source_run_id=run.info.run_id, tags=tags,
                                           model_type=model_type, experiment_id=run.info.experiment_id)
    try:
        client.log_model_artifacts(model.model_id, str(folder))
    except BaseException:
        mlflow.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    mlflow.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, step=0)])
    return f"models:/{model.model_id}"


def export_folder(parent: str, run_id: str) -> Path:
    """`<export.dir>/<run id>`, checked before any work: a folder that exists must be empty or an earlier
    export of this run (its pruning.json names the run), which the new export replaces whole."""
    from prunebench.models.narrow import PRUNING_FILE

    folder = Path(parent).expanduser().resolve() / run_id
    if folder.is_dir() and any(folder.iterdir()):
        try:
            earlier = json.loads((folder / PRUNING_FILE).read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            earlier = None
        if earlier != run_id:
            raise ValueError(f"{folder} is not empty and is no earlier export of run {run_id} (no {PRUNING_FILE} "
                             f"naming it); nothing written: empty it or choose another --dir")
    elif folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; nothing written: choose another --dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


def honour_umask(folder: Path) -> None:
    """The modes a plain mkdir and open would have given: the export is written in a temporary folder
    (mkdtemp: mode 700, its files then copied as they are), which on a shared cluster no teammate
    could read."""
    mask = os.umask(0)
    os.umask(mask)
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def export_model(cfg: DictConfig, writer: Writer, loaded: LoadedModel, stats: dict[str, float | str], before: dict,
                 run_id: str, adapter: Path | None = None) -> str:
    """Writes the pruned `loaded` of run `run_id` (configured by `cfg`) with `writer` where its `dir`
    says, tags the run with where, and returns that tag's value. `before`: its widths before pruning
    (export/folder.widths); `adapter`: a recovery's LoRA adapter folder (peft's), copied into the
    export's `adapter/`."""
    from prunebench.recovery import ADAPTER

    def write(target: Path) -> None:
        writer.write(loaded, target, account, before)
        if adapter is not None:
            shutil.copytree(adapter, target / ADAPTER)
        honour_umask(target)

    run = MlflowClient().get_run(run_id)
    account = record(cfg, stats, run)
    if writer.dir:
        folder = export_folder(writer.dir, run_id)
        # written whole beside it, then put in its place: an earlier export's files (a shard index of
        # another layout) never mix with this one's
        fresh = Path(tempfile.mkdtemp(prefix=f".{run_id}.partial-", dir=folder.parent))
        try:
            write(fresh)
            if folder.exists():
                shutil.rmtree(folder)
            fresh.rename(folder)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
        where = f"dir:{folder}"
    else:
        with tempfile.TemporaryDirectory(prefix="prunebench-export-") as tmp:
            write(Path(tmp))
            tags = {KEY_TAG: account["run_key"] or "", "prunebench.pruner": account["pruner"]["name"],
                    FORMAT_TAG: writer.name}
            where = "mlflow-model:" + log_folder(Path(tmp), run, tags, writer.model_type)
    MlflowClient().set_tag(run_id, EXPORT_TAG, where)
    log.info("exported (export=%s) the %s model of run %s: %s%s", writer.name,
             "recovered" if recovering(cfg) and not is_dense(cfg) else "pruned", run_id, where,
             f" (with the LoRA adapter as trained in {ADAPTER}/)" if adapter is not None else "")
    return where
