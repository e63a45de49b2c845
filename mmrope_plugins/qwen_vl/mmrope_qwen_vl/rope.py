"""Binding a Qwen-VL processor: the core's batched kernel for its family, or the transformers
reference where the installed release computes positions another way."""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Mapping
from typing import Any

from mmrope_core import InvalidInputError, RopeBinding
from mmrope_core.conventions import TRANSFORMERS
from mmrope_core.mrope import MropeFamily, MropeKernel, bind_mrope
from mmrope_core.reference import ReferenceKernel
from mmrope_core.temporal import TemporalRule

from .families import IMAGE_KEY, ROLLOUT_RULES, SECONDS_KEY, TRANSFORMERS_RULES, VIDEO_KEY, Family


def bind(family: Family, processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    config = _resolve_config(family, processor, config)
    described = describe(family, processor, config)
    module, name = family.models[config.model_type]
    model_class = getattr(importlib.import_module(f"transformers.models.{module}"), name)
    reference = ReferenceKernel(model_class, config, token_types=described.token_types(),
                                check=MropeKernel(described).check)
    return bind_mrope(described, reference, options, conventions=(TRANSFORMERS, *ROLLOUT_RULES),
                      variants=rollout_variants(described), rules=TRANSFORMERS_RULES)


def rollout_variants(described: MropeFamily) -> dict[str, MropeFamily]:
    """The family as each rollout engine computes it (see :data:`.families.ROLLOUT_RULES`); the
    temporal rule matters only where videos are timed."""
    timed = described.temporal
    return {
        name: dataclasses.replace(
            described, resume_past_frames=rule.resume_past_frames,
            temporal=None if timed is None else dataclasses.replace(rule.temporal, per_second=timed.per_second),
        )
        for name, rule in ROLLOUT_RULES.items()
    }


def describe(family: Family, processor: Any, config: Any) -> MropeFamily:
    """What the batched kernel needs to know of this processor and config."""
    vision = config.vision_config
    markers = (processor.video_start_id, processor.video_end_id) if family.video_inside_markers else None
    temporal = _timed(vision) if family.timed_video else None
    return MropeFamily(
        family.name,
        spatial_merge_size=int(vision.spatial_merge_size),
        image_token_id=processor.image_token_id,
        video_token_id=None if markers else processor.video_token_id,
        image_token=processor.image_token,
        video_token=processor.video_token,
        temporal=temporal,
        per_frame_video=family.per_frame_video,
        video_markers=markers,
        image_key=IMAGE_KEY,
        video_key=VIDEO_KEY,
        seconds_key=SECONDS_KEY if temporal is not None else None,
    )


def _timed(vision: Any) -> TemporalRule | None:
    """The rule of transformers' latest release at the config's ``tokens_per_second`` (the probe
    tries the others), or None where the config has none."""
    per_second = getattr(vision, "tokens_per_second", None)
    if not isinstance(per_second, (int, float)) or isinstance(per_second, bool) or not (
            math.isfinite(per_second) and per_second >= 0):
        return None  # no rule fits such a config: the probe finds the kernel unlike the reference, which is bound
    return dataclasses.replace(TRANSFORMERS_RULES[0], per_second=per_second)


def _resolve_config(family: Family, processor: Any, config: Any) -> Any:
    if config is None:
        from transformers import AutoConfig

        # The family's default config, with the merge size the processor really uses.
        config = AutoConfig.for_model(family.default_model_type)
        merge = getattr(getattr(processor, "image_processor", None), "merge_size", None)
        if merge is not None:
            config.vision_config.spatial_merge_size = merge
        return config
    model_type = getattr(config, "model_type", None)
    if model_type not in family.models:
        raise InvalidInputError(
            f"{type(processor).__name__} belongs to {family.name}, whose configs have model_type "
            f"{sorted(family.models)}, but the config given has model_type {model_type!r}. "
            f"Pass the model's top-level config (AutoConfig.from_pretrained) or None"
        )
    return config
