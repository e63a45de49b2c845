"""A framework's padded batch computed row by row, each row as its sample alone, where the
engine's kernel may number media across the batch (see :mod:`mmrope_core.independence`): the
batch's ``get_rope_index`` arguments shared out among the rows by each row's media counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

#: the medium whose items a ``get_rope_index`` argument holds one entry of each, by a part of its name
_MEDIUM_OF = (("video", "video"), ("second_per_grid", "video"), ("image", "image"), ("audio", "audio"),
              ("feature", "audio"))


def each_row_alone(engine: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, kwargs: Mapping[str, Any],
                   counts: Sequence[Mapping[str, int]], generated_mask: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``engine.get_rope_index`` of each row alone, as one batch's ``(rows, B, L)`` positions and
    ``(B, 1)`` deltas. ``counts``: each row's items of each medium (``{"image": 2, "video": 0}``),
    by which the arguments holding one entry per item are shared out; one holding an entry per row
    goes to its row. Raises :class:`~mmrope_core.CollateError` for one it cannot share out."""
    shares: list[dict[str, Any]] = [{} for _ in counts]
    for key, value in kwargs.items():
        for row, share in enumerate(_shared_out(key, value, counts, input_ids.shape[0])):
            shares[row][key] = share
    positions, deltas = [], []
    for row, share in enumerate(shares):
        span = slice(row, row + 1)
        generated = None if generated_mask is None else generated_mask[span]
        own, delta = engine.get_rope_index(input_ids[span], attention_mask[span], generated_mask=generated, **share)
        positions.append(own)
        deltas.append(delta)
    return torch.cat(positions, dim=1), torch.cat(deltas)


def _shared_out(key: str, value: Any, counts: Sequence[Mapping[str, int]], rows: int) -> list[Any]:
    from mmrope_core.errors import CollateError

    if value is None or isinstance(value, (bool, int, float, str)):
        return [value] * rows
    medium = next((medium for part, medium in _MEDIUM_OF if part in key), None)
    if medium is not None:
        sizes = [row.get(medium, 0) for row in counts]
        if len(value) == sum(sizes):
            starts = [sum(sizes[:row]) for row in range(rows)]
            return [value[start:start + size] if size else None for start, size in zip(starts, sizes)]
    elif isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows:
        return list(value.split(1))
    raise CollateError(
        f"{key!r} holds {len(value) if hasattr(value, '__len__') else value!r} entries, which mmrope cannot share out "
        f"among the batch's {rows} samples to compute each alone (the model numbers media across the batch); "
        f"train with one sample a batch")
