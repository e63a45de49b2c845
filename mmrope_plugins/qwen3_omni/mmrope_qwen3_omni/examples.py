"""Tiny real Omni processors, built offline, for ``mmrope demo``, the checks and the tests."""

from __future__ import annotations

import functools
from typing import Any

from mmrope_core import ExampleCase
from mmrope_core.tiny import filler_text, processors_without_torchvision, random_image, word_level_tokenizer

QWEN3_OMNI_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
QWEN2_5_OMNI_TOKENS = {
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "audio_token": "<|AUDIO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}
_SPECS = {
    "Qwen3-Omni": ("Qwen3OmniMoeProcessor", QWEN3_OMNI_TOKENS, "qwen3_omni_moe"),
    "Qwen2.5-Omni": ("Qwen2_5OmniProcessor", QWEN2_5_OMNI_TOKENS, "qwen2_5_omni"),
}


def build(name: str) -> tuple[Any, Any]:
    """``(processor, config)``: a real Omni processor (word-level vocabulary, Whisper feature
    extractor) and the family's default config with the tokenizer's token ids."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor_name, tokens, model_type = _SPECS[name]
    tokenizer = word_level_tokenizer(tokens)
    with processors_without_torchvision() as video_processor:
        # some releases read the video merge size even for prompts without video
        video_processor.merge_size = getattr(video_processor, "merge_size", 2)
        processor = getattr(transformers, processor_name)(
            image_processor=Qwen2VLImageProcessorPil(),
            video_processor=video_processor,
            feature_extractor=transformers.WhisperFeatureExtractor(),
            tokenizer=tokenizer,
        )
    config = transformers.AutoConfig.for_model(model_type)
    thinker = config.thinker_config
    ids = tokenizer.convert_tokens_to_ids
    thinker.image_token_id = ids(tokens["image_token"])
    thinker.video_token_id = ids(tokens["video_token"])
    thinker.audio_token_id = ids(tokens["audio_token"])
    thinker.audio_start_token_id = ids(tokens["audio_bos_token"])
    thinker.vision_start_token_id = ids(tokens["vision_bos_token"])
    return processor, config


def audio_and_image_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Three samples: an image and an audio clip; an audio clip alone; text alone. The text holds
    the start and end markers itself, as Omni chat templates write them."""
    import numpy as np

    tokenizer = processor.tokenizer
    image = f"{tokenizer.vision_bos_token}{processor.image_token}{tokenizer.vision_eos_token}"
    audio = f"{tokenizer.audio_bos_token}{processor.audio_token}{tokenizer.audio_eos_token}"

    def clip(seconds: float):
        return np.sin(np.arange(int(16000 * seconds)) / rng.uniform(5, 40)).astype(np.float32)

    return [
        {"text": [f"{filler_text(rng, 3)} {image} {filler_text(rng, 2)} {audio} {filler_text(rng, 2)}"],
         "images": [random_image(rng, 56, 84)], "audio": [clip(1)], "return_tensors": "pt"},
        {"text": [f"{filler_text(rng, 2)} {audio} {filler_text(rng, 4)}"], "audio": [clip(2)], "return_tensors": "pt"},
        {"text": [filler_text(rng, 5)], "return_tensors": "pt"},
    ]


def audio_and_image_prompt(processor: Any, rng: Any) -> dict[str, Any]:
    """The first two samples of :func:`audio_and_image_samples` as one padded processor call."""
    samples = audio_and_image_samples(processor, rng)[:2]
    return {"text": [sample["text"][0] for sample in samples],
            "images": [image for sample in samples for image in sample.get("images", [])],
            "audio": [clip for sample in samples for clip in sample["audio"]],
            "padding": True, "return_tensors": "pt"}


def one_sample(processor: Any, config: Any, rng: Any) -> dict[str, Any]:
    """One generated sample for this processor and config: images, audio and videos, every other
    one with the videos' audio interleaved (``use_audio_in_video``)."""
    from .agreement import agreeing_audio_rule
    from .binding import thinker_config, token_ids
    from .families import family_of
    from .layout import tokens_of
    from .probe import random_batch

    family = family_of(processor)
    assert family is not None, f"{type(processor).__name__} is no Omni processor"
    thinker = thinker_config(family, processor, config)
    ids = token_ids(processor)
    markers = {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]}
    words = processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat"])
    # vLLM takes no audio of its own beside a video with its audio: such samples carry videos only
    in_video = rng.random() < 0.5
    kinds = ("image", "video", "video") if in_video else ("image", "audio", "video", "video")
    return random_batch(family, tokens_of(thinker, markers), int(thinker.vision_config.spatial_merge_size), thinker,
                        rng, use_audio_in_video=in_video, max_batch=1, max_items=3, text_ids=words,
                        pad_id=processor.tokenizer.pad_token_id, kinds=kinds,
                        audio_rule=agreeing_audio_rule(family, thinker, markers))


def example_cases() -> list[ExampleCase]:
    return [ExampleCase(name, functools.partial(build, name), audio_and_image_samples, one_sample) for name in _SPECS]
