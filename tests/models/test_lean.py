"""Loading with no more host memory than a job keeps (models/lean.py): a half-precision checkpoint
widened to fp32 a slice at a time gives the model `from_pretrained` gives, bit for bit, and a
tokenizer without its construction copies encodes and saves as before."""

from __future__ import annotations

import filecmp

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from prunebench.models import lean
from prunebench.models.hf_causal import load_causal_lm
from prunebench.models.tiny import tiny_tokenizer

# Gemma 3's text model: tied LM head, and buffers (`embed_scale`, rotary frequencies) that the model
# computes when built, which a load at another dtype would round
TINY_GEMMA = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                  tie_word_embeddings=True)


def save_checkpoint(folder, dtype, **shard):
    config = AutoConfig.for_model("gemma3_text", **TINY_GEMMA)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(dtype).save_pretrained(folder, **shard)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def assert_same_model(got, want):
    """Parameters and every buffer (the non-persistent ones too) equal in value and dtype."""
    for kind in ("named_parameters", "named_buffers"):
        ours, theirs = dict(getattr(got, kind)()), dict(getattr(want, kind)())
        assert ours.keys() == theirs.keys()
        for name, tensor in theirs.items():
            assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name
    assert got.config.to_dict() == want.config.to_dict()
    assert got.generation_config.to_dict() == want.generation_config.to_dict()


@pytest.mark.parametrize("shard", [{}, {"max_shard_size": "100KB"}], ids=["one file", "sharded"])
def test_a_bf16_checkpoint_read_at_fp32_is_the_model_from_pretrained_reads(tmp_path, shard):
    folder = save_checkpoint(tmp_path, torch.bfloat16, **shard)
    assert (folder / "model.safetensors.index.json").exists() == bool(shard)
    got = lean.load_widened(str(folder), torch.float32)
    want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert got is not None
    assert_same_model(got, want)
    assert got.lm_head.weight is got.model.embed_tokens.weight  # still tied


def test_the_loader_takes_the_widened_path_and_the_model_still_scores(tmp_path, monkeypatch):
    folder = save_checkpoint(tmp_path, torch.bfloat16)
    taken = []
    real = lean.widened_state_dict
    monkeypatch.setattr(lean, "widened_state_dict", lambda *a: taken.append(a) or real(*a))
    loaded = load_causal_lm(path=str(folder), name="tiny-gemma")
    assert len(taken) == 1
    assert_same_model(loaded.model, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    assert torch.isfinite(loaded.model(input_ids=torch.tensor([[1, 5, 9]])).logits).all()
    loaded.reload()  # as a sweep's next job reads the weights again
    assert len(taken) == 2


@pytest.mark.parametrize("saved, wanted", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)],
                         ids=["fp32 checkpoint", "bf16 wanted"])
def test_nothing_to_widen_leaves_the_plain_load(tmp_path, saved, wanted):
    assert lean.load_widened(str(save_checkpoint(tmp_path, saved)), wanted) is None


def test_a_folder_without_safetensors_or_a_hub_id_leaves_the_plain_load(tmp_path):
    assert lean.load_widened(str(tmp_path), torch.float32) is None
    assert lean.load_widened("org/not-a-local-folder", torch.float32) is None


def test_pages_are_released_only_inside_the_files_mapping_and_read_back_the_same(tmp_path):
    from safetensors import safe_open

    folder = save_checkpoint(tmp_path, torch.bfloat16)
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        release = lean.page_release(path)
        key = "model.embed_tokens.weight"
        view, copy = handle.get_tensor(key), handle.get_tensor(key).clone()
        release(view)  # the file's own pages: dropped, and faulted in again from the file when read
        assert torch.equal(view, copy)
        release(copy)  # memory that is not the file's: never touched
        assert torch.equal(copy, view)


def test_a_tokenizer_without_its_construction_copies_encodes_and_saves_as_before(tmp_path):
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4, "▁": 5, "a": 6, "b": 7, "ab": 8, "▁ab": 9}
    build = lambda: GemmaTokenizer(vocab=dict(vocab), merges=[("a", "b"), ("▁", "ab")])  # noqa: E731
    full, leaned = build(), lean.lean_tokenizer(build())
    assert not hasattr(leaned, "_vocab") and not hasattr(leaned, "_merges")
    text = "ab ba abab"
    assert leaned(text) == full(text) and leaned.decode(leaned(text).input_ids) == full.decode(full(text).input_ids)
    full.save_pretrained(tmp_path / "full")
    leaned.save_pretrained(tmp_path / "leaned")
    names = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "leaned").iterdir())
    assert all(filecmp.cmp(tmp_path / "full" / n, tmp_path / "leaned" / n, shallow=False) for n in names)

