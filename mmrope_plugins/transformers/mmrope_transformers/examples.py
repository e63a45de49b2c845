"""Tiny real processors of each model type this plugin binds, built offline, with samples: for
``mmrope demo``, ``mmrope check transformers`` and the tests.

Each case builds the model type's own processor class with a word-level vocabulary, and the
model type's default config carrying the tokenizer's token ids, as a checkpoint's config does.
Model types that do not exist in the installed transformers are left out.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

from mmrope_core import ExampleCase, InvalidInputError
from mmrope_core.tiny import (
    FILLER_WORDS,
    filler_text,
    processors_without_torchvision,
    random_image,
    word_level_tokenizer,
)

from .specs import FAMILY_PLUGIN_SPECS, MROPE_SPECS, ONE_D_SPECS, Spec, available, spec_of

__all__ = ["FAMILY_PLUGIN_SPECS", "MROPE_SPECS", "ONE_D_SPECS", "Spec", "available", "build", "example_cases",
           "generated", "samples", "spec_of"]


def build(spec: Spec) -> tuple[Any, Any]:
    """``(processor, config)`` of ``spec``: the real processor class with a word-level vocabulary,
    and the model type's default config with the tokenizer's ids."""
    import transformers

    module, image_class, image_kwargs = spec.image_processor
    image_module = importlib.import_module(f"transformers.models.{module}.image_processing_pil_{module}")
    image_processor = getattr(image_module, image_class)(**image_kwargs)
    tokenizer = word_level_tokenizer(spec.tokens, words=(*FILLER_WORDS, *spec.words))
    if spec.newline_token:
        from tokenizers import AddedToken

        # a whitespace pre-tokenizer would drop it
        tokenizer.add_tokens([AddedToken("\n", normalized=False, special=True)])
    parts: dict[str, Any] = {"image_processor": image_processor, "tokenizer": tokenizer, **spec.processor_kwargs}
    with processors_without_torchvision() as video_processor:
        if spec.video_processor:
            for key, value in spec.video_processor_attributes.items():
                setattr(video_processor, key, value)
            parts["video_processor"] = video_processor
        processor = getattr(transformers, spec.processor)(**parts)
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in spec.config_ids.items()}
    config = transformers.AutoConfig.for_model(spec.model_type, **spec.config_kwargs)
    for key, value in ids.items():
        setattr(config, key, value)
        text = getattr(config, "text_config", None)
        if text is not None and hasattr(text, key):
            setattr(text, key, value)
    return processor, config


def samples(spec: Spec, processor: Any, rng: Any) -> list[Mapping[str, Any]]:
    """One processor call per sample: ``spec.counts`` images each, random text around them."""
    image_text = spec.image_text.format(image=getattr(processor, "image_token", ""))
    low, high, step = spec.sizes
    out: list[Mapping[str, Any]] = []
    for count in spec.counts:
        parts = [filler_text(rng, rng.randint(1, 6))]
        for _ in range(count):
            parts += [image_text, filler_text(rng, rng.randint(1, 4))]
        images = [random_image(rng, step * rng.randint(low, high), step * rng.randint(low, high)) for _ in range(count)]
        text = " ".join(part for part in parts if part)
        sample = {"text": [text], "return_tensors": "pt", **spec.call_kwargs}
        if images:
            sample["images"] = [images] if spec.images_in_a_list else images
        out.append(sample)
    return out


def generated(spec: Spec, processor: Any, config: Any, rng: Any) -> dict[str, Any]:
    """One generated sample as ``engine.get_rope_index`` takes it (``mmrope verify``): laid out as
    the processor lays it out, or made by the processor where the layout is its own."""
    from mmrope_core import RopeEngine

    from .layouts import LAYOUTS, processor_batch, random_batch

    model_type = getattr(config, "model_type", spec.model_type)  # the layout of the config's model type
    if model_type in LAYOUTS:
        return random_batch(model_type, processor, config, rng, samples=1)
    if model_type != spec.model_type:
        raise InvalidInputError(f"{spec.name} generates samples of model type {spec.model_type!r}, and mmrope knows "
                                f"no layout of {model_type!r} to draw them from")
    engine = RopeEngine.from_processor(processor, config, implementation="reference")
    ids, mask, inputs = engine.batch(processor_batch(spec.model_type, processor, rng, max_batch=1))
    return {"input_ids": ids, "attention_mask": mask, **engine.rope_index_kwargs(inputs)}


def example_cases() -> list[ExampleCase]:
    return [ExampleCase(spec.name, functools.partial(build, spec), functools.partial(samples, spec),
                        batches=functools.partial(generated, spec) if spec in MROPE_SPECS else None)
            for spec in (*MROPE_SPECS, *ONE_D_SPECS) if available(spec)]
