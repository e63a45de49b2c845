"""Packed rows: several samples in one row, described by ``cu_seqlens`` (THD layout) or by
per-token ``segment_ids`` ("neat packing"). Each segment is computed as the sample it was:
positions restart at 0 and media grids are consumed in order across segments."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import torch

from .errors import InvalidInputError


@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """Where each segment of a packed batch lies.

    Attributes:
        shape: ``(B, L)`` of the packed batch.
        lengths: ``(K,)`` tokens per segment, in order (row by row).
        starts: ``(K,)`` flat index (``row * L + column``) of each segment's first token.
        device: where the batch's tensors are.
        tokens: flat index of every token that belongs to a segment, or None when the segments
            cover the batch back to back (``cu_seqlens``, or segment ids without padding).
        longest: the most tokens in a segment.
        uniform: all segments have the same length: unpacking is a reshape, and every slot of
            the unpacked batch holds a token.
    """

    shape: tuple[int, int]
    lengths: np.ndarray
    starts: np.ndarray
    device: torch.device
    tokens: torch.Tensor | None = None
    longest: int = dataclasses.field(init=False)
    uniform: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # worked out here, where every call needs them (a cached_property takes a lock per read)
        longest = int(self.lengths.max())
        object.__setattr__(self, "longest", longest)
        object.__setattr__(self, "uniform", int(self.lengths.min()) == longest)

    @property
    def segments(self) -> int:
        return self.lengths.size

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: Any, shape: tuple[int, int], device: torch.device) -> PackedLayout:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
            raise InvalidInputError("cu_seqlens must be a 1-D integer tensor (K + 1,) of segment boundaries")
        if shape[0] != 1:
            raise InvalidInputError(f"cu_seqlens describes one packed (1, T) row, got input_ids of shape {shape}; "
                                    f"use segment_ids for packed batches of several rows")
        bounds = cu_seqlens.cpu().numpy().astype(np.int64, copy=False)
        if bounds.size < 2 or bounds[0] != 0 or bounds[-1] != shape[1]:
            raise InvalidInputError(f"cu_seqlens must start at 0 and end at the row length {shape[1]}, got "
                                    f"{bounds.tolist()[:3]}...{bounds.tolist()[-2:]}; cover the whole row")
        steps = bounds[1:] - bounds[:-1]
        if steps.min() <= 0:
            k = int(np.flatnonzero(steps <= 0)[0])
            raise InvalidInputError(f"cu_seqlens is not increasing at segment {k}: {int(bounds[k])} then "
                                    f"{int(bounds[k + 1])}; every segment needs at least one token")
        return cls(tuple(shape), steps, bounds[:-1], device)

    @classmethod
    def from_segment_ids(cls, segment_ids: Any, shape: tuple[int, int]) -> PackedLayout:
        if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype.is_floating_point:
            raise InvalidInputError("segment_ids must be an integer tensor (B, L): 0 for padding, 1..K per segment")
        ids = segment_ids.reshape(shape) if segment_ids.dim() == 1 and shape[0] == 1 else segment_ids
        if tuple(ids.shape) != tuple(shape):
            raise InvalidInputError(f"segment_ids has shape {tuple(segment_ids.shape)} but input_ids has {tuple(shape)}")
        ids = ids.long()
        if bool((ids < 0).any()):
            raise InvalidInputError("segment_ids must not be negative: 0 marks padding, 1..K the segments")
        rows, length = shape
        valid = ids > 0
        # a segment starts where the id changes to a non-zero value; ids must then read 1, 2, 3, ...
        previous = torch.cat([torch.zeros(rows, 1, dtype=ids.dtype), ids[:, :-1]], dim=1)
        starts = valid & (ids != previous)
        expected = starts.long().cumsum(dim=1)
        wrong = valid & (ids != expected)
        if bool(wrong.any()):
            row, column = (int(v) for v in wrong.nonzero()[0])
            raise InvalidInputError(
                f"segment_ids of row {row} are not contiguous and numbered 1, 2, ... in order: token {column} "
                f"holds segment {int(ids[row, column])} where segment {int(expected[row, column])} was expected; "
                f"each segment must be one span, and segments must follow each other in order"
            )
        counts = expected[:, -1] if length else torch.zeros(rows, dtype=torch.long)
        first_segment = counts.cumsum(0) - counts
        tokens = valid.view(-1).nonzero().squeeze(1)
        segment = (first_segment[:, None] + ids - 1).view(-1)[tokens]
        lengths = torch.bincount(segment, minlength=int(counts.sum()))
        if lengths.numel() == 0:
            raise InvalidInputError("segment_ids marks no token as part of a segment")
        first_token = starts.view(-1).nonzero().squeeze(1)
        return cls(tuple(shape), lengths.cpu().numpy(), first_token.cpu().numpy(), ids.device,
                   None if tokens.numel() == rows * length else tokens)

    def unpacked_mask(self) -> torch.Tensor:
        """``(K, longest)`` bool: the slots of the unpacked batch that hold a token."""
        lengths = torch.from_numpy(self.lengths).to(self.device)
        return torch.arange(self.longest, device=self.device) < lengths[:, None]

    @functools.cached_property
    def _first_token(self) -> np.ndarray:
        """Where each segment begins among the segments' tokens, counted in packed order."""
        return np.add.accumulate(self.lengths) - self.lengths

    @functools.cached_property
    def _slots(self) -> np.ndarray:
        """The slot of the unpacked batch, flat (``k * longest + column``), that each token of the
        segments takes, in packed order; unpacking and packing back read these once."""
        shift = np.arange(self.segments) * self.longest - self._first_token
        return shift.repeat(self.lengths) + np.arange(int(self.lengths.sum()))

    def unpack(self, values: torch.Tensor, fill: int = 0) -> torch.Tensor:
        """``(B, L)`` values of the packed batch as a ``(K, longest)`` batch of segments."""
        source = values.reshape(-1)
        if self.tokens is not None:
            source = source.index_select(0, self.tokens)
        if self.uniform:
            return source.view(self.segments, self.longest)
        out = torch.full((self.segments * self.longest,), fill, dtype=values.dtype, device=values.device)
        slots = torch.from_numpy(self._slots).to(values.device)
        return out.index_copy_(0, slots, source).view(self.segments, self.longest)

    def pack(self, values: torch.Tensor, fill: float = 0) -> torch.Tensor:
        """``(..., K, longest)`` per-segment values back into the packed ``(..., B, L)`` layout."""
        flat = values.reshape(*values.shape[:-2], -1)
        if not self.uniform:
            flat = _take(flat, self._slots)
        return self._place(flat, fill)

    def valid(self) -> torch.Tensor:
        """``(B, L)`` bool: the tokens that belong to a segment."""
        return self._place(torch.ones(int(self.lengths.sum()), dtype=torch.bool, device=self.device), False)

    def offsets(self) -> torch.Tensor:
        """Each token's position within its segment, ``(B, L)`` (0 outside segments)."""
        if self.uniform:
            return self.pack(torch.arange(self.longest, device=self.device).expand(self.segments, self.longest))
        within = np.arange(int(self.lengths.sum())) - self._first_token.repeat(self.lengths)
        return self._place(torch.from_numpy(within).to(self.device), 0)

    def _place(self, flat: torch.Tensor, fill: float) -> torch.Tensor:
        """``(..., N)`` values of the segments' tokens, in packed order, as ``(..., B, L)``."""
        lead = flat.shape[:-1]
        if self.tokens is None:
            return flat.view(*lead, *self.shape)
        out = torch.full((*lead, self.shape[0] * self.shape[1]), fill, dtype=flat.dtype, device=flat.device)
        return out.index_copy_(-1, self.tokens, flat).view(*lead, *self.shape)


def _take(values: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
    """``values[..., indices]``; on the CPU in numpy, whose gather is several times faster here."""
    if values.device.type == "cpu":
        return torch.from_numpy(np.take(values.numpy(), indices, axis=-1))
    return values.index_select(-1, torch.from_numpy(indices).to(values.device))
