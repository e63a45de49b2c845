"""The kernel's common case on the CPU in one compiled call (``mmrope_core._native.mrope_fused``).

The step-by-step path builds token types, finds the runs and spans, matches grids and works out
temporal ids in a dozen numpy and torch steps, each costing microseconds on a single sample. The
compiled call does all of it in one read of the token ids and writes the positions. It hands back
a status for anything off the common case (placeholders and grids that disagree, padding inside a
sample, an unusual dtype, layout or scale); the step-by-step path then runs as it would have and
raises its typed errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..compiled import native
from ._family import MropeFamily
from ._media import BetweenMarkersTypes, MediaKind, TokenTypeMap

# what native.mrope_fused returns
WRITTEN, MISMATCH, PADDING_INSIDE, UNUSUAL = range(4)

_IDS = (torch.int64, torch.int32)
_SECONDS = (torch.float32, torch.float64)
_PRECISIONS = {"float32": 0, "float64": 1, "seconds": 2}  # the compiled call's


class FusedPositions:
    """The compiled call for one kernel's family, kinds and token types; :meth:`__call__`
    returns None where the step-by-step path is to run."""

    def __init__(self, family: MropeFamily, kinds: tuple[MediaKind, ...], token_types: Any) -> None:
        self.token_types = token_types
        self.spec = _spec(family, kinds, token_types)
        self.keys = family.keys

    @classmethod
    def of(cls, family: MropeFamily, kinds: tuple[MediaKind, ...], token_types: Any) -> FusedPositions | None:
        """None where the call cannot stand in for the step-by-step path: no compiled loops, or
        token types or kinds other than the family's own."""
        if native is None or _spec(family, kinds, token_types) is None:
            return None
        return cls(family, kinds, token_types)

    def __call__(self, text_row: bool, input_ids: Any, mask: torch.Tensor | None, cu_seqlens: Any,
                 inputs: dict[str, Any]) -> Any:
        if not (isinstance(input_ids, torch.Tensor) and input_ids.is_cpu and input_ids.dtype in _IDS
                and input_ids.dim() == 2 and input_ids.is_contiguous()):
            return None
        batch, length = input_ids.shape
        if mask is not None and not (mask.is_cpu and mask.shape == input_ids.shape and mask.is_contiguous()):
            return None
        bounds = None
        if cu_seqlens is not None:
            if not (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.is_cpu and cu_seqlens.dtype == torch.int64
                    and cu_seqlens.dim() == 1 and cu_seqlens.shape[0] >= 2 and cu_seqlens.is_contiguous()):
                return None
            bounds = cu_seqlens.numpy()
        image_key, video_key, seconds_key = self.keys
        images = _grid(inputs.get(image_key))
        videos = _grid(inputs.get(video_key)) if video_key is not None else None
        if images is False or videos is False:
            return None
        seconds = None
        if seconds_key is not None and videos is not None:
            seconds = inputs.get(seconds_key)
            if seconds is not None:
                if not (isinstance(seconds, torch.Tensor) and seconds.is_cpu and seconds.dtype in _SECONDS):
                    return None
                seconds = seconds.detach().reshape(-1).contiguous().numpy()
        samples = batch if bounds is None else bounds.shape[0] - 1
        # numpy allocates a third as long as torch.empty on a single sample; torch shares the memory
        out = np.empty((batch, 4, length) if text_row else (3, batch, length), dtype=np.int64)
        deltas = None if text_row else np.empty((samples, 1), dtype=np.int64)
        status = native.mrope_fused(  # type: ignore[union-attr]
            out, deltas, text_row, input_ids.numpy(), input_ids.element_size(), batch, length,
            None if mask is None else mask.numpy(), bounds, (images,) if video_key is None else (images, videos),
            seconds, self.spec, torch.get_num_threads())
        if status != WRITTEN:
            return None
        positions = torch.from_numpy(out)
        if text_row:
            return positions
        return (positions if input_ids.dtype == torch.int64 else positions.to(input_ids.dtype)), torch.from_numpy(deltas)


def _grid(value: Any) -> Any:
    """A grid as the compiled call reads it: None, an int64 (N, 3) array, or False where the
    step-by-step path is to read it (and refuse it where it must)."""
    if value is None:
        return None
    if not (isinstance(value, torch.Tensor) and value.is_cpu and value.dtype == torch.int64 and value.dim() == 2
            and value.shape[1] == 3 and value.is_contiguous()):
        return False
    return value.numpy()


def _spec(family: MropeFamily, kinds: tuple[MediaKind, ...], token_types: Any) -> tuple | None:
    """The call's constants: the token types (as token ids and types, or a placeholder between markers), the
    merge size, the kinds and the temporal rule's fields; None where the call does not apply."""
    if type(token_types) is TokenTypeMap:
        if len(token_types.types) > native.MAX_MEDIA_TOKENS:  # type: ignore[union-attr]
            return None
        tokens, types, markers = tuple(token_types.types), tuple(token_types.types.values()), None
    elif type(token_types) is BetweenMarkersTypes:
        tokens, types = (), ()
        markers = (token_types.token, token_types.begin, token_types.end)
        if not all(type(token) is int and 0 <= token < 2**63 for token in markers):
            return None
    else:
        return None
    if kinds != family.kinds:
        return None
    rule = family.temporal
    per_second = None if rule is None else rule.per_second
    # a scale numpy works out in float32 or float64 (or int64): a Python number of moderate size
    if per_second is not None and not abs(per_second) < 2**24:
        return None
    kind_specs = [(1, False, False)]
    if family.has_video:
        kind_specs.append((2, family.per_frame_video, rule is not None))
        if family.per_frame_video and rule is not None:
            return None  # the step-by-step path decides what such a family means
    if rule is None:
        return (tokens, types, markers, family.spatial_merge_size, tuple(kind_specs), None, False, 0, False,
                family.resume_past_frames)
    return (tokens, types, markers, family.spatial_merge_size, tuple(kind_specs), per_second,
            rule.order == "frame_first", _PRECISIONS[rule.precision], rule.whole_seconds, family.resume_past_frames)
