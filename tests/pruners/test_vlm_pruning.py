"""Pruning a vision-language model (tiny-llava): `pruner.tower` decides which weights change, the
projector never does, masked and sliced heads agree in either tower, calibration can carry images,
and an impossible combination fails validation before any model loads."""

from __future__ import annotations

import copy

import pytest
import torch
from hydra.utils import instantiate

from conftest import compose_cfg, reordered
from prunebench.api.errors import ConfigError
from prunebench.models.attention import attention_heads
from prunebench.models.cache import get_model
from prunebench.validate import validate
from helpers.vlm_pruning import image_inputs, pruned
from prunebench.calibration import calibration_config

VISION, PROJECTOR, LANGUAGE = "model.vision_tower.", "model.multi_modal_projector.", "model.language_model."
# image+text calibration: two easy_vqa train questions with their images and answers (offline)
IMAGE_TEXT = ["calib=image_text", "calib.n_samples=2"]
CALIBRATED = ["wanda", "sparsegpt", "heads_his", "heads_entropy", "hies", "layers_bi", "width_amp", "mop"]
UNCALIBRATED = ["magnitude", "random", "heads_l2", "heads_random", "layers_last"]


@pytest.fixture(scope="module")
def tiny_llava():
    return get_model(compose_cfg(["model=tiny-llava"]).model)




def changed(before: torch.nn.Module, after: torch.nn.Module) -> set[str]:
    """Parameters whose shape or values differ, or that exist on one side only."""
    old, new = dict(before.named_parameters()), dict(after.named_parameters())
    return {name for name in old.keys() | new.keys()
            if name not in old or name not in new or old[name].shape != new[name].shape
            or not torch.equal(old[name], new[name])}




@pytest.mark.parametrize("name", CALIBRATED + UNCALIBRATED)
def test_tower_language_changes_only_the_language_model(tiny_llava, name):
    extra = IMAGE_TEXT if name in CALIBRATED else []
    if name == "layers_last":  # it keeps the last two blocks: tiny-llava's two would all stay
        tiny_llava = get_model(compose_cfg(["model=tiny-llava", "model.text_config.num_hidden_layers=4"]).model)
    model, stats = pruned(tiny_llava, [f"pruner={name}", *extra])
    touched = changed(tiny_llava.model, model.model)
    assert touched, f"{name} changed nothing"
    assert all(n.startswith(LANGUAGE + "layers.") for n in touched), sorted(touched)[:5]
    assert stats["sparsity/actual"] > 0


def test_text_calibration_serves_a_vlm(tiny_llava, tmp_path):
    """Text windows through the language model (labelled with themselves: the LM loss)."""
    corpus = tmp_path / "calib.txt"
    corpus.write_text(" ".join(["a red circle is left of a blue square"] * 40))
    model, _ = pruned(tiny_llava, ["pruner=heads_his", "calib=file", f"calib.path={corpus}",
                                   "calib.n_samples=2", "calib.seq_len=16"])
    assert all(n.startswith(LANGUAGE) for n in changed(tiny_llava.model, model.model))


@pytest.mark.parametrize("name", ["heads_his", "heads_entropy", "hies", "heads_l2", "heads_random"])
def test_tower_vision_prunes_only_clip_heads(tiny_llava, name):
    extra = IMAGE_TEXT if name in ("heads_his", "heads_entropy", "hies") else []
    model, stats = pruned(tiny_llava, [f"pruner={name}", "pruner.tower=vision", *extra])
    touched = changed(tiny_llava.model, model.model)
    assert touched and all(n.startswith(VISION + "encoder.layers.") and ".self_attn." in n for n in touched)
    assert stats["sparsity/actual"] == 0.5  # 4 of the 8 CLIP heads
    # heads left that still contribute (a layer losing every head keeps one inert slot)
    assert sum(h.n_heads - len(h.inert()) for h in attention_heads(model.model, "vision")) == 4


def test_tower_all_ranks_both_towers_and_leaves_the_projector(tiny_llava):
    model, stats = pruned(tiny_llava, ["pruner=heads_his", "pruner.tower=all", *IMAGE_TEXT])
    touched = changed(tiny_llava.model, model.model)
    assert any(n.startswith(VISION) for n in touched) and any(n.startswith(LANGUAGE) for n in touched)
    assert not any(n.startswith(PROJECTOR) for n in touched)
    assert stats["sparsity/actual"] == 0.5  # 8 of the 16 heads of both towers


def test_his_of_vision_heads_llava_never_reads_is_zero(tiny_llava):
    """LLaVA takes its image features from the vision tower's second-to-last layer
    (vision_feature_layer=-2), so the last layer's heads cannot move the loss."""
    cfg = compose_cfg(["model=tiny-llava", "task=easy_vqa", "pruner=heads_his", "pruner.tower=vision", *IMAGE_TEXT])
    pruner, calib = instantiate(cfg.pruner, _convert_="all"), instantiate(calibration_config(cfg), _convert_="all")
    his = pruner.score(copy.deepcopy(tiny_llava), calib)["his"]
    assert his[0].gt(0).all() and his[1].eq(0).all()


