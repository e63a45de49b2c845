"""Finding the media runs of a batch and the grid each run takes.

The search over tokens is done in numpy for CPU tensors and in torch on other devices; what it
finds (a few numbers per run) is handed on as numpy arrays, on the CPU whatever the device of
the batch.
"""

from __future__ import annotations

import dataclasses
import itertools
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
    scaled: list[tuple[np.ndarray | slice, np.ndarray | torch.Tensor]]


@dataclasses.dataclass(frozen=True)
class Spans:
    """Where each sample's valid tokens lie: ``first`` and ``last`` flat indices (``row * L +
    column``); a sample without valid tokens has ``count`` 0 and ``last = first - 1``."""

    count: np.ndarray
    first: np.ndarray
    last: np.ndarray


def numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.cpu().numpy()


def scan(code: torch.Tensor, padded: bool = True) -> tuple[Runs, Spans | None]:
    """The media runs and each sample's span of valid tokens, read off the places where ``code``
    (-1 at padding, else the token type) changes. Spans are None when a sample's valid tokens do
    not form one span (padding inside a sample). Without padding (``padded`` False) every
    sample's span is its row."""
    batch, length = code.shape
    flat = code.view(-1)
    change = _changes(flat)
    row_start = np.arange(0, batch * length, length)
    # the values on both sides of each change, and in the first and last column of each row
    read = np.concatenate((change, change + 1, row_start, row_start + (length - 1)))
    values = values_at(flat, read).astype(np.int64)
    changes = change.size
    before, after = values[:changes], values[changes : 2 * changes]
    first_column, last_column = values[2 * changes : 2 * changes + batch], values[2 * changes + batch :]
    opens = after > 0
    starts, types, ends = change[opens] + 1, after[opens], change[before > 0]
    if (first_column > 0).any() or (last_column > 0).any():
        # Media at a row's edge: a run must end with its row, even where the next row begins
        # with the same placeholder, and the batch's first and last tokens have no neighbour.
        starts, types, ends = _split_at_rows(starts, types, ends, first_column, last_column, row_start, length)
    runs = Runs(start=starts, length=ends - starts + 1, type=types, row=starts // length)
    if not padded:
        return runs, Spans(np.full(batch, length), row_start, row_start + (length - 1))
    return runs, _spans(change, before, after, first_column, last_column, row_start, length)


def _changes(flat: torch.Tensor) -> np.ndarray:
    """The indices p where ``flat[p] != flat[p + 1]``, which are few."""
    if flat.device.type == "cpu":
        # numpy's byte comparison and nonzero are several times faster than torch's here
        values = flat.numpy()
        return np.flatnonzero(values[1:] != values[:-1])
    return numpy(torch.nonzero(flat[1:] != flat[:-1]).squeeze(1))


def values_at(flat: torch.Tensor, indices: np.ndarray) -> np.ndarray:
    """``flat[indices]`` as a numpy array on the CPU, whatever the device of ``flat``."""
    if flat.device.type == "cpu":
        return flat.numpy()[indices]
    return numpy(flat.index_select(0, torch.from_numpy(indices).to(flat.device)))


def _spans(change, before, after, first_column, last_column, row_start, length) -> Spans | None:
    inside = change % length != length - 1  # changes between rows are read from the edges
    firsts = np.concatenate((change[inside & (before == -1)] + 1, row_start[first_column != -1]))
    lasts = np.concatenate((change[inside & (after == -1)], row_start[last_column != -1] + (length - 1)))
    if firsts.size and np.bincount(firsts // length).max() > 1:
        return None
    first = row_start.copy()
    first[firsts // length] = firsts
    last = first - 1
    last[lasts // length] = lasts
    return Spans(last - first + 1, first, last)


def _split_at_rows(starts, types, ends, first_column, last_column, row_start, length):
    inner, opening = starts % length != 0, first_column > 0
    starts = np.concatenate((starts[inner], row_start[opening]))
    types = np.concatenate((types[inner], first_column[opening]))
    order = np.argsort(starts, kind="stable")
    ends = np.concatenate((ends[(ends + 1) % length != 0], row_start[last_column > 0] + (length - 1)))
    return starts[order], types[order], np.sort(ends)


def grids_of_runs(runs: Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int) -> Matched | None:
    """The runs of each kind take that kind's grids in order. None when they do not fit (in
    number or size, or a grid is malformed); :func:`~._mismatch.match` says how."""
    kinds = sorted(kinds, key=lambda kind: kind.type_id)
    given = [(kind, grids.get(kind.type_id)) for kind in kinds]
    given = [(kind, media) for kind, media in given if media is not None and media.grid_thw.shape[0]]
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
    tokens = grid[:, 0] * grid[:, 1] * grid[:, 2]  # (faster than prod over three columns)
    if grid.min() <= 0 or (grid[:, 1:] % merge).any() or (found * (merge * merge) != tokens).any():
        return None
    if order is None:
        run_grid, kind_runs = grid, [slice(None)]
    else:
        run_grid = np.empty_like(grid)
        run_grid[order] = grid
        bounds = list(itertools.accumulate((media.grid_thw.shape[0] for _, media in given), initial=0))
        kind_runs = [order[begin:end] for begin, end in zip(bounds[:-1], bounds[1:])]
    scaled = [
        (runs_of_kind, _host_scale(media.temporal_scale))
        for runs_of_kind, (_, media) in zip(kind_runs, given)
        if media.temporal_scale is not None
    ]
    return Matched(run_grid, scaled)


def _host_scale(scale: torch.Tensor) -> np.ndarray | torch.Tensor:
    """Temporal scales on the CPU, in the dtype torch multiplies int64 frame numbers in: as numpy
    when numpy holds that dtype and multiplies in it alike (float32, float64, int64), else as a
    tensor."""
    scale = scale.cpu()
    dtype = torch.promote_types(torch.int64, scale.dtype)
    if dtype in (torch.float32, torch.float64, torch.int64):
        return scale.to(dtype).numpy()
    return scale
