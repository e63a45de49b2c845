"""mmrope plugin for the Qwen-VL family: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (and MoE), Qwen3.5 (and
MoE), GLM-4V (and MoE) and GLM-4.6V.

Recognises processors by class (their own or a base class). transformers is imported only
inside the hooks, so discovering this plugin is cheap.
"""

from __future__ import annotations

from typing import Any

from mmrope_core import hookimpl

from .families import FAMILIES, Family, family_of, media_keys

PROCESSOR_CLASSES = tuple(FAMILIES)
MODEL_TYPES = frozenset(model_type for family in FAMILIES.values() for model_type in family.models)


def _bound_family(processor: Any, config: Any) -> Family | None:
    family = family_of(processor)
    if family is None or getattr(config, "model_type", None) not in (None, *MODEL_TYPES):
        # a model type of no family here (Qwen4-exp and Cosmos3-Omni share Qwen3VLProcessor): another plugin's
        return None
    return family


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any):
    family = _bound_family(processor, config)
    if family is None:
        return None
    from .rope import bind

    return bind(family, processor, config, options)


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any):
    family = family_of(processor)
    if family is None:
        return None
    return {key: value for key in media_keys(family) if (value := multi_modal_inputs.get(key)) is not None}


@hookimpl
def batch_layout(processor: Any, config: Any):
    family = _bound_family(processor, config)
    if family is None:
        return None
    from mmrope_core import BatchLayout

    return BatchLayout(media=media_keys(family))


@hookimpl
def varlen_keys(processor: Any):
    # the processor returns one token type per token; kernels build their own, trainers batch them
    return {"mm_token_type_ids"} if family_of(processor) is not None else None


@hookimpl
def example_cases():
    from .examples import example_cases as cases

    return cases()
