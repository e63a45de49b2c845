"""mmrope plugin for Gemma4: 1-D RoPE, relaxed input validation, per-sample varying keys."""

from __future__ import annotations

from typing import Any

from mmrope_core import RopeBinding, ValidationPolicy, hookimpl
from mmrope_core.recognition import class_name_in

PROCESSOR_CLASSES = ("Gemma4Processor",)

#: Keys of a Gemma4 batch whose size varies per sample beyond the batch dimension.
VARLEN_KEYS = frozenset({"mm_token_type_ids", "input_features", "input_features_mask"})

RELAXED_REASON = (
    "trainers re-run the processor on text whose image placeholders were collapsed or removed, "
    "so the per-sample placeholder count is not compared with the images; the audio-token check "
    "applies only when audio is given"
)


def is_gemma4(processor: Any) -> bool:
    return class_name_in(processor, PROCESSOR_CLASSES) is not None


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any):
    if not is_gemma4(processor):
        return None
    from mmrope_core.conventions import KNOWN, convention

    convention(options, "Gemma4", KNOWN)  # 1-D positions: vLLM's are transformers'
    # whether its image tokens' mask keeps packed segments apart is measured by the core
    return RopeBinding(kind="1d", implementation="mask", description="Gemma4: 1-D RoPE, positions from the attention mask")


@hookimpl
def validate_inputs_policy(processor: Any):
    if not is_gemma4(processor):
        return None
    from .validation import validate_relaxed

    return ValidationPolicy(strict=False, validate=validate_relaxed, reason=RELAXED_REASON)


@hookimpl
def varlen_keys(processor: Any):
    return VARLEN_KEYS if is_gemma4(processor) else None


@hookimpl
def example_cases():
    from .examples import example_cases as cases

    return cases()
