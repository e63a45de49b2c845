"""mmrope plugin for Qwen3-Omni and Qwen2.5-Omni (audio, image, video, audio-in-video)."""

from __future__ import annotations

from typing import Any

from mmrope_core import hookimpl

from .families import FAMILIES, family_of

PROCESSOR_CLASSES = tuple(FAMILIES)

#: Audio features and their mask vary in length per sample.
VARLEN_KEYS = frozenset({"input_features", "feature_attention_mask"})


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any):
    family = family_of(processor)
    if family is None:
        return None
    from .binding import bind

    return bind(family, processor, config, options)


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any, mm_processor_kwargs: Any):
    if family_of(processor) is None:
        return None
    from .inputs import rope_index_kwargs

    return rope_index_kwargs(multi_modal_inputs, mm_processor_kwargs)


@hookimpl
def batch_layout(processor: Any):
    if family_of(processor) is None:
        return None
    from mmrope_core import BatchLayout

    from .inputs import MEDIA_KEYS

    return BatchLayout(media=MEDIA_KEYS)


@hookimpl
def varlen_keys(processor: Any):
    return VARLEN_KEYS if family_of(processor) is not None else None


@hookimpl
def example_cases():
    from .examples import example_cases as cases

    return cases()
