"""The five vision-language benchmarks' files, a few documents each, in their published schemas (LLaVA's
question files, GPT-4 answers and contexts, MM-Vet's mm-vet.json), with stand-in images."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import stand_in_images


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


CATEGORIES = ["conv", "detail", "complex", "conv", "detail", "complex"]


def _llava_bench(questions: Path, answers: Path, image: str, first_image: int, question: str, reference: str) -> None:
    """LLaVA's question file and GPT-4 answer file: three categories per image, two images."""
    _jsonl(questions, [{"question_id": i, "image": image.format(i // 3 + first_image), "text": f"{question} {i}?",
                        "category": c} for i, c in enumerate(CATEGORIES)])
    _jsonl(answers, [{"question_id": i, "text": f"{reference} {i}.", "category": c} for i, c in enumerate(CATEGORIES)])


def write_vlm_data(root: Path) -> tuple[Path, Path]:
    """(data_dir, image_dir) for task=llava_suite: 6 documents per task."""
    images = []
    science = [{"id": str(i), "image": f"{i}/image.png", "conversations": [
        {"from": "human", "value": f"<image>\nContext: A picture.\nWhich is item {i}?\nA. this\nB. that"},
        {"from": "gpt", "value": "A"}]} for i in range(6)]
    (root / "scienceqa").mkdir(parents=True)
    (root / "scienceqa" / "llava_test_CQM-A.json").write_text(json.dumps(science))
    images += [d["image"] for d in science]
    post = ("\nWhen the provided information is insufficient, respond with 'Unanswerable'.\n"
            "Answer the question using a single word or phrase.")
    _jsonl(root / "vizwiz" / "llava_test.jsonl", [{"question_id": i, "image": f"VizWiz_test_{i:08d}.jpg",
                                                   "text": f"What is object {i}?" + post, "category": "default"} for i in range(6)])
    images += [f"VizWiz_test_{i:08d}.jpg" for i in range(6)]
    coco = root / "llava-bench-coco"
    _llava_bench(coco / "qa90_questions.jsonl", coco / "qa90_gpt4_answer.jsonl", "0000{}.jpg", 0, "Question", "Reference")
    _jsonl(coco / "caps_boxes_coco2014_val_80.jsonl", [{"id": f"0000{j}", "image": f"0000{j}.jpg",
                                                        "captions": [f"Caption {j}a.", f"Caption {j}b."],
                                                        "instances": [{"category": "cat", "bbox": [0.1, 0.2, 0.5, 0.9]}]}
                                                       for j in range(2)])
    images += [f"0000{j}.jpg" for j in range(2)]
    wild = root / "llava-bench-in-the-wild"
    _llava_bench(wild / "questions.jsonl", wild / "answers_gpt4.jsonl", "{:03d}.jpg", 1, "Wild", "Wild reference")
    _jsonl(wild / "context.jsonl", [{"id": f"{j:03d}", "image": f"{j:03d}.jpg", "caption": f"A scene {j}."}
                                    for j in (1, 2)])
    images += ["001.jpg", "002.jpg"]
    _jsonl(root / "mm-vet" / "llava-mm-vet.jsonl", [{"image": f"v1_{i}.png", "text": f"What is {i}?", "category": "conv",
                                                     "question_id": i} for i in range(6)])
    (root / "mm-vet" / "mm-vet.json").write_text(json.dumps({f"v1_{i}": {
        "imagename": f"v1_{i}.png", "capability": ["rec", "ocr"] if i % 2 else ["math"], "question": f"What is {i}?",
        "answer": f"{i}<OR>{i + 1}"} for i in range(6)}))
    images += [f"v1_{i}.png" for i in range(6)]
    stand_in_images(root / "images", images)
    return root, root / "images"


SUITE_TASKS = ["scienceqa_img", "vizwiz_vqa", "llava_bench_coco", "llava_bench_wild", "mm_vet"]


def suite_overrides(data_dir: Path, image_dir: Path, max_gen_toks: int = 8) -> list[str]:
    """task=llava_suite on the fixtures; the long-answer tasks' budgets cut to fit tiny-llava's 256 positions."""
    return ["task=llava_suite", f"data_dir={data_dir}",
            *(f"task.tasks.{t}.image_dir={image_dir}" for t in SUITE_TASKS),
            *(f"task.tasks.{t}.max_gen_toks={max_gen_toks}" for t in ("llava_bench_coco", "llava_bench_wild", "mm_vet"))]
