"""The model adapter: what the engines (evaluation/) and pruners need of a model, so that they never
reach into a model family's classes. A family whose forward or preprocessing differs subclasses
LoadedModel and overrides what differs; the engines stay as they are."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prunebench.models.introspection import model_outputs


@dataclass
class LoadedModel:
    """`tokenizer` turns text into ids; `processor` (a vision-language model's, else None) also
    turns images into model inputs. `max_length`: the positions one sequence may use."""

    model: torch.nn.Module
    tokenizer: object
    name: str
    family: str
    max_length: int
    processor: object = None

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

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over `hidden`, with the final logit soft-capping of the models that have it (Gemma 2)."""
        logits = self.model.get_output_embeddings()(hidden)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def generate(self, **kwargs) -> torch.Tensor:
        return self.model.generate(**kwargs)

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A classifier's logits for a batch of its inputs (text encodings, or `pixel_values`)."""
        out = model_outputs(self.model, batch)
        return out if isinstance(out, torch.Tensor) else out.logits


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    valid = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in valid:
        raise ValueError(f"model.dtype={dtype!r} is not supported; use one of {sorted(valid)}")
    return valid[dtype]


def model_max_length(config, tokenizer, override: int | None = None) -> int:
    """The harness's rule (lm-eval HFLM.max_length): explicit value, else the config's position
    limit, else the tokenizer's, else 2048."""
    if override:
        return int(override)
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, attr, None)
        if value:
            return int(value)
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < 1e29:
        return int(tok_max)
    return 2048
