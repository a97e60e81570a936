"""Tiny random models for tests: built from a config dict, seeded, with a tokenizer trained in
process, so the whole pipeline runs offline in seconds."""

from __future__ import annotations

import torch

from prunebench.models.loaded import LoadedModel, model_max_length, resolve_dtype

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Question: What is the capital of France?\nAnswer: Paris",
    "How many legs do horses have? four two six three one none",
    "A man is sitting on a roof. He starts pulling up roofing on a roof.",
    "The sun is responsible for puppies learning new tricks, plants sprouting, blooming.",
    "0123456789 ,.;:!?'\"()[]{}<>-+=*/_",
]


def tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer that prepends BOS like Llama's, trained on a fixed corpus.

    No tokenizer can be downloaded here, and a byte-level one can encode any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def load_tiny(*, name: str, family: str = "causal_lm", config: dict, seed: int = 0,
              dtype: str = "float32", device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    cfg = dict(config)
    model_type = cfg.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=resolve_dtype(dtype)).to(device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, family=family,
                       max_length=model_max_length(hf_config, tokenizer, max_length))
