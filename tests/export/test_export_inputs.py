"""prunebench-export refusing what it cannot export before it rebuilds anything, and exports
readable by the others of a shared machine (the umask's modes)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import mlflow
from omegaconf import OmegaConf

from conftest import compose_cfg
from prunebench.export.cli import main as export_main
from prunebench.export.logged_model import honour_umask


def test_export_to_a_missing_store_creates_none(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "mlflow.db"
    assert export_main(["0123abcd", "--tracking-uri", f"sqlite:///{missing}"]) == 3
    assert f"no MLflow store at sqlite:///{missing}" in capsys.readouterr().err
    assert not missing.parent.exists()


def test_export_of_a_run_whose_checkpoint_folder_is_gone_names_it(store, tmp_path, capsys):
    gone = tmp_path / "gone" / "llama"
    cfg = compose_cfg(["model=hf_causal", f"model.path={gone}", "pruner=magnitude", "sparsity=0.5"])
    mlflow.set_tracking_uri(store)
    mlflow.set_experiment("prunebench")
    with mlflow.start_run() as run:
        mlflow.log_text(OmegaConf.to_yaml(cfg), "config.yaml")
    assert export_main([run.info.run_id, "--tracking-uri", store]) == 2
    err = capsys.readouterr().err
    assert f"run {run.info.run_id}: model.path='{gone}': no such folder" in err and "Traceback" not in err, err


def test_an_export_folder_has_the_modes_the_umask_gives(tmp_path):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))  # mode 700, as the export's folder is made
    (folder / "adapter").mkdir(mode=0o700)
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    os.chmod(folder / "model.safetensors", 0o600)
    old = os.umask(0o022)
    try:
        honour_umask(folder)
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}
    assert set(modes.values()) <= {0o755, 0o644} and modes[folder.name] == 0o755, modes
