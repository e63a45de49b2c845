"""Reading the placeholder runs of a batch off its token types, where a batch is refused: what
the messages of :mod:`._mismatch` name (which sample, which run, which grid).

The search over tokens is a compiled loop for CPU bytes (numpy for wider CPU values) and torch
on other devices; what it finds (a few numbers per run) is handed on as numpy arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..arrays import change_points, values_at


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
