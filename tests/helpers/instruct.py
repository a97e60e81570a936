"""A tiny instruct model: tiny-llama with a chat template, in memory or saved as a checkpoint folder
(`model=hf_causal model.path=FOLDER`), where a test needs a template and no real model."""

from __future__ import annotations

from pathlib import Path

# a Zephyr-like template that writes the BOS itself: the tokenizer, which prepends one by default, must not add a second
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def templated(loaded):
    """`loaded` with a copy of its tokenizer carrying TEMPLATE (the cached model's own tokenizer, which
    other tests share, keeps none)."""
    import copy
    import dataclasses

    tokenizer = copy.deepcopy(loaded.tokenizer)
    tokenizer.chat_template = TEMPLATE
    return dataclasses.replace(loaded, tokenizer=tokenizer)


def save_instruct_model(folder: Path) -> Path:
    """tiny-llama and its templated tokenizer written as a Hugging Face checkpoint folder."""
    from conftest import compose_cfg
    from prunebench.models.cache import get_model

    loaded = templated(get_model(compose_cfg(["model=tiny-llama", "model.config.max_position_embeddings=2048"]).model))
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder
