"""The processors this plugin recognises and the model classes whose reference it matches."""

from __future__ import annotations

import dataclasses
from typing import Any

from mmrope_core.batching import IMAGE_GRID, VIDEO_GRID, MediaKey
from mmrope_core.conventions import SGLANG_0_5_23, VLLM_0_33
from mmrope_core.recognition import class_name_in
from mmrope_core.temporal import TemporalRule

#: The processors' keys of the images' and videos' grids and of a timed video's seconds per grid.
IMAGE_KEY, VIDEO_KEY, SECONDS_KEY = "image_grid_thw", "video_grid_thw", "second_per_grid_ts"

#: What the family's media keys hold, as the engine reads them: its grids, one per image or video,
#: and a timed family's seconds, one per video.
MEDIA_KEYS = {IMAGE_KEY: IMAGE_GRID, VIDEO_KEY: VIDEO_GRID}
TIMED_MEDIA_KEYS = {**MEDIA_KEYS, SECONDS_KEY: MediaKey(role="seconds", grid=VIDEO_KEY)}

#: How transformers releases time videos: ``trunc(f * (tokens_per_second * s))`` in the seconds'
#: dtype (>= 5.11), and the same with the seconds truncated first (5.10); the probe tries them in
#: this order, each at the config's ``tokens_per_second``.
TRANSFORMERS_RULES = (TemporalRule(precision="seconds"), TemporalRule(precision="seconds", whole_seconds=True))


@dataclasses.dataclass(frozen=True)
class RolloutRule:
    """How a rollout engine computes these families' positions where transformers differs.

    Attributes:
        resume_past_frames: the text after a run resumes one past its largest position on any axis.
        temporal: how a timed video's temporal ids are formed (taken at the config's
            ``tokens_per_second``).
    """

    resume_past_frames: bool
    temporal: TemporalRule


#: The rollout engines' rules for every family here (Qwen3-VL's and GLM's equal transformers' but
#: for resuming; SGLang runs Qwen3.5 by Qwen3-VL's rules, GLM-4.6V by GLM-4V's).
ROLLOUT_RULES: dict[str, RolloutRule] = {
    # vLLM multiplies in float64 whatever the seconds' dtype
    VLLM_0_33: RolloutRule(resume_past_frames=True, temporal=TemporalRule(precision="float64")),
    # SGLang multiplies each frame number by the seconds first, then by tokens_per_second
    SGLANG_0_5_23: RolloutRule(resume_past_frames=True,
                               temporal=TemporalRule(order="frame_first", precision="seconds")),
}


@dataclasses.dataclass(frozen=True)
class Family:
    """What differs between members of the Qwen-VL family.

    Attributes:
        name: shown in listings and errors.
        models: config ``model_type`` -> ``(transformers module, model class)`` of the reference.
        timed_video: video temporal ids are scaled by ``tokens_per_second * second_per_grid_ts``.
        per_frame_video: each video frame is its own placeholder run (timestamps between frames).
        video_inside_markers: videos reuse the image token between begin/end-of-video markers.
    """

    name: str
    models: dict[str, tuple[str, str]]
    timed_video: bool = False
    per_frame_video: bool = False
    video_inside_markers: bool = False

    @property
    def default_model_type(self) -> str:
        return next(iter(self.models))


_QWEN3 = {
    "qwen3_vl": ("qwen3_vl", "Qwen3VLModel"),
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeModel"),
    "qwen3_5": ("qwen3_5", "Qwen3_5Model"),
    "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoeModel"),
}

FAMILIES: dict[str, Family] = {
    "Qwen2VLProcessor": Family("Qwen2-VL", {"qwen2_vl": ("qwen2_vl", "Qwen2VLModel")}),
    "Qwen2_5_VLProcessor": Family(
        "Qwen2.5-VL", {"qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLModel")}, timed_video=True
    ),
    "Qwen3VLProcessor": Family("Qwen3-VL", _QWEN3, per_frame_video=True),
    "Glm4vProcessor": Family(
        "GLM-4V",
        {"glm4v": ("glm4v", "Glm4vModel"), "glm4v_moe": ("glm4v_moe", "Glm4vMoeModel")},
        per_frame_video=True,
        video_inside_markers=True,
    ),
    "Glm46VProcessor": Family(
        "GLM-4.6V", {"glm46v": ("glm46v", "Glm46VModel")}, per_frame_video=True, video_inside_markers=True
    ),
}


def family_of(processor: Any) -> Family | None:
    """The family of ``processor`` by its class or the first base class this plugin knows."""
    name = class_name_in(processor, FAMILIES)
    return None if name is None else FAMILIES[name]


def media_keys(family: Family) -> dict[str, MediaKey]:
    """The media keys ``family``'s kernel reads, by what they hold."""
    return TIMED_MEDIA_KEYS if family.timed_video else MEDIA_KEYS
