"""Tiny real processors of each family, built offline, for ``mmrope demo`` and the conformance checks."""

from __future__ import annotations

import functools
from typing import Any

from mmrope_core import ExampleCase
from mmrope_core.tiny import filler_text, processors_without_torchvision, random_image, word_level_tokenizer

QWEN_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
GLM_TOKENS = {
    "image_token": "<|image|>",
    "video_token": "<|video|>",
    "begin_of_image_token": "<|begin_of_image|>",
    "end_of_image_token": "<|end_of_image|>",
    "begin_of_video_token": "<|begin_of_video|>",
    "end_of_video_token": "<|end_of_video|>",
}

# name -> (processor class, image processor module, image processor class, tokens, model_type)
_SPECS = {
    "Qwen2-VL": ("Qwen2VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen2_vl"),
    "Qwen2.5-VL": ("Qwen2_5_VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen2_5_vl"),
    "Qwen3-VL": ("Qwen3VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen3_vl"),
    "Qwen3-VL-MoE": ("Qwen3VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen3_vl_moe"),
    "Qwen3.5": ("Qwen3VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen3_5"),
    "Qwen3.5-MoE": ("Qwen3VLProcessor", "qwen2_vl", "Qwen2VLImageProcessorPil", QWEN_TOKENS, "qwen3_5_moe"),
    "GLM-4V": ("Glm4vProcessor", "glm4v", "Glm4vImageProcessorPil", GLM_TOKENS, "glm4v"),
    "GLM-4V-MoE": ("Glm4vProcessor", "glm4v", "Glm4vImageProcessorPil", GLM_TOKENS, "glm4v_moe"),
    "GLM-4.6V": ("Glm46VProcessor", "glm46v", "Glm46VImageProcessorPil", GLM_TOKENS, "glm46v"),
}


def build(name: str) -> tuple[Any, Any]:
    """``(processor, config)`` of family ``name``: a real processor with a word-level vocabulary
    and the family's default config (merge size 2)."""
    import importlib

    import transformers

    processor_cls_name, module, image_cls_name, tokens, model_type = _SPECS[name]
    image_module = importlib.import_module(f"transformers.models.{module}.image_processing_pil_{module}")
    image_processor = getattr(image_module, image_cls_name)()
    tokenizer = word_level_tokenizer(tokens)
    with processors_without_torchvision() as video_processor:
        processor = getattr(transformers, processor_cls_name)(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor
        )
    config = transformers.AutoConfig.for_model(model_type)
    return processor, config


def image_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Two samples of different lengths: one with two images, one with one, random text around."""
    start, end = _markers(processor)
    samples = []
    for count in (2, 1):
        parts, images = [filler_text(rng, rng.randint(1, 6))], []
        for _ in range(count):
            parts += [f"{start}{processor.image_token}{end}", filler_text(rng, rng.randint(1, 4))]
            images.append(random_image(rng, 28 * rng.randint(2, 4), 28 * rng.randint(2, 4)))
        samples.append({"text": [" ".join(parts)], "images": images, "return_tensors": "pt"})
    return samples


def image_prompt(processor: Any, rng: Any) -> dict[str, Any]:
    """The samples of :func:`image_samples` as one padded processor call."""
    samples = image_samples(processor, rng)
    return {"text": [text for sample in samples for text in sample["text"]],
            "images": [image for sample in samples for image in sample["images"]],
            "padding": True, "return_tensors": "pt"}


def _markers(processor: Any) -> tuple[str, str]:
    tokenizer = processor.tokenizer
    if hasattr(tokenizer, "vision_start_token"):
        return tokenizer.vision_start_token, tokenizer.vision_end_token
    return tokenizer.begin_of_image_token, tokenizer.end_of_image_token


def one_sample(processor: Any, config: Any, rng: Any) -> dict[str, Any]:
    """One generated sample with images and videos (:func:`~.samples.random_batch`); the config
    changes nothing in their layout."""
    from .samples import random_batch

    return random_batch(processor, rng, max_batch=1)


def example_cases() -> list[ExampleCase]:
    return [ExampleCase(name, functools.partial(build, name), image_samples, one_sample) for name in _SPECS]
