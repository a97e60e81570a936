"""Every `conf/pruner` option, on the tiny model of each family its class declares, pruned through the
job's own path (`pruning.prune`: load, score, apply) after the config validates: it removes something
(a routing pruner changes how experts are chosen instead), as timm's tests run every registered model."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_class
from omegaconf import OmegaConf

from conftest import compose_cfg
from helpers.images import image_folder
from prunebench.paths import CONF_DIR
from prunebench.pruners.routing import RoutingPruner
from prunebench.pruning import prune
from prunebench.validate import validate

TEXT = "The quick brown fox jumps over the lazy dog. Question: What is the capital of France? Answer: Paris. " * 40
# what each family is pruned as: its tiny model, a task it answers, and a calibration it reads
FAMILIES = {
    "causal_lm": ["model=tiny-llama", "model.config.num_hidden_layers=4", "calib=file", "calib.path={text}",
                  "calib.n_samples=2", "calib.seq_len=16"],
    "moe": ["model=tiny-mixtral", "calib=file", "calib.path={text}", "calib.n_samples=2", "calib.seq_len=16"],
    "encoder": ["model=tiny-bert-cls", "task=sst2", "data_dir={glue}", "calib=glue_train", "calib.n_samples=4"],
    "vision": ["model=tiny-vit", "task=imagenet1k", "task.tasks.imagenet1k.source.root={images}", "calib=labelled",
               "task@calib.task=imagenet1k", "calib.task.tasks.imagenet1k.source.root={train}", "calib.n_samples=4"],
    "vlm": ["model=tiny-llava", "model.text_config.num_hidden_layers=4", "task=easy_vqa", "calib=image_text",
            "calib.n_samples=2"],
}
UNCALIBRATED = ["calib=none"]


def options() -> list[tuple[str, str]]:
    """(option, family) pairs, at collection: every option composed in one config onto no primary
    config, each at a package of its own (`+pruner@options.NAME=NAME`), which names its class without
    the whole config's defaults tree."""
    names = [p.stem for p in sorted((Path(CONF_DIR) / "pruner").glob("*.yaml")) if p.stem != "none"]
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        composed = compose(None, overrides=[f"+pruner@options.{name}={name}" for name in names]).options
    return [(name, family) for name in names for family in sorted(get_class(composed[name]._target_).families)
            if family in FAMILIES]


@pytest.mark.parametrize(("name", "family"), options(), ids=lambda v: v)
def test_every_pruner_option_prunes_each_family_it_declares(name, family, tmp_path, glue_dir, one_thread):
    (tmp_path / "text.txt").write_text(TEXT)
    fill = {"text": tmp_path / "text.txt", "glue": glue_dir, "images": image_folder(tmp_path / "val", 1),
            "train": image_folder(tmp_path / "train", 1)}
    overrides = [o.format(**fill) for o in FAMILIES[family]]
    cfg = compose_cfg([*overrides, f"pruner={name}", "sparsity=0.25", "limit=2", "tracking.ensure_dense=false"])
    if not get_class(cfg.pruner._target_).needs_calibration:
        cfg = compose_cfg([*[o for o in overrides if not o.startswith(("calib", "task@calib"))],
                           *UNCALIBRATED, f"pruner={name}", "sparsity=0.25", "limit=2"])
    validate(cfg)
    _, pruner, stats, _ = prune(cfg, dense=False)
    if isinstance(pruner, RoutingPruner):  # it re-selects experts at run time; the weights stay
        assert stats["sparsity/actual"] == 0
    else:
        assert stats["sparsity/actual"] > 0, (name, family, OmegaConf.to_container(cfg.pruner))
