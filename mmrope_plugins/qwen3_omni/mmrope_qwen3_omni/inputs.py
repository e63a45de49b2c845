"""The thinker's keyword inputs: what the ``get_rope_index_kwargs`` hook picks from a processor's
outputs, and the checks and host conversions the reference and both kernels apply to them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmrope_core import InvalidInputError
from mmrope_core.batching import IMAGE_GRID, VIDEO_GRID, MediaKey
from mmrope_core.media import read_seconds

INPUT_KEYS = ("image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids", "use_audio_in_video")
_SECONDS = MediaKey(role="seconds", grid="video_grid_thw")
#: What the processor's outputs and the thinker's inputs hold, as the engine reads them.
MEDIA_KEYS = {"image_grid_thw": IMAGE_GRID, "video_grid_thw": VIDEO_GRID, "second_per_grids": _SECONDS,
              "video_second_per_grid": _SECONDS, "audio_seqlens": MediaKey(role="audio_lengths"),
              "feature_attention_mask": MediaKey(role="audio_mask")}


def rope_index_kwargs(multi_modal_inputs: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``audio_seqlens`` from ``feature_attention_mask``, the video timing and ``use_audio_in_video``."""
    kwargs: dict[str, Any] = {}
    for key in ("image_grid_thw", "video_grid_thw"):
        if multi_modal_inputs.get(key) is not None:
            kwargs[key] = multi_modal_inputs[key]
    mask = multi_modal_inputs.get("feature_attention_mask")
    if mask is not None:
        kwargs["audio_seqlens"] = _frames_per_audio(mask)
    seconds = multi_modal_inputs.get("second_per_grids", multi_modal_inputs.get("video_second_per_grid"))
    if seconds is not None:
        kwargs["second_per_grids"] = seconds if isinstance(seconds, torch.Tensor) else torch.tensor(seconds, dtype=torch.float32)
    use = mm_processor_kwargs.get("use_audio_in_video", mm_processor_kwargs.get("load_audio_from_video"))
    if use is not None:
        kwargs["use_audio_in_video"] = bool(use)
    return kwargs


def _frames_per_audio(mask: torch.Tensor) -> torch.Tensor:
    """Each audio's mel frames, ``feature_attention_mask.sum(-1)`` (int64); on the CPU in numpy,
    whose integer sums take a third of torch's on a batch's masks."""
    if mask.is_cpu and mask.dtype in (torch.int32, torch.int64, torch.bool, torch.int8, torch.uint8):
        return torch.from_numpy(mask.numpy().sum(-1, dtype=np.int64))
    return mask.sum(-1)


def refuse_unknown(unknown: Mapping[str, Any]) -> None:
    """The thinker's ``get_rope_index`` takes no other keyword: neither do its kernels."""
    if unknown:
        raise InvalidInputError(
            f"get_rope_index got {', '.join(map(repr, sorted(unknown)))}, which the Omni thinker's get_rope_index "
            f"does not take; it takes {', '.join(map(repr, INPUT_KEYS))}"
        )


def seconds_tensor(value: Any) -> torch.Tensor | None:
    """``second_per_grids`` as a tensor (a list becomes float32); None stays None."""
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float32)


def check_seconds(second_per_grids: torch.Tensor | None, video_grid_thw: torch.Tensor) -> None:
    if second_per_grids is None:
        # as the batched kernel says it (mmrope_core.items)
        raise InvalidInputError("videos need second_per_grids (seconds per grid), one per video in video_grid_thw")
    read_seconds("second_per_grids", second_per_grids, videos=video_grid_thw.shape[0], grid="video_grid_thw")


def valid_tokens(mask_row: torch.Tensor) -> slice | torch.Tensor:
    """The valid tokens of one sample: a slice when they form one span (left or right padding),
    which indexes far faster than the mask itself."""
    flags = mask_row.view(torch.int8) if mask_row.dtype == torch.bool else mask_row
    count = int(flags.sum())
    if count == 0:
        return slice(0, 0)
    first = int(flags.argmax())
    if int(flags[first : first + count].sum()) == count:
        return slice(first, first + count)
    return mask_row.bool()


def mask_or_ones(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    # the Qwen3-Omni reference cannot run without a mask
    return torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
