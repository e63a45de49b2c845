"""Binding an Omni processor: its thinker config and token ids, and the implementation bound. The
fast implementation is the batched kernel (on the compiled loops, or numpy where they are
missing); it is checked against the installed thinker's ``get_rope_index`` (``reference``), which
is bound instead where it disagrees. The batched kernel also computes vLLM 0.33's positions
(``convention="vllm"``), and Qwen3-Omni's SGLang 0.5.23's (``convention="sglang"``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmrope_core import InvalidInputError, RopeBinding, UnknownConventionError, conventions
from mmrope_core.compiled import available
from mmrope_core.conventions import SGLANG_0_5_23, TRANSFORMERS, VLLM_0_33

from .agreement import agreeing_audio_rule
from .audio import VLLM_AUDIO_RULES
from .families import Family
from .fast import FastRopeIndex
from .reference import ReferenceRopeIndex
from .sglang import SGLANG_AUDIO_RULE

IMPLEMENTATIONS = ("fast", "reference")
#: The conventions each generation offers, and why it lacks one.
CONVENTIONS = {"Qwen3-Omni": (TRANSFORMERS, VLLM_0_33, SGLANG_0_5_23), "Qwen2.5-Omni": (TRANSFORMERS, VLLM_0_33)}
LACKING = {SGLANG_0_5_23: "SGLang 0.5.23 has no Qwen2.5-Omni model, so no rollout of it has SGLang's positions"}


def bind(family: Family, processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    implementation = options.get("implementation", "fast")
    if implementation not in IMPLEMENTATIONS:
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {family.name}; use "
                                f"one of {IMPLEMENTATIONS}")
    convention = conventions.convention(options, family.name, CONVENTIONS[family.name], LACKING)
    integer = bool(options.get("integer_positions", False))
    thinker = thinker_config(family, processor, config)
    ids = token_ids(processor)
    markers = {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]}
    kernel = FastRopeIndex
    name = "batched kernel"
    why = "" if available() else " (in numpy: the compiled loops are missing)"
    if convention != TRANSFORMERS:
        if implementation == "reference":
            raise UnknownConventionError(
                f"position convention {convention!r} has no reference implementation in {family.name}: "
                f"implementation='reference' is the installed transformers' own get_rope_index, whose positions are "
                f"the 'transformers' convention. Drop implementation='reference': the fast kernels compute "
                f"{convention!r}"
            )
        # no probe: there is no vLLM or SGLang here to agree with (the tests and benchmarks compare with their code)
        engine_rule = SGLANG_AUDIO_RULE if convention == SGLANG_0_5_23 else VLLM_AUDIO_RULES[family.float_positions]
        return RopeBinding("mrope", kernel(family, thinker, markers, engine_rule, convention=convention,
                                           release=conventions.asked(options)), "fast",
                           f"{family.name}, {name}{why}{conventions.described(conventions.asked(options))}")
    dtype = torch.float32 if family.float_positions and not integer else torch.int64
    note = ", integer positions (fractional positions truncated)" if family.float_positions and integer else ""
    rule = agreeing_audio_rule(family, thinker, markers, kernel)
    if implementation == "fast" and rule is not None:
        return RopeBinding("mrope", kernel(family, thinker, markers, rule, position_dtype=dtype), "fast",
                           f"{family.name}, {name}{why}{note}")
    why = "" if implementation == "reference" else f" (the {name} disagrees with this transformers)"
    return RopeBinding("mrope", ReferenceRopeIndex(family, thinker, markers, rule, dtype), "reference",
                       f"{family.name}, transformers reference{why}{note}")


def thinker_config(family: Family, processor: Any, config: Any) -> Any:
    """The thinker config (full model config or thinker config accepted; None: the default),
    completed with the vision start token the default configs lack."""
    import copy

    import transformers

    if config is None:
        config = transformers.AutoConfig.for_model(family.model_type)
    model_type = getattr(config, "model_type", None)
    if model_type == family.model_type:
        config = config.thinker_config
    elif model_type != family.thinker_model_type:
        raise InvalidInputError(
            f"{type(processor).__name__} belongs to {family.name}, whose configs have model_type "
            f"{family.model_type!r} (or {family.thinker_model_type!r} for the thinker), but the config "
            f"given has {model_type!r}. Pass the model's config or None"
        )
    config = copy.copy(config)
    ids = token_ids(processor)
    from_processor = {
        "vision_start_token_id": ids["vision_bos"],
        "image_token_id": ids["image"],
        "video_token_id": ids["video"],
        "audio_token_id": ids["audio"],
        "audio_start_token_id": ids["audio_bos"],
    }
    for key, value in from_processor.items():
        have = getattr(config, key, None)
        if have is None:
            setattr(config, key, value)
        elif have != value:
            raise InvalidInputError(
                f"the config's {key} is {have} but the processor's tokenizer uses {value}; "
                f"pass the config saved with this processor"
            )
    return config


def token_ids(processor: Any) -> dict[str, int]:
    """Ids of the processor's placeholder and marker tokens, from its tokenizer."""
    convert = processor.tokenizer.convert_tokens_to_ids
    names = ("image", "video", "audio", "vision_bos", "vision_eos", "audio_bos", "audio_eos")
    return {name: convert(getattr(processor, f"{name}_token")) for name in names}
