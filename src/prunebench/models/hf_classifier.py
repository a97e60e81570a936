"""Fine-tuned Hugging Face sequence classifiers (GLUE checkpoints): hub id or local folder.

The label names travel with the model (`config.id2label`) so a task can check that the checkpoint's
output order is its own before a single prediction is scored."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel, model_max_length, placed, resolve_dtype


def _loaded(model, tokenizer, name: str, family: str, max_length: int | None, reload=None) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, family=family,
                       max_length=model_max_length(model.config, tokenizer, max_length), reload=reload)


def load_sequence_classifier(*, path: str, name: str, family: str = "encoder", dtype: str = "float32",
                             device: str = "cpu", max_length: int | None = None,
                             revision: str | None = None, trust_remote_code: bool = False,
                             device_map: str | dict | None = None) -> LoadedModel:
    """`trust_remote_code` runs the checkpoint's own Python: off unless the user sets it (a job tag says so).
    `device_map` (accelerate's) replaces `device`."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    def read():
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=resolve_dtype(dtype), revision=revision, trust_remote_code=trust_remote_code,
            device_map=device_map)
        return placed(model, device, device_map)

    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    return _loaded(read(), tokenizer, name, family, max_length, reload=read)


def load_tiny_classifier(*, name: str, config: dict, labels: list[str], family: str = "encoder", seed: int = 0,
                         device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    """A random classifier (for tests) with the in-process byte-level tokenizer of the tiny models;
    `labels` become its id2label, as a fine-tuned checkpoint's would be."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from prunebench.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    cfg = dict(config)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), vocab_size=len(tokenizer),
                                     pad_token_id=tokenizer.pad_token_id, num_labels=max(len(labels), 1),
                                     id2label=dict(enumerate(labels or ["score"])), **cfg)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(hf_config).to(device).eval()
    return _loaded(model, tokenizer, name, family, max_length)
