"""What a family tells the kernel about its media: kinds, grids, and token types from ids."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch

from ..compiled import native


@dataclasses.dataclass(frozen=True)
class MediaKind:
    """One kind of media placeholder.

    Attributes:
        type_id: its value in the token-type tensor (1 image, 2 video, ...).
        name: what errors call one item (``"image"``, ``"video frame"``).
        token: the placeholder token's text, for error messages.
        grid_key: the input key holding its grids, for error messages.
    """

    type_id: int
    name: str
    token: str
    grid_key: str


@dataclasses.dataclass(frozen=True)
class MediaGrids:
    """The grids of one media kind for a batch, in order of appearance.

    Attributes:
        grid: ``(N, 3)`` integer tensor of ``(t, h, w)`` patch counts before merging.
        temporal_scale: optional ``(N,)`` tensor or numpy array; temporal ids become
            ``trunc(frame * scale)``, computed in the dtype torch gives int64 frame numbers times
            the scale, exactly as the reference does. None means ``frame``.
    """

    grid: torch.Tensor
    temporal_scale: torch.Tensor | np.ndarray | None = None


class TokenTypeMap:
    """Builds ``mm_token_type_ids`` from ``input_ids``: each listed token id becomes its media
    type, every other token 0 (text). Returns int8, the dtype :func:`mrope_positions` works in.

    Example: ``TokenTypeMap({image_token_id: 1, video_token_id: 2})``.
    """

    def __init__(self, types: Mapping[int, int]) -> None:
        if any(not 0 < media_type < 128 for media_type in types.values()):
            raise ValueError(f"media types must be between 1 and 127, got {dict(types)}")
        if any(not isinstance(token, int) or not 0 <= token < 2**31 for token in types):
            raise ValueError(f"token ids must be between 0 and 2**31 - 1, got {list(types)}")
        self.types = dict(types)

    def __call__(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """The types of ``input_ids``; ``cu_seqlens`` changes nothing (a token's type does not
        depend on the tokens before it)."""
        if not self.types:
            return torch.zeros(input_ids.shape, dtype=torch.int8, device=input_ids.device)
        if input_ids.device.type == "cpu":
            return self._on_cpu(input_ids)
        # In-place comparisons on an int32 copy are several times faster than comparisons that
        # produce bool, and the ids are read once. Ids that do not fit int32 are no token of any
        # vocabulary; they are read modulo 2**32.
        ids = input_ids.to(torch.int32, copy=True)
        types = None
        *first, last = self.types.items()
        for token, media_type in (*first, last):
            match = ids.eq_(token) if (token, media_type) == last else ids.clone().eq_(token)
            if types is None:
                types = match.mul_(media_type) if media_type != 1 else match
            else:
                types.add_(match, alpha=media_type)
        assert types is not None  # self.types is not empty here
        return types.to(torch.int8)

    def _on_cpu(self, input_ids: torch.Tensor) -> torch.Tensor:
        if native is not None and input_ids.dtype in _NATIVE_IDS and len(self.types) <= native.MAX_MEDIA_TOKENS:  # each id read once
            ids = input_ids.contiguous().numpy()
            types = torch.empty(input_ids.shape, dtype=torch.int8)
            batch, length = ids.shape if ids.ndim == 2 else (1, ids.size)
            native.token_types(ids, ids.itemsize, batch, length, tuple(self.types), tuple(self.types.values()),
                                types.numpy(), torch.get_num_threads())
            return types
        ids = input_ids.numpy()  # numpy compares several times faster than torch, each id read once per token
        found: np.ndarray | None = None
        for token, media_type in self.types.items():
            match = (ids == token).view(np.int8)
            if media_type != 1:
                match *= media_type
            found = match if found is None else np.add(found, match, out=found)
        return torch.from_numpy(found)

    def __repr__(self) -> str:
        return f"TokenTypeMap({self.types})"


_NATIVE_IDS = (torch.int64, torch.int32)


class BetweenMarkersTypes:
    """Token types of one placeholder whose type switches with marker tokens: ``token`` is type 2
    where more ``begin`` than ``end`` markers precede it in its row, else type 1; other tokens
    are 0. With ``cu_seqlens`` the markers are counted from each segment's first token, so a
    marker a segment leaves open does not switch the next segment's placeholders. Returns int8."""

    def __init__(self, token: int, begin: int, end: int) -> None:
        self.token, self.begin, self.end = token, begin, end

    def __call__(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.device.type == "cpu":  # numpy compares several times faster than torch here
            ids = input_ids.numpy()
            found, opened = ids == self.token, ids == self.begin
            if not opened.any():  # no marker opens: every placeholder is type 1
                return torch.from_numpy(found.view(np.int8))
            markers_np = opened.view(np.int8) - (ids == self.end).view(np.int8)
            placeholders, markers = torch.from_numpy(found), torch.from_numpy(markers_np)
        else:
            placeholders = input_ids == self.token
            markers = (input_ids == self.begin).to(torch.int8) - (input_ids == self.end).to(torch.int8)
        open_markers = markers.cumsum(dim=1)  # one cumsum of the difference, not one per marker
        if cu_seqlens is not None:
            open_markers = _from_each_segment_start(open_markers, cu_seqlens)
        return placeholders.view(torch.int8) + (placeholders & (open_markers > 0)).view(torch.int8)

    def __repr__(self) -> str:
        return f"BetweenMarkersTypes(token={self.token}, begin={self.begin}, end={self.end})"


def _from_each_segment_start(counts: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """A packed row's running ``counts`` as each segment alone counts them: less the count the
    segments before it reached."""
    bounds = cu_seqlens.to(device=counts.device, dtype=torch.int64)
    reached = counts[0, bounds[1:-1] - 1]
    if not bool(reached.any()):  # every segment closes what it opens (a row of whole samples)
        return counts
    before = torch.cat((reached.new_zeros(1), reached))
    return counts - torch.repeat_interleave(before, bounds.diff()).unsqueeze(0)
