"""Packed rows: several samples in one row, described by ``cu_seqlens`` (THD layout) or by
per-token ``segment_ids`` ("neat packing"). Each segment is computed as the sample it was:
positions restart at 0 and media grids are consumed in order across segments."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import torch

from .arrays import change_points, values_at
from .errors import InvalidInputError


@dataclasses.dataclass(eq=False)  # not frozen: built on every call, and a frozen one costs more to build
class PackedLayout:
    """Where each segment of a packed batch lies.

    Attributes:
        shape: ``(B, L)`` of the packed batch.
        lengths: ``(K,)`` tokens per segment, in order (row by row).
        starts: ``(K,)`` flat index (``row * L + column``) of each segment's first token.
        device: where the batch's tensors are.
        spans: ``(3, S)``, or None when the segments cover the batch back to back
            (``cu_seqlens``, or segment ids without padding): for each longest run of segments
            that follow one another in a row, its first token's flat index, where it begins
            among the segments' tokens, and its length.
        gaps: ``(2, G)``, None with ``spans``: the flat index of the first token and the length
            of each run of tokens outside segments (each inside one row).
        longest: the most tokens in a segment.
        uniform: all segments have the same length: unpacking is a reshape, and every slot of
            the unpacked batch holds a token.
        size: the tokens in segments.
    """

    shape: tuple[int, int]
    lengths: np.ndarray
    starts: np.ndarray
    device: torch.device
    spans: np.ndarray | None = None
    gaps: np.ndarray | None = None
    longest: int = dataclasses.field(init=False)
    uniform: bool = dataclasses.field(init=False)
    size: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # worked out here, where every call needs them (a cached_property takes a lock per read)
        self.longest = int(self.lengths.max())
        self.uniform = int(self.lengths.min()) == self.longest
        self.size = self.shape[0] * self.shape[1] if self.gaps is None else int(self.lengths.sum())

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
        return cls((shape[0], shape[1]), steps, bounds[:-1], device)

    @classmethod
    def from_segment_ids(cls, segment_ids: Any, shape: tuple[int, int]) -> PackedLayout:
        if not isinstance(segment_ids, torch.Tensor) or segment_ids.dtype.is_floating_point:
            raise InvalidInputError("segment_ids must be an integer tensor (B, L): 0 for padding, 1..K per segment")
        ids = segment_ids.reshape(shape) if segment_ids.dim() == 1 and shape[0] == 1 else segment_ids
        if tuple(ids.shape) != tuple(shape):
            raise InvalidInputError(f"segment_ids has shape {tuple(segment_ids.shape)} but input_ids has {tuple(shape)}")
        rows, length = shape
        # read where the ids change, as the kernel reads token types: in numpy on the CPU
        flat: np.ndarray | torch.Tensor = ids.reshape(-1)
        if flat.device.type == "cpu":  # type: ignore[union-attr]
            flat = flat.numpy()  # type: ignore[union-attr]
        # blocks: the longest runs of one id inside a row
        first = np.union1d(change_points(flat) + 1, np.arange(0, rows * length, length))
        value = values_at(flat, first).astype(np.int64)
        if value.min() < 0:
            raise InvalidInputError("segment_ids must not be negative: 0 marks padding, 1..K the segments")
        size = np.append(first[1:], rows * length) - first
        in_segment = value > 0
        starts, numbers = first[in_segment], value[in_segment]
        if not starts.size:
            raise InvalidInputError("segment_ids marks no token as part of a segment")
        # a row's segments are numbered 1, 2, ... in order, each one block
        row = starts // length
        expected = np.arange(1, starts.size + 1) - row.searchsorted(row)
        wrong = (numbers != expected).nonzero()[0]
        if wrong.size:
            k = int(wrong[0])
            row_index, column = divmod(int(starts[k]), length)
            raise InvalidInputError(
                f"segment_ids of row {row_index} are not contiguous and numbered 1, 2, ... in order: token {column} "
                f"holds segment {int(numbers[k])} where segment {int(expected[k])} was expected; "
                f"each segment must be one span, and segments must follow each other in order"
            )
        lengths = size[in_segment]
        if in_segment.all():
            return cls((rows, length), lengths, starts, ids.device)
        opens = in_segment.copy()  # a block that begins a run of segments following one another
        opens[1:] &= ~in_segment[:-1] | (first[1:] % length == 0)
        span_length = np.add.reduceat(lengths, opens[in_segment].nonzero()[0])
        spans = np.array((first[opens], np.add.accumulate(span_length) - span_length, span_length))
        gaps = np.array((first[~in_segment], size[~in_segment]))
        return cls((rows, length), lengths, starts, ids.device, spans, gaps)

    def joined(self, values: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` values as one ``(1, N)`` row: the segments' tokens back to back, in order."""
        if self.spans is None:
            return values.reshape(1, -1)
        flat = values.reshape(-1)
        return torch.cat([flat[start : start + count] for start, _, count in self.spans.T.tolist()]).unsqueeze(0)

    def joined_bounds(self) -> np.ndarray:
        """The ``cu_seqlens`` of :meth:`joined`: ``(K + 1,)`` from 0 to N."""
        return np.concatenate((self.starts if self.spans is None else self._first_token, [self.size]))

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
        return shift.repeat(self.lengths) + np.arange(self.size)

    def unpack(self, values: torch.Tensor, fill: int = 0) -> torch.Tensor:
        """``(B, L)`` values of the packed batch as a ``(K, longest)`` batch of segments."""
        source = values.reshape(-1) if self.spans is None else self.joined(values)[0]
        if self.uniform:
            return source.view(self.segments, self.longest)
        out = torch.full((self.segments * self.longest,), fill, dtype=values.dtype, device=values.device)
        slots = torch.from_numpy(self._slots).to(values.device)
        return out.index_copy_(0, slots, source).view(self.segments, self.longest)

    def pack(self, values: torch.Tensor, outside: float | tuple[float, ...] = 0,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """``(..., K, longest)`` per-segment values back into the packed ``(..., B, L)`` layout,
        as :meth:`spread` lays them out."""
        flat = values.reshape(*values.shape[:-2], -1)
        if not self.uniform:
            flat = _take(flat, self._slots)
        return self.spread(flat, outside, out)

    def valid(self) -> torch.Tensor:
        """``(B, L)`` bool: the tokens that belong to a segment."""
        return self.spread(torch.ones(self.size, dtype=torch.bool, device=self.device), False)

    def offsets(self, outside: int = 0) -> torch.Tensor:
        """Each token's position within its segment, ``(B, L)``; ``outside`` outside segments."""
        if self.uniform:
            return self.pack(torch.arange(self.longest, device=self.device).expand(self.segments, self.longest), outside)
        within = np.arange(self.size) - self._first_token.repeat(self.lengths)
        return self.spread(torch.from_numpy(within).to(self.device), outside)

    def spread(self, flat: torch.Tensor, outside: float | tuple[float, ...] = 0,
              out: torch.Tensor | None = None) -> torch.Tensor:
        """``(..., N)`` values of the segments' tokens, in packed order, as ``(..., B, L)``, holding
        ``outside`` at the other tokens: one value, or one per row of ``(R, N)`` values. Written
        into ``out`` (``(..., B, L)`` in any memory layout) when given; else a view of ``flat``
        where the segments cover the batch."""
        shape = (*flat.shape[:-1], *self.shape)
        if self.gaps is None:
            return flat.view(shape) if out is None else out.copy_(flat.view(shape))
        if out is None:
            out = flat.new_empty(shape)
        fill = torch.as_tensor(outside, dtype=flat.dtype, device=flat.device)
        fill = fill.reshape(-1, 1) if fill.dim() else fill
        # a copy per run: a few per row, where scattering token by token costs several times more
        assert self.spans is not None
        length = self.shape[1]
        for start, at, count in self.spans.T.tolist():
            row, column = divmod(start, length)
            out[..., row, column : column + count] = flat[..., at : at + count]
        for start, count in self.gaps.T.tolist():
            row, column = divmod(start, length)
            out[..., row, column : column + count] = fill
        return out


def _take(values: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
    """``values[..., indices]``; on the CPU in numpy, whose gather is several times faster here."""
    if values.device.type == "cpu":
        return torch.from_numpy(np.take(values.numpy(), indices, axis=-1))
    return values.index_select(-1, torch.from_numpy(indices).to(values.device))
