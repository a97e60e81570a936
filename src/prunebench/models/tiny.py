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


def tiny_config(config: dict, tokenizer):
    """The transformers config of `config` (its `model_type` and sizes) over `tokenizer`'s vocabulary."""
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type")
    return AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **cfg)


def load_tiny(*, name: str, family: str = "causal_lm", config: dict, seed: int = 0,
              dtype: str = "float32", device: str = "cpu", max_length: int | None = None) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    hf_config = tiny_config(config, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=resolve_dtype(dtype)).to(device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, family=family,
                       max_length=model_max_length(hf_config, tokenizer, max_length))


# what validation knows of a tiny model's chat templates before loading it: its tokenizer, trained in
# process, carries none (evaluation/chat.py refuses eval.chat_template for it)
load_tiny.stated_chat_templates = {}


def stated_tiny(model_cfg) -> tuple:
    """(tokenizer, config) as load_tiny makes them, without the weights (models/stated.py)."""
    from omegaconf import OmegaConf

    tokenizer = tiny_tokenizer()
    return tokenizer, tiny_config(OmegaConf.to_container(model_cfg.config, resolve=True), tokenizer)


load_tiny.stated_model = stated_tiny


# LLaVA-1.5's chat template (llava-hf/llava-1.5-7b-hf), images first then text, without the
# assistant-turn branch a tiny test model never needs: "USER: <image>\n{text} ASSISTANT:"
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")


def load_tiny_llava(*, name: str, family: str = "vlm", text_config: dict, vision_config: dict, seed: int = 0,
                    dtype: str = "float32", device: str = "cpu", max_length: int | None = None):
    """A random LlavaForConditionalGeneration: a tiny Llama, a tiny CLIP vision tower and a
    LlavaProcessor over the tiny tokenizer with `<image>` added.

    The processor counts an image's tokens as patches + num_additional_image_tokens, minus one
    under the "default" strategy (which drops CLS); the tower yields patches + 1 (CLS) features, so
    num_additional_image_tokens=1 is what makes the two agree."""
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    from prunebench.models.vlm import VisionLanguageModel

    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(**vision_config)
    side, patch = vision.image_size, vision.patch_size
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side}),
        tokenizer=tokenizer, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=LLAVA_CHAT_TEMPLATE, image_token="<image>")
    text = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, **text_config)
    config = LlavaConfig(text_config=text, vision_config=vision, vision_feature_select_strategy="default",
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         image_seq_length=(side // patch) ** 2)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).to(dtype=resolve_dtype(dtype), device=device).eval()
    return VisionLanguageModel(model=model, tokenizer=tokenizer, name=name, family=family,
                               max_length=model_max_length(text, tokenizer, max_length), processor=processor)
