"""Why the runs of a batch do not fit its grids: typed errors naming the sample and the item.

Only called once the fast check has found something off, so it favours clear messages over
speed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

import torch

from ..errors import InvalidInputError, PlaceholderMismatchError, a, counted
from ._media import MediaGrids, MediaKind
from ._runs import Runs


def explain(runs: Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int) -> NoReturn:
    """Raise the error that says why the runs do not fit the grids."""
    for _ in match(runs, kinds, grids, merge):
        pass
    raise PlaceholderMismatchError(
        f"the media placeholder runs of the batch do not fit the grids given "
        f"({', '.join(kind.grid_key for kind in kinds)}); pass the processor's outputs for these samples"
    )


def match(
    runs: Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int
) -> Iterator[tuple[MediaKind, torch.Tensor, torch.Tensor]]:
    """Yield ``(kind, runs of that kind, their grids)``, raising the error that explains the
    first disagreement."""
    types, lengths, rows = (torch.from_numpy(values) for values in (runs.type, runs.length, runs.row))
    known = types.new_tensor([kind.type_id for kind in kinds])
    unknown = types[~torch.isin(types, known)]
    if unknown.numel():
        raise InvalidInputError(
            f"mm_token_type_ids holds type {int(unknown[0])}, which this family does not place; "
            f"known media types: {known.tolist()}"
        )
    for kind in kinds:
        kind_runs = (types == kind.type_id).nonzero().squeeze(1)
        yield kind, kind_runs, _check_grid(kind, grids.get(kind.type_id), kind_runs, lengths, rows, merge)


def _check_grid(
    kind: MediaKind,
    media: MediaGrids | None,
    runs: torch.Tensor,
    seg_len: torch.Tensor,
    seg_row: torch.Tensor,
    merge: int,
) -> torch.Tensor:
    """The grid rows for ``runs``, after checking that every run has one and that sizes agree."""
    grid = media.grid if media is not None else None
    count = 0 if grid is None else grid.shape[0]
    if grid is not None:
        if grid.dim() != 2 or grid.shape[1] != 3:
            raise InvalidInputError(f"{kind.grid_key} must have shape (N, 3), got {tuple(grid.shape)}")
        bad = ((grid <= 0).any(dim=1) | (grid[:, 1] % merge != 0) | (grid[:, 2] % merge != 0)).nonzero()
        if bad.numel():
            row = int(bad[0, 0])
            raise InvalidInputError(
                f"{kind.grid_key} row {row} is {tuple(grid[row].tolist())}: every size must be positive and "
                f"height and width divisible by the spatial merge size {merge}. Pass the processor's grids"
            )
        grid = grid.to(device=runs.device, dtype=torch.int64)
    expected = None if grid is None else grid.prod(dim=1) // (merge * merge)
    found = seg_len[runs]
    paired = min(count, runs.numel())
    if paired:
        assert expected is not None and grid is not None
        wrong = (found[:paired] != expected[:paired]).nonzero()
        if wrong.numel():
            first = int(wrong[0, 0])
            extra = runs.numel() > count and first + 1 < runs.numel() and bool(found[first + 1] == expected[first])
            if not extra:
                raise _size_mismatch(kind, first, runs, found, expected, grid, seg_row, count)
            count = first  # the run at `first` is the one without a grid: the next run fits its grid
    if runs.numel() > count:
        run = runs[count]
        sample = int(seg_row[run])
        raise PlaceholderMismatchError(
            f"sample {sample}: a run of {counted(int(found[count]), kind.token + ' token')} has no {kind.name} grid "
            f"({kind.grid_key} has {counted(grid.shape[0] if grid is not None else 0, 'row')} for "
            f"{counted(runs.numel(), kind.name + ' run')} in the batch). "
            f"A placeholder token was probably sampled in a response, or {kind.grid_key} misses this "
            f"sample's {kind.name}s; mask it out or pass the grids of every sample"
        )
    if count > runs.numel():
        raise PlaceholderMismatchError(
            f"{kind.grid_key} has {counted(count, 'row')} but the batch holds only "
            f"{counted(runs.numel(), 'run')} of {kind.token} "
            f"(per sample: {torch.bincount(seg_row[runs], minlength=int(seg_row.max()) + 1 if seg_row.numel() else 0).tolist()}). "
            f"The sequence was probably truncated before {a(kind.name)} (drop the grids of removed "
            f"{kind.name}s), or the inputs come from another processor than the engine's"
        )
    return grid[: runs.numel()] if grid is not None else torch.zeros(0, 3, dtype=torch.int64, device=runs.device)


def _size_mismatch(kind, index, runs, found, expected, grid, seg_row, count) -> PlaceholderMismatchError:
    sample = int(seg_row[runs[index]])
    nth = int((seg_row[runs[:index]] == sample).sum())
    need, got = int(expected[index]), int(found[index])
    if count > runs.numel() and index + 1 < count and got == int(expected[index + 1]):
        # the run is the next grid's size, and there is a grid too many: an item before it is gone
        hint = (
            f"It fits the next grid {tuple(grid[index + 1].tolist())}: the grids and the placeholder runs are out "
            f"of step, probably because an earlier {kind.name} was truncated away; drop the grids of removed "
            f"{kind.name}s"
        )
    elif got < need:
        hint = "The sequence was probably truncated inside it; truncate before the placeholder run or drop it"
    else:
        hint = "Two placeholder runs touch (a separator token is missing) or extra placeholders were sampled"
    return PlaceholderMismatchError(
        f"sample {sample}, {kind.name} {nth}: the grid {tuple(grid[index].tolist())} needs "
        f"{counted(need, kind.token + ' token')} after merging, found {got}. {hint}"
    )
