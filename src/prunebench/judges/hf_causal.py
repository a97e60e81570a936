"""A local Hugging Face causal LM as the judge (no server, no key): its chat template when the
tokenizer has one, greedy decoding, so the same request always gets the same reply."""

from __future__ import annotations

import functools

from prunebench.judges.base import Judge


@functools.lru_cache(maxsize=1)
def _load(path: str, dtype: str, device: str):
    """Once per process: every job of a sweep grades with the same weights."""
    from prunebench.models.hf_causal import load_causal_lm

    return load_causal_lm(path=path, name=path, dtype=dtype, device=device)


class HFCausalJudge(Judge):
    """`path`: a hub id or a local folder; loaded on the first request, not at validation. Sampling
    settings other than the token budget are ignored (greedy); the cache key still holds them."""

    def __init__(self, path: str, dtype: str = "float32", device: str = "cpu", name: str | None = None,
                 repeats: int = 1, max_failure_rate: float = 0.05):
        super().__init__(path, name, repeats, max_failure_rate)
        self.path, self.dtype, self.device = path, dtype, device

    def complete(self, messages: list[dict], temperature: float, max_tokens: int) -> str:
        import torch

        loaded = _load(self.path, self.dtype, self.device)
        tokenizer, model = loaded.tokenizer, loaded.model
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]
        else:  # a base model: the turns' text, in order
            ids = tokenizer("\n\n".join(m["content"] for m in messages), return_tensors="pt")["input_ids"]
        ids = ids.to(model.device)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, pad_token_id=pad)
        return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
