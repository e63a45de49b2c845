"""A batched M-RoPE kernel for Qwen-style layouts, for plugins to build on.

The sequence of a sample is cut into runs of equal token type (0 text, >0 a media kind).
Media runs take the media's grids in order across the batch. Text tokens count up from where the
previous run left off; a media run places its tokens on a ``(t, h, w)`` grid starting at the
current position and then advances it by ``max(h, w) // merge``, the rule of transformers'
Qwen2-VL family. The work is done with whole-tensor operations: no Python loop over tokens,
samples or media.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from .errors import InvalidInputError, PlaceholderMismatchError


@dataclasses.dataclass(frozen=True)
class MediaKind:
    """One kind of media placeholder.

    Attributes:
        type_id: its value in the token-type tensor (1 image, 2 video, ...).
        name: what errors call one item (``"image"``, ``"video frame"``).
        token: the placeholder token's text, for error messages.
        grid_key: the input key holding its grids, for error messages.
    """

    type_id: int
    name: str
    token: str
    grid_key: str


@dataclasses.dataclass(frozen=True)
class MediaGrids:
    """The grids of one media kind for a batch, in order of appearance.

    Attributes:
        grid_thw: ``(N, 3)`` integer tensor of ``(t, h, w)`` patch counts before merging.
        temporal_scale: optional ``(N,)`` tensor; temporal ids become ``trunc(frame * scale)``,
            computed in the tensor's dtype exactly as the reference does. None means ``frame``.
    """

    grid_thw: torch.Tensor
    temporal_scale: torch.Tensor | None = None


def mrope_positions(
    token_types: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kinds: Sequence[MediaKind],
    grids: Mapping[int, MediaGrids | None],
    *,
    spatial_merge_size: int,
    out_dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(3, B, L)`` (0 at padding) and deltas ``(B, 1)`` (``max + 1 - valid length``).

    Raises :class:`PlaceholderMismatchError` naming the sample when placeholder runs and grids
    disagree in number or size.
    """
    batch, length = token_types.shape
    device = token_types.device
    runs = _scan(token_types, attention_mask)
    seg_start, seg_len, seg_type, seg_row = runs.start, runs.length, runs.type, runs.row
    seg_grid = torch.zeros(seg_start.numel(), 3, dtype=torch.int64, device=device)
    scaled: list[tuple[torch.Tensor, torch.Tensor]] = []
    for kind, kind_runs, grid in _match(runs, kinds, grids, spatial_merge_size):
        if kind_runs.numel():
            seg_grid[kind_runs] = grid
            media = grids.get(kind.type_id)
            if media is not None and media.temporal_scale is not None:
                scaled.append((kind_runs, media.temporal_scale))

    is_media = seg_type != 0
    grid_h = seg_grid[:, 1] // spatial_merge_size
    grid_w = seg_grid[:, 2] // spatial_merge_size
    advance = torch.where(is_media, torch.maximum(seg_grid[:, 1], seg_grid[:, 2]) // spatial_merge_size, seg_len)
    # start position of each run: advances of the earlier runs of the same sample
    ends = advance.cumsum(0)
    first_run = torch.searchsorted(seg_start, runs.row_start)
    first_run = first_run.clamp(max=max(seg_start.numel() - 1, 0))
    seg_pos = ends - advance - (ends - advance)[first_run][seg_row]

    positions = torch.arange(runs.total, device=device) + torch.repeat_interleave(seg_pos - seg_start, seg_len)
    positions = positions.unsqueeze(0).repeat(3, 1)
    seg_max = seg_pos + seg_len - 1
    media_runs = is_media.nonzero().squeeze(1)
    if media_runs.numel():
        media_len = seg_len[media_runs]
        token_run = torch.repeat_interleave(media_runs, media_len)
        offset = torch.arange(token_run.numel(), device=device) - torch.repeat_interleave(
            media_len.cumsum(0) - media_len, media_len
        )
        width, height, start = grid_w[token_run], grid_h[token_run], seg_pos[token_run]
        frame = offset // (width * height)
        temporal = frame.clone() if scaled else frame
        last_temporal = seg_grid[:, 0] - 1
        for kind_runs, scale in scaled:
            # the reference multiplies in the scale's dtype, then truncates: do exactly that
            scale_index = torch.full_like(seg_start, -1)
            scale_index[kind_runs] = torch.arange(kind_runs.numel(), device=device)
            token_scale_index = scale_index[token_run]
            selected = token_scale_index >= 0
            temporal[selected] = (frame[selected] * scale[token_scale_index[selected]]).long()
            last_temporal[kind_runs] = (last_temporal[kind_runs] * scale).long()
        flat_index = seg_start[token_run] + offset
        positions[0, flat_index] = start + temporal
        positions[1, flat_index] = start + (offset // width) % height
        positions[2, flat_index] = start + offset % width
        seg_max = seg_max.clone()
        seg_max[media_runs] = seg_pos[media_runs] + torch.maximum(
            last_temporal[media_runs], torch.maximum(grid_h[media_runs], grid_w[media_runs]) - 1
        )

    row_max = torch.full((batch,), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device)
    row_max = row_max.scatter_reduce(0, seg_row, seg_max, reduce="amax")
    deltas = (row_max + 1 - runs.row_len).unsqueeze(1)
    if attention_mask is None:
        return positions.view(3, batch, length).to(out_dtype), deltas
    out = torch.zeros(3, batch, length, dtype=out_dtype, device=device)
    out[:, attention_mask] = positions.to(out_dtype)
    return out, deltas


def check_placeholders(
    token_types: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kinds: Sequence[MediaKind],
    grids: Mapping[int, MediaGrids | None],
    *,
    spatial_merge_size: int,
) -> None:
    """Raise the errors :func:`mrope_positions` raises, without computing positions (for plugins
    that hand valid inputs to a reference implementation)."""
    for _ in _match(_scan(token_types, attention_mask), kinds, grids, spatial_merge_size):
        pass


@dataclasses.dataclass(frozen=True)
class _Runs:
    """Runs of equal token type over the valid tokens of a batch, samples concatenated."""

    start: torch.Tensor  # index of the run's first token among all valid tokens
    length: torch.Tensor
    type: torch.Tensor
    row: torch.Tensor  # sample index
    row_len: torch.Tensor  # valid tokens per sample
    row_start: torch.Tensor
    total: int


def _scan(token_types: torch.Tensor, attention_mask: torch.Tensor | None) -> _Runs:
    batch, length = token_types.shape
    device = token_types.device
    if attention_mask is None:
        flat_types = token_types.reshape(-1)
        row_len = torch.full((batch,), length, dtype=torch.int64, device=device)
    else:
        flat_types = token_types[attention_mask]
        row_len = attention_mask.sum(dim=1)
    total = flat_types.numel()
    row_start = row_len.cumsum(0) - row_len
    boundary = torch.ones(total, dtype=torch.bool, device=device)
    boundary[1:] = flat_types[1:] != flat_types[:-1]
    boundary[row_start[row_len > 0]] = True
    start = boundary.nonzero().squeeze(1)
    run_len = torch.diff(start, append=start.new_tensor([total]))
    run_type = flat_types[start].long()
    row = torch.searchsorted(row_start, start, right=True) - 1
    return _Runs(start, run_len, run_type, row, row_len, row_start, total)


def _match(runs: _Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int):
    """Yield ``(kind, runs of that kind, their grids)`` after checking they agree."""
    known = runs.type.new_tensor([0, *(kind.type_id for kind in kinds)])
    unknown = runs.type[~torch.isin(runs.type, known)]
    if unknown.numel():
        raise InvalidInputError(
            f"mm_token_type_ids holds type {int(unknown[0])}, which this family does not place; "
            f"known types: {known.tolist()}"
        )
    for kind in kinds:
        kind_runs = (runs.type == kind.type_id).nonzero().squeeze(1)
        yield kind, kind_runs, _check_grid(kind, grids.get(kind.type_id), kind_runs, runs.length, runs.row, merge)


def _check_grid(
    kind: MediaKind,
    media: MediaGrids | None,
    runs: torch.Tensor,
    seg_len: torch.Tensor,
    seg_row: torch.Tensor,
    merge: int,
) -> torch.Tensor:
    """The grid rows for ``runs``, after checking that every run has one and that sizes agree."""
    grid = media.grid_thw if media is not None else None
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
        wrong = (found[:paired] != expected[:paired]).nonzero()
        if wrong.numel():
            first = int(wrong[0, 0])
            extra = runs.numel() > count and first + 1 < runs.numel() and bool(found[first + 1] == expected[first])
            if not extra:
                raise _size_mismatch(kind, first, runs, found, expected, grid, seg_row)
            count = first  # the run at `first` is the one without a grid: the next run fits its grid
    if runs.numel() > count:
        run = runs[count]
        sample = int(seg_row[run])
        raise PlaceholderMismatchError(
            f"sample {sample}: a run of {int(found[count])} {kind.token} tokens has no {kind.name} grid "
            f"({kind.grid_key} has {grid.shape[0] if grid is not None else 0} rows for {runs.numel()} "
            f"{kind.name} runs in the batch). "
            f"A placeholder token was probably sampled in a response, or {kind.grid_key} misses this "
            f"sample's {kind.name}s; mask it out or pass the grids of every sample"
        )
    if count > runs.numel():
        raise PlaceholderMismatchError(
            f"{kind.grid_key} has {count} rows but the batch holds only {runs.numel()} runs of {kind.token} "
            f"(per sample: {torch.bincount(seg_row[runs], minlength=int(seg_row.max()) + 1 if seg_row.numel() else 0).tolist()}). "
            f"The sequence was probably truncated before a {kind.name}; drop the grids of removed {kind.name}s"
        )
    return grid[: runs.numel()] if grid is not None else torch.zeros(0, 3, dtype=torch.int64, device=runs.device)


def _size_mismatch(kind, index, runs, found, expected, grid, seg_row) -> PlaceholderMismatchError:
    sample = int(seg_row[runs[index]])
    nth = int((seg_row[runs[:index]] == sample).sum())
    need, got = int(expected[index]), int(found[index])
    hint = (
        "The sequence was probably truncated inside it; truncate before the placeholder run or drop it"
        if got < need
        else "Two placeholder runs touch (a separator token is missing) or extra placeholders were sampled"
    )
    return PlaceholderMismatchError(
        f"sample {sample}, {kind.name} {nth}: the grid {tuple(grid[index].tolist())} needs {need} {kind.token} "
        f"tokens after merging, found {got}. {hint}"
    )