@pytest.mark.parametrize("tower", ["language", "vision"])
def test_masked_and_sliced_heads_give_the_same_outputs(tiny_llava, tower):
    """The same heads (heads_l2, per-layer scope, so both modes choose alike) zeroed or sliced out:
    logits on an image+text prompt agree up to summation order (reordered: 2 + 2 layers deep)."""
    common = ["pruner=heads_l2", f"pruner.tower={tower}", "pruner.scope=layer"]
    masked, _ = pruned(tiny_llava, [*common, "pruner.mode=mask"])
    sliced, _ = pruned(tiny_llava, [*common, "pruner.mode=remove"])
    inputs = image_inputs(tiny_llava)
    with torch.no_grad():
        dense, want, got = (m.model(**inputs).logits for m in (tiny_llava, masked, sliced))
    assert (want - dense).abs().max() > 1e-3  # the heads mattered
    assert sum(p.numel() for p in sliced.model.parameters()) < sum(p.numel() for p in masked.model.parameters())
    torch.testing.assert_close(got, want, **reordered(want, depth=4))


def test_width_pruned_language_model_saves_and_reloads(tiny_llava, tmp_path):
    """Width pruning's uniform shapes are written into the text config (not LLaVA's own), so the
    smaller model reloads as itself."""
    from transformers import LlavaForConditionalGeneration

    sliced, _ = pruned(tiny_llava, ["pruner=width_amp", *IMAGE_TEXT])
    text = sliced.model.config.text_config
    assert (text.num_attention_heads, text.num_key_value_heads, text.intermediate_size) == (2, 2, 64)
    sliced.model.save_pretrained(tmp_path)
    again = LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
    inputs = image_inputs(tiny_llava)
    with torch.no_grad():
        want = sliced.model(**inputs).logits
        torch.testing.assert_close(again(**inputs).logits, want, **reordered(want, depth=4))


def test_image_text_batches_label_the_answer_only(tiny_llava):
    cfg = compose_cfg(["model=tiny-llava", *IMAGE_TEXT, "calib.n_samples=3"])
    calib = instantiate(calibration_config(cfg), _convert_="all")
    batches = calib.batches(tiny_llava, 2)
    assert [b["input_ids"].shape[0] for b in batches] == [2, 1] and all("pixel_values" in b for b in batches)
    docs = calib.task.docs()
    import random

    picked = [docs[i] for i in random.Random(cfg.seed).sample(range(len(docs)), 3)]
    labelled = [tiny_llava.tokenizer.decode(row[row != -100]).strip() for b in batches for row in b["labels"]]
    assert labelled == [doc["answer"] for doc in picked]


@pytest.mark.parametrize("overrides, message", [
    (["pruner=magnitude", "pruner.tower=vision"], "cannot prune the vision tower"),
    (["pruner=layers_bi", "pruner.tower=all", *IMAGE_TEXT], "cannot prune the all tower"),
    (["pruner=heads_his", "pruner.tower=vision", "calib=file", f"calib.path={__file__}"],
     "has none; use calib=image_text"),
    (["pruner=heads_l2", "pruner.tower=eyes"], "tower='eyes'; valid"),
    (["pruner=heads_l2", "pruner.scope=vision"], "pruner.tower=vision"),
])
def test_unsupported_tower_combinations_fail_validation(overrides, message, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("prunebench.models.cache.get_model", no_loading)
    with pytest.raises(ConfigError, match=message):
        validate(compose_cfg(["model=tiny-llava", "task=easy_vqa", *overrides]))


def test_a_tower_or_image_calibration_on_a_text_model_fails_validation():
    with pytest.raises(ConfigError, match="vision-language model.*family 'causal_lm'"):
        validate(compose_cfg(["model=tiny-llama", "pruner=heads_l2", "pruner.tower=vision"]))
    with pytest.raises(ConfigError, match="calibrates on images, which model='tiny-llama'"):
        validate(compose_cfg(["model=tiny-llama", "pruner=heads_his", *IMAGE_TEXT]))


def test_tower_language_keeps_the_run_keys_stored_before_it_existed():
    from omegaconf import OmegaConf

    from prunebench.tracking.run_key import run_key

    cfg = compose_cfg(["model=tiny-llava", "task=easy_vqa", "pruner=magnitude"])
    older = copy.deepcopy(cfg)
    OmegaConf.set_struct(older, False)
    del older.pruner["tower"]
    assert run_key(cfg) == run_key(older)
    assert run_key(compose_cfg(["model=tiny-llava", "task=easy_vqa", "pruner=heads_l2", "pruner.tower=vision"])) != \
        run_key(compose_cfg(["model=tiny-llava", "task=easy_vqa", "pruner=heads_l2"]))


def test_a_job_prunes_both_towers_on_image_text_calibration(store):
    import mlflow

    from prunebench.job import run

    metrics = run(compose_cfg(["model=tiny-llava", "task=easy_vqa", "limit=2", "pruner=heads_his", "pruner.tower=all",
                               "sparsity=0.25", *IMAGE_TEXT, "trainer.enable_progress_bar=false"]))
    assert metrics["sparsity/actual"] == 0.25 and 0 < metrics["sparsity/params"] < 0.25
    assert 0.0 <= metrics["easy_vqa/exact_match"] <= 1.0
    finished = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert {r.info.status for r in finished} == {"FINISHED"} and len(finished) == 2  # the dense baseline first
