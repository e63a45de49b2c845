"""SGLang 0.5.23's Qwen3-Omni positions (``convention="sglang"``).

SGLang computes the thinker's float positions as transformers does (audio counted with encoder
windows of 50 mel frames, whatever the config says), then casts them to int64: a prefilled token
sits at ``trunc(position)``, a decoded one at ``index + trunc(delta)`` (see
:mod:`mmrope_core.rollout`). The batched kernel writes both in its one pass (a layout writing
truncated positions, and ``generated_mask``). Its processor calls them with
``use_audio_in_video=False``, so no rollout of it holds a video with its audio.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmrope_core import InvalidInputError

#: SGLang's ``_get_feat_extract_output_lengths`` chunks audio in windows of 100 mel frames.
SGLANG_AUDIO_RULE = "window_50"


def refuse_audio_in_video(inputs: Mapping[str, Any]) -> None:
    if inputs.get("use_audio_in_video") and inputs.get("video_grid_thw") is not None:
        raise InvalidInputError(
            "use_audio_in_video=True with videos: SGLang 0.5.23 computes Qwen3-Omni's positions with "
            "use_audio_in_video=False, so no rollout it sampled holds a video with its audio, and the sglang "
            "convention has no positions for one. Process these samples without use_audio_in_video, or use the "
            "transformers or vllm convention"
        )
