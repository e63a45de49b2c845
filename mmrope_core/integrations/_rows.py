"""A framework's padded batch computed row by row, each row as its sample alone, where the
engine's kernel may number media across the batch (see :mod:`mmrope_core.independence`): the
batch's ``get_rope_index`` arguments shared out among the rows by each row's media counts, each
argument by the medium its plugin declares it holds one entry of each
(:meth:`BatchLayout.medium_of <mmrope_core.BatchLayout.medium_of>`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def each_row_alone(engine: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, kwargs: Mapping[str, Any],
                   counts: Sequence[Mapping[str, int]], generated_mask: torch.Tensor | None = None,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``engine.get_rope_index`` of each row alone, as one batch's ``(rows, B, L)`` positions and
    ``(B, 1)`` deltas. ``counts``: each row's items of each medium (``{"image": 2, "video": 0}``),
    by which the arguments the engine's batch layout declares with a medium are shared out; an
    undeclared tensor holding an entry per row goes to its row. Raises
    :class:`~mmrope_core.CollateError` for one it cannot share out."""
    layout = engine.batch_layout
    shares: list[dict[str, Any]] = [{} for _ in counts]
    stamped = {key: rule.grid for key, rule in layout.media.items() if rule.role == "stamps" and key in kwargs}
    for key, value in kwargs.items():
        if key not in stamped:
            for row, share in enumerate(_shared_out(key, value, layout, counts, tuple(input_ids.shape))):
                shares[row][key] = share
    for key, grid in stamped.items():  # a time stamp per frame: each row takes its grids' frames' stamps
        for row, share in enumerate(_stamps_shared_out(key, kwargs[key], [share.get(grid) for share in shares])):
            shares[row][key] = share
    positions, deltas = [], []
    for row, share in enumerate(shares):
        span = slice(row, row + 1)
        generated = None if generated_mask is None else generated_mask[span]
        own, delta = engine.get_rope_index(input_ids[span], attention_mask[span], generated_mask=generated, **share)
        positions.append(own)
        deltas.append(delta)
    return torch.cat(positions, dim=1), torch.cat(deltas)


def _shared_out(key: str, value: Any, layout: Any, counts: Sequence[Mapping[str, int]], ids: tuple[int, ...],
                ) -> list[Any]:
    from mmrope_core.errors import CollateError, counted

    rows = ids[0]
    if value is None or isinstance(value, (bool, int, float, str)):
        return [value] * rows
    medium, rule = layout.medium_of(key), layout.media.get(key)
    why = ""
    if medium is not None:
        sizes = [row.get(medium, 0) for row in counts]
        if len(value) == sum(sizes):
            starts = [sum(sizes[:row]) for row in range(rows)]
            return [value[start:start + size] if size else None for start, size in zip(starts, sizes)]
        why = f" for the batch's {counted(sum(sizes), medium)} (it holds one entry per {medium})"
    elif rule is not None and rule.role is not None:  # a grid's rows are items, never batch rows
        declared = rule.grid if rule.role == "seconds" and rule.grid is not None else key
        why = (f"; its plugin's batch_layout does not say which media items it holds one entry of each (its plugin "
               f"can: MediaKey(role='grid', medium='image', 'video' or 'audio') for {declared!r})")
    elif isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows:
        unclear = _unclear_media(value, counts, ids)
        if not unclear:
            return list(value.split(1))
        why = (f", one per batch row or one per {unclear} of its samples, and its plugin's batch_layout does not "
               f"say which (its plugin can: MediaKey(medium={unclear!r}) if it holds one entry per {unclear})")
    entries = len(value) if hasattr(value, "__len__") else value
    raise CollateError(
        f"mmrope cannot share {key!r} out among the batch's {rows} samples to compute each alone (the model numbers "
        f"media across the batch): it holds {entries!r} entries{why}; train with one sample a batch")


def _stamps_shared_out(key: str, value: Any, grids: Sequence[Any]) -> list[Any]:
    from mmrope_core.errors import CollateError, counted

    if value is None:
        return [None] * len(grids)
    value = torch.as_tensor(value).reshape(-1)  # one stamp or a (1, N) row: a frame's stamps, as the engine reads them
    frames = [0 if grid is None else int(torch.as_tensor(grid)[:, 0].sum()) for grid in grids]
    if len(value) != sum(frames):
        raise CollateError(f"{key!r} holds {len(value)} time stamps for the batch's {counted(sum(frames), 'frame')} "
                           f"(one per frame of its grids), which mmrope cannot share out among the batch's samples "
                           f"to compute each alone; pass the processor's time stamps")
    starts = [sum(frames[:row]) for row in range(len(frames))]
    return [value[start:start + size] if size else None for start, size in zip(starts, frames)]


def _unclear_media(value: torch.Tensor, counts: Sequence[Mapping[str, int]], ids: tuple[int, ...]) -> str | None:
    """The medium an undeclared tensor of one entry per batch row may as well hold one entry per
    item of: one the rows hold as many items of, but not one each; None where it holds an entry
    per token (it is laid out as the ids) or no medium fits."""
    if tuple(value.shape[:2]) == ids:
        return None
    return next((medium for medium in sorted({medium for row in counts for medium in row})
                 if sum(row.get(medium, 0) for row in counts) == ids[0]
                 and any(row.get(medium, 0) != 1 for row in counts)), None)
