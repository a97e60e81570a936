"""Greedy generation for `generate_until` requests, many prompts at a time.

Prompts are left-padded into one batch and decoded by transformers' `generate` (KV cache, greedy;
rows finish independently, a finished row only receives padding). Stop strings are found on the
device: transformers' StopStringCriteria matches them against the last few token ids through
per-token tables built once, so no step decodes text. The text returned is the decoded generation
cut before the first occurrence of each stop string (lm-eval's rule), so it does not
depend on the step at which a row stopped.

A row's real tokens, for routing telemetry (`LoadedModel.counted`), are its prompt and the tokens it
generated before its last one: after that transformers feeds it padding under an attention mask of
ones until the whole batch stops."""

from __future__ import annotations

import torch
from transformers import StoppingCriteria, StoppingCriteriaList, StopStringCriteria

from prunebench.evaluation.batching import left_pad
from prunebench.models.loaded import LoadedModel


class GeneratedStopStrings(StoppingCriteria):
    """StopStringCriteria over the generated columns only: over the whole sequence a stop string
    could be completed across the prompt's end (a prompt ending in "\\n", a generated "\\n", the
    stop string "\\n\\n"), which lm-eval, reading only generated text, never stops on."""

    def __init__(self, tokenizer, stop_strings: list[str]):
        # building the tables takes seconds for a 262k vocabulary: once per evaluation
        self.inner = StopStringCriteria(tokenizer, stop_strings)
        self.prompt_width = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.last = self.inner(input_ids[:, self.prompt_width:], scores)
        return self.last


class FinishedRows(StoppingCriteria):
    """Stops nothing: after each step tells `counted` which rows transformers has just finished, by
    its own rules (the stop strings above, the generation config's EOS ids); the length limit ends
    every row at once, with no forward after it."""

    def __init__(self, counted, stops: GeneratedStopStrings | None, eos_ids):
        self.counted, self.stops = counted, stops
        self.eos = torch.tensor([] if eos_ids is None else [eos_ids] if isinstance(eos_ids, int) else list(eos_ids),
                                dtype=torch.long)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        done = torch.isin(input_ids[:, -1], self.eos.to(input_ids.device))
        if self.stops is not None:
            done = done | self.stops.last.to(done.device)
        self.counted.finished(done)
        return torch.zeros_like(done)


def cut_at_stops(text: str, stops: list[str]) -> str:
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    return text


class Generator:
    """Greedy generation of up to `max_new_tokens` per prompt until any of `until`; like lm-eval,
    the tokenizer's EOS text joins the stop strings."""

    def __init__(self, model: LoadedModel, until: list[str], max_new_tokens: int):
        tokenizer = model.tokenizer
        self.model, self.tokenizer, self.max_new_tokens = model, tokenizer, max_new_tokens
        eos = tokenizer.eos_token
        self.until = [*until, eos] if eos and eos not in until else list(until)
        stops = [s for s in self.until if s]
        self.stops = GeneratedStopStrings(tokenizer, stops) if stops else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def __call__(self, prompts: list[list[int]]) -> list[str]:
        ids, mask = left_pad(prompts, self.pad_id)
        return self.generate({"input_ids": ids, "attention_mask": mask})

    @torch.inference_mode()
    def generate(self, inputs: dict[str, torch.Tensor]) -> list[str]:
        """From left-padded model inputs (a processor's: `pixel_values` too)."""
        device = self.model.device
        width = inputs["input_ids"].shape[1]
        criteria = StoppingCriteriaList()
        if self.stops is not None:
            self.stops.prompt_width = width
            criteria.append(self.stops)
        counted = self.model.counted
        criteria.append(FinishedRows(counted, self.stops, self.model.model.generation_config.eos_token_id))
        with counted.generating():
            out = self.model.generate(**{key: value.to(device) for key, value in inputs.items()},
                                      max_new_tokens=self.max_new_tokens, do_sample=False,
                                      stopping_criteria=criteria, pad_token_id=self.pad_id)
        texts = self.tokenizer.batch_decode(out[:, width:].tolist(), skip_special_tokens=True)
        return [cut_at_stops(text, self.until) for text in texts]
