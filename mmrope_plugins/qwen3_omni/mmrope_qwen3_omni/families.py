"""The Omni processors this plugin recognises and their reference model classes."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrope_core.recognition import class_name_in


@dataclasses.dataclass(frozen=True)
class Family:
    """What differs between the two Omni generations.

    Attributes:
        name: shown in listings and errors.
        module, reference_class: where the thinker's ``get_rope_index`` lives in transformers.
        model_type, thinker_model_type: accepted config types (full model or thinker).
        float_positions: the reference returns float32 positions (Qwen3-Omni), else int64.
    """

    name: str
    module: str
    reference_class: str
    model_type: str
    thinker_model_type: str
    float_positions: bool


FAMILIES: dict[str, Family] = {
    "Qwen3OmniMoeProcessor": Family(
        "Qwen3-Omni", "qwen3_omni_moe", "Qwen3OmniMoePreTrainedModelForConditionalGeneration",
        "qwen3_omni_moe", "qwen3_omni_moe_thinker", float_positions=True,
    ),
    "Qwen2_5OmniProcessor": Family(
        "Qwen2.5-Omni", "qwen2_5_omni", "Qwen2_5OmniPreTrainedModelForConditionalGeneration",
        "qwen2_5_omni", "qwen2_5_omni_thinker", float_positions=False,
    ),
}


def family_of(processor: Any) -> Family | None:
    name = class_name_in(processor, FAMILIES)
    return None if name is None else FAMILIES[name]
