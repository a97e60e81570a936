"""Vision-language models: tiny-llava builds offline, the generation engine feeds images through
the processor and decodes exactly as transformers' own greedy `generate`, and the hf_vlm loader
reads a saved checkpoint back as LlavaForConditionalGeneration."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import compose_cfg
from prunebench.evaluation.generation.engine import GenerationDataModule, GenerationModule
from prunebench.models.cache import get_model
from prunebench.tasks.generate_until import GenerateUntilTask
from prunebench.tasks.sources import JsonSource

QUESTIONS = ["What is shown?", "What colour is the large shape in the middle of this picture?", "Count them."]


@pytest.fixture(scope="module")
def tiny_llava():
    return get_model(compose_cfg(["model=tiny-llava"]).model)


def picture_task(tmp_path, sizes=((20, 30), (16, 16), (40, 24)), **kwargs) -> GenerateUntilTask:
    """Random pictures of differing shapes (the processor resizes and crops them) and their questions."""
    rng = np.random.RandomState(0)
    rows = []
    for i, (question, (h, w)) in enumerate(zip(QUESTIONS, sizes)):
        Image.fromarray(rng.randint(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"question": question, "image": f"{i}.png", "answer": "red"})
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = {"max_gen_toks": 12, "until": [], **kwargs}
    return GenerateUntilTask("pictures", JsonSource(str(tmp_path / "q.jsonl")), "question", "answer",
                             doc_to_image="image", image_dir=str(tmp_path), **options)


def run_engine(task, model, batch_tokens=8192) -> list[dict]:
    data, module = GenerationDataModule(task, model, batch_tokens=batch_tokens), GenerationModule(model, task)
    data.setup()
    for i, batch in enumerate(data.test_dataloader()):
        module.test_step(batch, i)
    return sorted(module.records, key=lambda r: r["doc_id"])


def reference(model, question: str, image_path) -> str:
    """transformers alone: LLaVA-1.5's prompt, the processor, greedy generate, the new tokens decoded."""
    inputs = model.processor(images=[Image.open(image_path).convert("RGB")],
                             text=[f"USER: <image>\n{question} ASSISTANT:"], return_tensors="pt")
    out = model.model.generate(**inputs, max_new_tokens=12, do_sample=False, pad_token_id=model.tokenizer.pad_token_id)
    return model.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


def test_tiny_llava_is_a_seeded_llava_with_its_processor(tiny_llava):
    from transformers import LlavaForConditionalGeneration

    assert isinstance(tiny_llava.model, LlavaForConditionalGeneration) and tiny_llava.family == "vlm"
    assert tiny_llava.chat_prompt("Why?", 1) == "USER: <image>\nWhy? ASSISTANT:"
    again = get_model(compose_cfg(["model=tiny-llava", "model.dtype=float32"]).model)
    for a, b in zip(tiny_llava.model.parameters(), again.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("batch_tokens", [8192, 1], ids=["one_batch", "one_per_batch"])
def test_greedy_generation_with_images_equals_transformers_generate(tmp_path, tiny_llava, batch_tokens):
    """Token for token (the decoded generations), alone and left-padded into one batch of three."""
    task = picture_task(tmp_path)
    records = run_engine(task, tiny_llava, batch_tokens)
    expected = [reference(tiny_llava, q, tmp_path / f"{i}.png") for i, q in enumerate(QUESTIONS)]
    assert [r["response"] for r in records] == expected
    assert all(len(tiny_llava.tokenizer(text)["input_ids"]) > 3 for text in expected)  # not empty replies


def test_the_image_changes_the_generation(tmp_path, tiny_llava):
    """The pixels reach the model: the same question on other pictures is answered otherwise."""
    first = [r["response"] for r in run_engine(picture_task(tmp_path), tiny_llava)]
    for i in range(3):
        Image.new("RGB", (16, 16), (255 * (i % 2), 0, 0)).save(tmp_path / f"{i}.png")
    task = GenerateUntilTask("pictures", JsonSource(str(tmp_path / "q.jsonl")), "question", "answer",
                             doc_to_image="image", image_dir=str(tmp_path), max_gen_toks=12, until=[])
    assert [r["response"] for r in run_engine(task, tiny_llava)] != first


def test_a_missing_image_fails_the_check_naming_it(tmp_path):
    task = picture_task(tmp_path)
    (tmp_path / "1.png").unlink()
    (tmp_path / "2.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"2 image\(s\) missing .*1\.png.*2\.png"):
        task.check()


def test_a_text_model_refuses_image_requests(tmp_path):
    text_model = get_model(compose_cfg(["model=tiny-llama"]).model)
    with pytest.raises(ValueError, match="carry images"):
        GenerationDataModule(picture_task(tmp_path), text_model).setup()


def test_hf_vlm_loads_a_saved_llava_folder(tmp_path, tiny_llava):
    from transformers import LlavaForConditionalGeneration

    tiny_llava.model.save_pretrained(tmp_path / "ckpt")
    tiny_llava.processor.save_pretrained(tmp_path / "ckpt")
    loaded = get_model(compose_cfg(["model=hf_vlm", f"model.path={tmp_path / 'ckpt'}"]).model)
    assert isinstance(loaded.model, LlavaForConditionalGeneration) and loaded.max_length == 256
    images = tmp_path / "pictures"
    images.mkdir()
    task = picture_task(images)
    assert [r["response"] for r in run_engine(task, loaded)] == [r["response"] for r in run_engine(task, tiny_llava)]


def test_magnitude_prunes_the_language_tower_only(tiny_llava):
    """pruner.tower=language (the default): the language model only, vision tower and projector untouched."""
    import copy

    from hydra.utils import instantiate

    model = copy.deepcopy(tiny_llava)
    # the exact-count rule, so that each matrix is exactly half zeros (the released rule prunes one more)
    pruner = instantiate(compose_cfg(["model=tiny-llava", "pruner=magnitude", "pruner.mask_rule=exact"]).pruner,
                         _convert_="all")
    pruner.apply(model, pruner.score(model, None), 0.5)
    zeros = {name: float((module.weight == 0).float().mean()) for name, module in model.model.named_modules()
             if isinstance(module, torch.nn.Linear)}
    language = {n: z for n, z in zeros.items() if ".language_model.layers." in n}
    assert language and all(z == 0.5 for z in language.values())  # layer scope: exactly half of each matrix
    assert all(z == 0.0 for n, z in zeros.items() if n not in language)
