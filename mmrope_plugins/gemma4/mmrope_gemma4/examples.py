"""A tiny real Gemma4 processor, built offline, for ``mmrope demo`` and the conformance checks."""

from __future__ import annotations

from typing import Any

from mmrope_core import ExampleCase
from mmrope_core.tiny import filler_text, processors_without_torchvision, random_image, word_level_tokenizer

IMAGE_TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>"}
AUDIO_TOKENS = {"audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}


def builds_offline() -> bool:
    """Whether the installed transformers' ``Gemma4Processor`` imports without torchvision (5.10
    needs it)."""
    import transformers

    try:
        transformers.Gemma4Processor  # noqa: B018
    except ImportError:
        return False
    return True


def build(with_audio_tokens: bool = True, max_soft_tokens: int = 70) -> tuple[Any, Any]:
    """``(processor, config)``: a real ``Gemma4Processor`` with a word-level vocabulary.

    ``with_audio_tokens=False`` builds an image-only tokenizer, on which the processor's own
    input check fails even for images (its audio condition is mis-parenthesised).
    """
    import transformers
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    tokens = {**IMAGE_TOKENS, **(AUDIO_TOKENS if with_audio_tokens else {})}
    with processors_without_torchvision() as video_processor:
        processor = transformers.Gemma4Processor(
            feature_extractor=Gemma4AudioFeatureExtractor(),
            image_processor=Gemma4ImageProcessorPil(max_soft_tokens=max_soft_tokens),
            tokenizer=word_level_tokenizer(tokens),
            video_processor=video_processor,
        )
    return processor, transformers.AutoConfig.for_model("gemma4")


def image_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Three samples: two images, one image, none; random text around them."""
    samples = []
    for count in (2, 1, 0):
        parts, images = [filler_text(rng, rng.randint(1, 5))], []
        for _ in range(count):
            parts += [processor.image_token, filler_text(rng, rng.randint(1, 4))]
            images.append(random_image(rng, 16 * rng.randint(3, 8), 16 * rng.randint(3, 8)))
        sample: dict[str, Any] = {"text": [" ".join(parts)], "return_tensors": "pt"}
        if images:
            sample["images"] = [images]
        samples.append(sample)
    return samples


def image_prompt(processor: Any, rng: Any) -> dict[str, Any]:
    """The samples of :func:`image_samples` as one padded processor call."""
    samples = image_samples(processor, rng)
    return {"text": [sample["text"][0] for sample in samples],
            "images": [sample.get("images", [[]])[0] for sample in samples],
            "padding": True, "return_tensors": "pt"}


def example_cases() -> list[ExampleCase]:
    return [ExampleCase("Gemma4", build, image_samples)]
