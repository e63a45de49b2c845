"""The thinker's keyword inputs: what the ``get_rope_index_kwargs`` hook picks from a processor's
outputs, and the checks and host conversions the reference and both kernels apply to them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmrope_core import InvalidInputError
from mmrope_core.media import read_grid, read_seconds

INPUT_KEYS = ("image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids", "use_audio_in_video")


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
        raise InvalidInputError("videos need second_per_grids (the processor's video_second_per_grid)")
    read_seconds("second_per_grids", second_per_grids, videos=video_grid_thw.shape[0])


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


def host_batch(input_ids: Any, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The token ids as int64 and the mask as bool, contiguous on the host (the reference takes
    a token where the mask is 1)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InvalidInputError(f"input_ids must be a (B, L) tensor, got {type(input_ids).__name__} "
                                f"{tuple(getattr(input_ids, 'shape', ()))}")
    ids = input_ids
    if ids.dtype is not torch.int64 or not ids.is_cpu or not ids.is_contiguous():
        ids = ids.to(device="cpu", dtype=torch.int64).contiguous()
    if attention_mask is not None:
        attention_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 1
        if not attention_mask.is_cpu or not attention_mask.is_contiguous():
            attention_mask = attention_mask.cpu().contiguous()
    return ids, attention_mask


def host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens) -> tuple[Any, Any, Any, Any]:
    """The image and video grids, the seconds per video grid and the audio mel frames as host
    arrays (or None), their shapes and counts checked in the batched kernel's order."""
    videos = _host_grid("video_grid_thw", video_grid_thw)
    seconds = None
    if videos is not None:
        second_per_grids = seconds_tensor(second_per_grids)
        _check_seconds_count(second_per_grids, video_grid_thw)
        seconds = _host(second_per_grids, torch.float32)
    frames = None if audio_seqlens is None else _host(torch.as_tensor(audio_seqlens), torch.int64)
    return _host_grid("image_grid_thw", image_grid_thw), videos, seconds, frames


def _host_grid(key: str, grid: Any) -> np.ndarray | None:
    # read as the engine reads it (an integer (N, 3) grid of positive sizes), for kernels called directly
    grid = read_grid(key, grid)
    return None if grid is None else _host(grid, torch.int64)


def _host(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``tensor``'s values as a contiguous numpy array of ``dtype`` on the host, without a copy
    when it is one (each check here costs a fraction of a conversion's microsecond)."""
    if tensor.dtype is dtype and tensor.is_cpu and not tensor.requires_grad and tensor.is_contiguous():
        return tensor.numpy()
    return tensor.detach().to(device="cpu", dtype=dtype).contiguous().numpy()


def _check_seconds_count(second_per_grids: torch.Tensor | None, video_grid_thw: torch.Tensor) -> None:
    if second_per_grids is None or second_per_grids.numel() != video_grid_thw.shape[0]:
        check_seconds(second_per_grids, video_grid_thw)


def packed_segments(cu_seqlens: Any, shape: tuple[int, int], mask: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """The first token and the length of each segment of one packed row."""
    if shape[0] != 1 or (mask is not None and not bool(mask.all())):
        raise InvalidInputError(f"cu_seqlens describes one packed (1, L) row without padding, got a batch of shape "
                                f"{tuple(shape)}{' with padding' if mask is not None else ''}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
        raise InvalidInputError("cu_seqlens must be a 1-D integer tensor (K + 1,) of segment boundaries")
    bounds = _host(cu_seqlens, torch.int64)
    count = np.diff(bounds)
    if bounds.size < 2 or bounds[0] != 0 or bounds[-1] != shape[1] or count.min() <= 0:
        raise InvalidInputError(f"cu_seqlens must increase from 0 to the row length {shape[1]}, got {bounds.tolist()}")
    return np.ascontiguousarray(bounds[:-1]), count
