"""The model adapter: what the engines (evaluation/) and pruners need of a model, so that they never
reach into a model family's classes. A family whose forward or preprocessing differs subclasses
LoadedModel and overrides what differs; the engines stay as they are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from prunebench.models.counted import CountedTokens
from prunebench.models.introspection import model_outputs
from prunebench.models.offload import onloaded
from prunebench.models.pretrained import config_positions


@dataclass
class LoadedModel:
    """`tokenizer` turns text into ids; `processor` (a vision-language model's, else None) also
    turns images into model inputs. `max_length`: the positions one sequence may use. `counted`:
    the real tokens of the next forward, set by the engines for routing telemetry. `reload`: reads
    the weights afresh from the files they came from, as the loader did (a loader that read them from
    files sets it), so models/cache.py need not hold a pristine copy in memory."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    family: str
    max_length: int
    processor: object = None
    reload: Callable[[], torch.nn.Module] | None = field(default=None, repr=False, compare=False)
    _head_checked: bool = field(default=False, init=False, repr=False)
    counted: CountedTokens = field(default_factory=CountedTokens, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def chat_template(self) -> str | None:
        """The template an instruction-tuned model's prompts are rendered with (None: a base model)."""
        return getattr(self.processor or self.tokenizer, "chat_template", None)

    def decoder(self) -> torch.nn.Module:
        """The body whose hidden states the LM head turns into logits (run without the head, which
        with a large vocabulary costs more than the body, wherever only some positions are scored)."""
        return self.model.get_decoder()

    @property
    def vocab_size(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    def lm_logits(self, hidden: torch.Tensor, vocab: slice | None = None) -> torch.Tensor:
        """The LM head over `hidden`, then what the families known here do after it in their own
        forward: Cohere's `logit_scale`, Granite's `logits_scaling`, Gemma's final soft-capping.
        `check_lm_head` refuses a model whose forward does anything else. `vocab`: only those
        tokens' logits, computed from those rows of the head alone when it is a plain linear layer."""
        head = self.model.get_output_embeddings()
        if vocab is None:
            logits = head(hidden)
        elif type(head) is torch.nn.Linear:
            with onloaded(head, edits=False):  # a head accelerate offloads, on its device for these rows
                bias = head.bias[vocab] if head.bias is not None else None
                logits = torch.nn.functional.linear(hidden.to(head.weight.device), head.weight[vocab], bias)
        else:
            logits = head(hidden)[..., vocab]
        config = getattr(self.model.config, "text_config", self.model.config)
        scale = getattr(config, "logit_scale", None)
        if scale:
            logits = logits * scale
        scaling = getattr(config, "logits_scaling", None)
        if scaling:
            logits = logits / scaling
        cap = getattr(config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def check_lm_head(self) -> None:
        """The scorers apply the head only at scored positions (`lm_logits` over the decoder's
        hidden states); on a probe that must give the model's own logits. 1% of the largest logit:
        the two paths run the same kernels, while an unknown scaling or capping moves logits more.
        Once per loaded model, not per task: each probe reads the whole LM head twice, which a large
        vocabulary makes costly."""
        if self._head_checked:
            return
        probe = (torch.arange(1, 9, device=self.device) % self.vocab_size)[None]
        with self.counted.positions(torch.zeros_like(probe)):  # no task's tokens
            want = self.model(input_ids=probe).logits[0].float()
            got = self.lm_logits(self.decoder()(input_ids=probe).last_hidden_state)[0].float()
        gap = float((got - want).abs().max())
        if gap > 1e-2 * max(float(want.abs().max()), 1e-6):
            raise ValueError(f"model {self.name!r} ({type(self.model).__name__}) turns hidden states into logits "
                             f"in a way the scorer does not know (its own logits differ from the LM head's by "
                             f"{gap:.3g} on a probe); scoring it would be wrong, so it is refused")
        self._head_checked = True

    def generate(self, **kwargs) -> torch.Tensor:
        return self.model.generate(**kwargs)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A classifier's logits for a batch of its inputs (text encodings, or `pixel_values`)."""
        out = model_outputs(self.model, batch)
        return out if isinstance(out, torch.Tensor) else out.logits


def placed(model: torch.nn.Module, device: str, device_map: str | dict | None) -> torch.nn.Module:
    """In eval mode, on `device` unless accelerate already placed it by `device_map`."""
    return (model if device_map else model.to(device)).eval()


# model.dtype's names (besides `auto`, which api/model_keys.run_dtype resolves to one of them)
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def model_max_length(config, tokenizer, override: int | None = None) -> int:
    """The harness's rule (lm-eval HFLM.max_length): explicit value, else the config's position
    limit, else the tokenizer's, else 2048."""
    if override:
        return int(override)
    positions = config_positions(config)
    if positions:
        return positions
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < 1e29:
        return int(tok_max)
    return 2048
