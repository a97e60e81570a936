"""A causal language model's tokenizer and architecture without its weights: what a plan counts a
job's work and FLOPs by (plan.py). Read from local files only, never the hub (a plan asks no
network): a checkpoint folder, a hub id's files in the local Hugging Face cache, a preset loader's
`stated_folder()` (a GGUF preset's converted folder, where a job made it) or `stated_model(model_cfg)`
(a tiny test model's tokenizer, trained in process, and config). Whatever else is `Unstated`, its
reason in a few words."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import get_method
from omegaconf import DictConfig

from prunebench.models.loaded import LoadedModel, model_max_length

# the families whose work is counted before loading: a text tokenizer is all their data modules read
COUNTED_FAMILIES = ("causal_lm", "moe")


class Unstated(Exception):
    """Not known without loading the model or asking the network: the reason, short."""


@dataclass
class StatedModel:
    name: str
    family: str
    tokenizer: object
    config: object  # a transformers config
    max_length: int

    def forward_parameters(self) -> int:
        """The parameters every position's forward multiplies by, counted on the meta device (no
        memory, no weights): all but the input embeddings (a lookup, no matmul) and the LM head (the
        scorers apply it only at scored positions), so 2 x this is a floor on a position's FLOPs. A
        mixture of experts runs only some experts per position: not counted."""
        if self.family != "causal_lm":
            raise Unstated(f"family {self.family}: each position runs only part of its parameters")
        from prunebench.models.offload import meta_model

        model = meta_model(self.config)
        skipped = {id(p) for module in (model.get_input_embeddings(), model.get_output_embeddings())
                   if module is not None for p in module.parameters()}
        return sum(p.numel() for p in model.parameters() if id(p) not in skipped)

    def unloaded(self, device: str) -> Unloaded:
        """The adapter an engine builds its data module on, without weights."""
        return Unloaded(model=None, tokenizer=self.tokenizer, name=self.name, family=self.family,
                        max_length=self.max_length, placement=torch.device(device))


@dataclass
class Unloaded(LoadedModel):
    """A LoadedModel without a model: what an engine's data module reads (tokenizer, max_length, the
    device its batch budget depends on), so a plan counts a task's positions with the job's own
    engine. Its LM head check waits for the job, which has the weights."""

    placement: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def device(self) -> torch.device:
        return self.placement

    def check_lm_head(self) -> None:
        pass


def stated_model(model_cfg: DictConfig) -> StatedModel:
    """Unstated where the files are not at hand here or the family's work is not counted."""
    family = model_cfg.get("family")
    if family not in COUNTED_FAMILIES:
        raise Unstated(f"family {family}: its work is not counted before loading")
    hook = get_method(model_cfg._target_) if model_cfg.get("_target_") else None
    if "path" in model_cfg and "revision" in model_cfg:
        source, revision = str(model_cfg.path), model_cfg.revision
    elif callable(getattr(hook, "stated_folder", None)):
        source, revision = str(hook.stated_folder()), None
        if not (Path(source) / "config.json").is_file():
            raise Unstated(f"model={model_cfg.name} is not converted yet (its first job converts it)")
    elif callable(getattr(hook, "stated_model", None)):
        tokenizer, config = hook.stated_model(model_cfg)
        return StatedModel(str(model_cfg.name), family, tokenizer, config,
                           model_max_length(config, tokenizer, model_cfg.get("max_length")))
    else:
        raise Unstated(f"model={model_cfg.name}'s loader states no tokenizer before loading")
    from transformers import AutoConfig, AutoTokenizer

    remote = bool(model_cfg.get("trust_remote_code"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=remote,
                                                  local_files_only=True)
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=remote, local_files_only=True)
    except (OSError, ValueError):
        where = "in that folder" if Path(source).expanduser().is_dir() else "in the local Hugging Face cache"
        raise Unstated(f"{source}: its tokenizer or config is not {where}") from None
    config = getattr(config, "text_config", None) or config
    return StatedModel(str(model_cfg.name), family, tokenizer, config,
                       model_max_length(config, tokenizer, model_cfg.get("max_length")))
