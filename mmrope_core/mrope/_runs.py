"""Finding the media runs of a batch and the grid each run takes.

The search over tokens is done in torch; what it finds (a few numbers per run) is handed on as
numpy arrays, on the CPU whatever the device of the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ._media import MediaGrids, MediaKind


@dataclasses.dataclass(frozen=True)
class Runs:
    """Media placeholder runs of a batch in reading order."""

    start: np.ndarray  # flat index (row * L + column) of each run's first token
    length: np.ndarray
    type: np.ndarray
    row: np.ndarray  # sample index

    @property
    def count(self) -> int:
        return self.start.size


@dataclasses.dataclass(frozen=True)
class Matched:
    """Each run's grid: ``grid`` is ``(R, 3)`` ``(t, h, w)``; ``scaled`` lists the runs whose
    temporal ids are scaled (an index array, or a slice for all runs) with their ``(n,)`` scales."""

    grid: np.ndarray
    scaled: list[tuple[np.ndarray | slice, torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class Spans:
    """Where each sample's valid tokens lie: ``first`` and ``last`` flat indices (``row * L +
    column``); a sample without valid tokens has ``count`` 0 and ``last = first - 1``."""

    count: np.ndarray
    first: np.ndarray
    last: np.ndarray


def numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.cpu().numpy()


def scan(code: torch.Tensor) -> tuple[Runs, Spans | None]:
    """The media runs and each sample's span of valid tokens, read off the places where ``code``
    (-1 at padding, else the token type) changes. Spans are None when a sample's valid tokens do
    not form one span (padding inside a sample)."""
    batch, length = code.shape
    flat = code.view(-1)
    change = _nonzero(flat[1:] - flat[:-1])  # p such that flat[p] != flat[p + 1]
    sides = numpy(flat.index_select(0, torch.cat((change, change + 1)))).astype(np.int64)
    change = numpy(change)
    before, after = sides[: change.size], sides[change.size :]
    edges = numpy(torch.stack((code[:, 0], code[:, -1]))).astype(np.int64)
    opens = after > 0
    starts, types, ends = change[opens] + 1, after[opens], change[before > 0]
    if (edges > 0).any():
        # Media at a row's edge: a run must end with its row, even where the next row begins
        # with the same placeholder, and the batch's first and last tokens have no neighbour.
        starts, types, ends = _split_at_rows(starts, types, ends, edges, batch, length)
    runs = Runs(start=starts, length=ends - starts + 1, type=types, row=starts // length)
    return runs, _spans(change, before, after, edges, batch, length)


def _spans(change, before, after, edges, batch, length) -> Spans | None:
    inside = change % length != length - 1  # changes between rows are read from the edges
    row_start = np.arange(0, batch * length, length)
    firsts = np.concatenate((change[inside & (before == -1)] + 1, row_start[edges[0] != -1]))
    lasts = np.concatenate((change[inside & (after == -1)], row_start[edges[1] != -1] + (length - 1)))
    if firsts.size and np.bincount(firsts // length).max() > 1:
        return None
    first = row_start.copy()
    first[firsts // length] = firsts
    last = first - 1
    last[lasts // length] = lasts
    return Spans(last - first + 1, first, last)


def _split_at_rows(starts, types, ends, edges, batch, length):
    row_start = np.arange(0, batch * length, length)
    inner, opening = starts % length != 0, edges[0] > 0
    starts = np.concatenate((starts[inner], row_start[opening]))
    types = np.concatenate((types[inner], edges[0][opening]))
    order = np.argsort(starts, kind="stable")
    ends = np.concatenate((ends[(ends + 1) % length != 0], row_start[edges[1] > 0] + (length - 1)))
    return starts[order], types[order], np.sort(ends)


def _nonzero(flags: torch.Tensor) -> torch.Tensor:
    """Indices of the nonzero entries of a 1-D int8 tensor in which they are sparse: the scan runs
    over 8-byte words (several times faster), then looks inside the words that hold any."""
    words = flags.numel() // 8
    if words < 1024 or flags.storage_offset() % 8:
        return flags.nonzero().squeeze(1)
    hit = flags[: words * 8].view(torch.int64).nonzero()
    candidates = ((hit << 3) | _BYTES.to(hit.device)).view(-1)
    found = candidates[flags.index_select(0, candidates) != 0]
    if flags.numel() > words * 8:
        found = torch.cat((found, flags[words * 8 :].nonzero().squeeze(1) + words * 8))
    return found


_BYTES = torch.arange(8)


def grids_of_runs(runs: Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int) -> Matched | None:
    """The runs of each kind take that kind's grids in order. None when they do not fit (in
    number or size, or a grid is malformed); :func:`~._mismatch.match` says how."""
    kinds = sorted(kinds, key=lambda kind: kind.type_id)
    given = [(kind, grids.get(kind.type_id)) for kind in kinds]
    given = [(kind, media) for kind, media in given if media is not None and media.grid_thw.shape[0]]
    if runs.count and runs.type.min() < 0:
        return None
    counts = np.bincount(runs.type, minlength=kinds[-1].type_id + 1).tolist()
    expected = [0] * (kinds[-1].type_id + 1)
    for kind, media in given:
        expected[kind.type_id] = media.grid_thw.shape[0]
    if counts != expected or not all(media.grid_thw.dim() == 2 and media.grid_thw.shape[1] == 3 for _, media in given):
        return None
    if not given:
        return Matched(np.zeros((0, 3), dtype=np.int64), [])
    grid = np.concatenate([numpy(media.grid_thw) for _, media in given]).astype(np.int64)
    order = np.argsort(runs.type, kind="stable") if len(given) > 1 else None
    found = runs.length if order is None else runs.length[order]
    if not ((grid > 0).all() and (grid[:, 1:] % merge == 0).all() and np.array_equal(found * (merge * merge), grid.prod(axis=1))):
        return None
    if order is None:
        run_grid, kind_runs = grid, [slice(None)]
    else:
        run_grid = np.empty_like(grid)
        run_grid[order] = grid
        bounds = np.cumsum([0] + [media.grid_thw.shape[0] for _, media in given])
        kind_runs = [order[begin:end] for begin, end in zip(bounds[:-1], bounds[1:])]
    scaled = [
        (runs_of_kind, media.temporal_scale.cpu())
        for runs_of_kind, (_, media) in zip(kind_runs, given)
        if media.temporal_scale is not None
    ]
    return Matched(run_grid, scaled)
