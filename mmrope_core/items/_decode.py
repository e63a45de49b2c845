"""Positions written truncated to int64, and runs of generated tokens where a rollout engine
decodes them, without the compiled loops: the layout's positions placed in the dtype it sums in,
then truncated and the runs placed by :func:`mmrope_core.rollout.decoded_positions`, which gives
what the compiled loops write in the same pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..rollout import decoded_positions
from . import _place
from ._spec import PLACED

if TYPE_CHECKING:
    from ._layout import ItemLayout


def place_decoded(layout: ItemLayout, out: np.ndarray, text_row: bool, ids: np.ndarray, mask: np.ndarray | None,
                  first: np.ndarray | None, count: np.ndarray | None, media: Sequence[np.ndarray | None],
                  seconds: Sequence[np.ndarray | None], deltas: np.ndarray, enabled: int,
                  generated: np.ndarray | None) -> int:
    """:meth:`ItemLayout.place` into int64 ``out`` and ``deltas`` (truncated positions, decoded runs)."""
    summed_dtype = np.float32 if layout.float32 else np.int64
    summed, summed_deltas = np.empty(out.shape, summed_dtype), np.empty(deltas.shape, summed_dtype)
    status = _place.place(layout, summed, text_row, ids, mask, first, count, media, seconds, summed_deltas, enabled)
    if status != PLACED:
        return status
    prefill, positions = torch.from_numpy(summed), torch.from_numpy(out)
    if text_row:  # rows 1 to 3 as (3, B, L); row 0 counts tokens
        np.copyto(out[:, 0], summed[:, 0], casting="unsafe")
        prefill, positions = prefill[:, 1:].transpose(0, 1), positions[:, 1:].transpose(0, 1)
    bounds = None
    if first is not None:
        assert count is not None
        bounds = torch.from_numpy(np.append(first, first[-1] + count[-1]) if first.size else np.zeros(1, np.int64))
    _, decoded_deltas = decoded_positions(
        prefill, None if generated is None else torch.from_numpy(generated),
        None if mask is None else torch.from_numpy(mask), bounds, torch.from_numpy(summed_deltas.reshape(-1, 1)),
        out=positions)
    assert decoded_deltas is not None
    deltas.reshape(-1)[:] = decoded_deltas.numpy().reshape(-1)
    return PLACED
