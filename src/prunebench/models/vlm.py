"""Vision-language models (LLaVA and its kin): the adapter renders a prompt with the processor's
chat template and turns prompts plus images into model inputs through the processor, so the
generation engine feeds images without knowing the family."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from prunebench.models.loaded import LoadedModel, model_max_length, resolve_dtype


def open_image(image):
    """A path (opened with PIL, which reads pixels and never unpickles), a reference that opens
    itself (a zip member, a dataset row: tasks/images.py), or an image already opened."""
    if hasattr(image, "open_image"):
        return image.open_image()
    if isinstance(image, (str, Path)):
        from PIL import Image

        with Image.open(image) as img:
            return img.convert("RGB")
    return image.convert("RGB")


@dataclass
class VisionLanguageModel(LoadedModel):
    """`processor`: the model's processor (image processor + tokenizer + chat template)."""

    @property
    def image_tokens(self) -> int:
        """Positions one image takes in the prompt (LLaVA-1.5: 576), for batch budgets."""
        return int(getattr(self.model.config, "image_seq_length", 0) or 0)

    def chat_prompt(self, prompt: str, n_images: int) -> str:
        """One user turn with the images before the text and the assistant's turn opened, as
        lmms-eval's llava_hf renders it: "USER: <image>\\n{prompt} ASSISTANT:" for LLaVA-1.5."""
        content = [{"type": "image"}] * n_images + [{"type": "text", "text": prompt}]
        return self.processor.apply_chat_template([{"role": "user", "content": content}],
                                                  add_generation_prompt=True)

    def multimodal_inputs(self, texts: list[str], images: list[list]) -> dict:
        """Rendered prompts and their images -> left-padded model inputs, pixels in the model's dtype."""
        flat = [open_image(image) for row in images for image in row]
        self.processor.tokenizer.padding_side = "left"
        inputs = self.processor(images=flat or None, text=texts, return_tensors="pt", padding=True)
        return dict(inputs.to(dtype=self.model.dtype))

    def labelled_inputs(self, prompts: list[str], answers: list[str], images: list[list]) -> dict:
        """Each prompt in the chat template followed by its answer, as model inputs whose `labels`
        are the answer's tokens alone (-100 on the prompt, its image and the padding): the LM loss on
        the answer, what HIS differentiates on image+text calibration. Padding is on the left, so
        each row's answer is its last tokens; their count is the row's length with the answer
        minus the prompt's alone (both through the processor, which expands the image tokens)."""
        texts = [self.chat_prompt(prompt, len(row)) for prompt, row in zip(prompts, images)]
        inputs = self.multimodal_inputs([f"{text} {answer}" for text, answer in zip(texts, answers)], images)
        prompt_lengths = [int(self.multimodal_inputs([text], [row])["attention_mask"].sum())
                          for text, row in zip(texts, images)]
        labels = torch.full_like(inputs["input_ids"], -100)
        for i, (full, prompt) in enumerate(zip(inputs["attention_mask"].sum(1).tolist(), prompt_lengths)):
            if full > prompt:
                labels[i, -(full - prompt):] = inputs["input_ids"][i, -(full - prompt):]
        return {**inputs, "labels": labels}


def load_vlm(*, path: str, name: str, family: str = "vlm", dtype: str = "float32", device: str = "cpu",
             max_length: int | None = None, revision: str | None = None, attn_implementation: str | None = None,
             trust_remote_code: bool = False) -> VisionLanguageModel:
    """Any image-text-to-text checkpoint with a processor (a hub id or a local folder); for
    llava-hf checkpoints transformers resolves it to LlavaForConditionalGeneration."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kwargs = {"dtype": resolve_dtype(dtype), "revision": revision, "trust_remote_code": trust_remote_code}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    def read():
        return AutoModelForImageTextToText.from_pretrained(path, **kwargs).to(device).eval()

    model = read()
    processor = AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    text_config = getattr(model.config, "text_config", model.config)
    return VisionLanguageModel(model=model, tokenizer=processor.tokenizer, name=name, family=family,
                               max_length=model_max_length(text_config, processor.tokenizer, max_length),
                               processor=processor, reload=read)
