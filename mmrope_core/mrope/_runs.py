"""Finding the media runs of a batch and the grid each run takes.

The search over tokens is a compiled loop for CPU bytes (numpy for wider CPU values) and torch
on other devices; what it finds (a few numbers per run) is handed on as numpy arrays, on the
CPU whatever the device of the batch.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..arrays import change_points, numpy, values_at
from ._media import MediaGrids, MediaKind


# Built on every call, so not frozen: a frozen dataclass costs about a microsecond per field to build.
@dataclasses.dataclass(slots=True)
class Runs:
    """Media placeholder runs of a batch in reading order."""

    start: np.ndarray  # flat index (row * L + column) of each run's first token
    length: np.ndarray
    type: np.ndarray
    row: np.ndarray  # sample index

    @property
    def count(self) -> int:
        return self.start.size


@dataclasses.dataclass(slots=True)
class Matched:
    """Each run's grid: ``grid`` is ``(R, 3)`` ``(t, h, w)``; ``scaled`` lists the runs whose
    temporal ids are scaled (an index array, or a slice for all runs) with their ``(n,)`` scales."""

    grid: np.ndarray
    scaled: list[tuple[np.ndarray | slice, np.ndarray | torch.Tensor]]


@dataclasses.dataclass(slots=True)
class Spans:
    """Where each sample's valid tokens lie: ``first`` and ``last`` flat indices (``row * L +
    column``); a sample without valid tokens has ``count`` 0 and ``last = first - 1``."""

    count: np.ndarray
    first: np.ndarray
    last: np.ndarray


def scan(code: torch.Tensor, padded: bool = True) -> tuple[Runs, Spans | None]:
    """The media runs and each sample's span of valid tokens, read off the places where ``code``
    (-1 at padding, else the token type) changes. Spans are None when a sample's valid tokens do
    not form one span (padding inside a sample). Without padding (``padded`` False) every
    sample's span is its row."""
    batch, length = code.shape
    flat = code.numpy().reshape(-1) if code.device.type == "cpu" else code.reshape(-1)
    change = change_points(flat)
    row_start = np.arange(0, batch * length, length)
    # the values on both sides of each change, and in the first and last column of each row
    read = np.concatenate((change, change + 1, row_start, row_start + (length - 1)))
    values = values_at(flat, read).astype(np.int64)
    changes = change.size
    before, after = values[:changes], values[changes : 2 * changes]
    first_column, last_column = values[2 * changes : 2 * changes + batch], values[2 * changes + batch :]
    opens = after > 0
    starts, types, ends = change[opens] + 1, after[opens], change[before > 0]
    if values[2 * changes :].max() > 0:
        # Media at a row's edge: a run must end with its row, even where the next row begins
        # with the same placeholder, and the batch's first and last tokens have no neighbour.
        starts, types, ends = _split_at_rows(starts, types, ends, first_column, last_column, row_start, length)
    runs = Runs(start=starts, length=ends + 1 - starts, type=types, row=starts // length)
    if not padded:
        return runs, Spans(np.full(batch, length), row_start, row_start + (length - 1))
    return runs, _spans(change, before, after, first_column, last_column, row_start, length)


def _spans(change, before, after, first_column, last_column, row_start, length) -> Spans | None:
    inside = change % length != length - 1  # changes between rows are read from the edges
    firsts = np.concatenate((change[inside & (before == -1)] + 1, row_start[first_column != -1]))
    lasts = np.concatenate((change[inside & (after == -1)], row_start[last_column != -1] + (length - 1)))
    first_row = firsts // length
    if firsts.size and np.bincount(first_row).max() > 1:
        return None
    first = row_start.copy()
    first[first_row] = firsts
    last = first - 1
    last[lasts // length] = lasts
    return Spans(last - first + 1, first, last)


def _split_at_rows(starts, types, ends, first_column, last_column, row_start, length):
    inner, opening = starts % length != 0, first_column > 0
    starts = np.concatenate((starts[inner], row_start[opening]))
    types = np.concatenate((types[inner], first_column[opening]))
    order = starts.argsort(kind="stable")
    ends = np.concatenate((ends[(ends + 1) % length != 0], row_start[last_column > 0] + (length - 1)))
    return starts[order], types[order], np.sort(ends)


def grids_of_runs(runs: Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int) -> Matched | None:
    """The runs of each kind take that kind's grids in order. None when they do not fit (in
    number or size, or a grid is malformed); :func:`~._mismatch.match` says how."""
    counts = np.bincount(runs.type).tolist()
    given = []  # (grid, temporal_scale) of each kind with grids, by type id
    for kind in sorted(kinds, key=_type_id):
        media = grids.get(kind.type_id)
        sizes = None if media is None else media.grid
        number = 0 if sizes is None else sizes.shape[0]
        if (counts[kind.type_id] if kind.type_id < len(counts) else 0) != number:
            return None
        if number:
            assert media is not None and sizes is not None
            if sizes.dim() != 2 or sizes.shape[1] != 3:
                return None
            given.append((numpy(sizes), media.temporal_scale))
    if runs.count != sum(grid.shape[0] for grid, _ in given):  # runs of a type no kind places
        return None
    if not given:
        return Matched(np.zeros((0, 3), dtype=np.int64), [])
    grid = (np.concatenate([grid for grid, _ in given]) if len(given) > 1 else given[0][0]).astype(np.int64)
    tokens = grid[:, 0] * grid[:, 1] * grid[:, 2]  # (faster than prod over three columns)
    if len(given) == 1:
        run_grid, found = grid, runs.length
        kind_runs: list[np.ndarray | slice] = [slice(None)]
    else:  # grids are listed kind by kind; runs come in reading order
        order = runs.type.argsort(kind="stable")
        found = runs.length[order]
        run_grid = np.empty_like(grid)
        run_grid[order] = grid
        bounds = list(itertools.accumulate((grid.shape[0] for grid, _ in given), initial=0))
        kind_runs = [order[begin:end] for begin, end in itertools.pairwise(bounds)]
    if grid.min() <= 0 or (grid[:, 1:] % merge).any() or (found * (merge * merge) != tokens).any():
        return None
    scaled = [(runs_of_kind, _host_scale(scale)) for runs_of_kind, (_, scale) in zip(kind_runs, given) if scale is not None]
    return Matched(run_grid, scaled)


def _type_id(kind: MediaKind) -> int:
    return kind.type_id


def _host_scale(scale: torch.Tensor | np.ndarray) -> np.ndarray | torch.Tensor:
    """Temporal scales on the CPU, in the dtype torch multiplies int64 frame numbers in: as numpy
    when numpy holds that dtype and multiplies in it alike (float32, float64, int64), else as a
    tensor."""
    if isinstance(scale, np.ndarray):
        if scale.dtype in _NUMPY_PRODUCTS:
            return scale
        scale = torch.from_numpy(scale)
    dtype = torch.promote_types(torch.int64, scale.dtype)
    if dtype not in _TORCH_PRODUCTS:
        return scale.cpu()
    return numpy(scale if scale.dtype == dtype else scale.to(dtype))


_TORCH_PRODUCTS = (torch.float32, torch.float64, torch.int64)
_NUMPY_PRODUCTS = (np.float32, np.float64, np.int64)
