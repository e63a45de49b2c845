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


class TokenTypeMap:
    """Builds ``mm_token_type_ids`` from ``input_ids``: each listed token id becomes its media
    type, every other token 0 (text). Returns int8, the dtype :func:`mrope_positions` works in.

    Example: ``TokenTypeMap({processor.image_token_id: 1, processor.video_token_id: 2})``.
    """

    def __init__(self, types: Mapping[int, int]) -> None:
        if any(not 0 < media_type < 128 for media_type in types.values()):
            raise ValueError(f"media types must be between 1 and 127, got {dict(types)}")
        self.types = dict(types)

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(input_ids.shape, dtype=torch.int8, device=input_ids.device)
        for token, media_type in self.types.items():
            match = (input_ids == token).view(torch.int8)
            out += match if media_type == 1 else match * media_type
        return out

    def __repr__(self) -> str:
        return f"TokenTypeMap({self.types})"


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

    ``attention_mask`` is a bool ``(B, L)`` tensor or None. Raises
    :class:`PlaceholderMismatchError` naming the sample when placeholder runs and grids disagree
    in number or size.
    """
    token_types = _small_int(token_types)
    if attention_mask is not None and not _each_row_contiguous(attention_mask):
        compact_types, compact_mask, order = _compact(token_types, attention_mask)
        compact, deltas = mrope_positions(
            compact_types, compact_mask, kinds, grids, spatial_merge_size=spatial_merge_size, out_dtype=out_dtype
        )
        out = torch.zeros_like(compact)
        return out.scatter_(2, order.unsqueeze(0).expand_as(compact), compact), deltas

    batch, length = token_types.shape
    device = token_types.device
    runs = _scan(token_types, attention_mask)
    run_grid = torch.zeros(runs.count, 3, dtype=torch.int64, device=device)
    scaled: list[tuple[torch.Tensor, torch.Tensor]] = []
    for kind, kind_runs, grid in _match(runs, kinds, grids, spatial_merge_size):
        if kind_runs.numel():
            run_grid[kind_runs] = grid
            media = grids.get(kind.type_id)
            if media is not None and media.temporal_scale is not None:
                scaled.append((kind_runs, media.temporal_scale.to(device)))
    grid_h = run_grid[:, 1] // spatial_merge_size
    grid_w = run_grid[:, 2] // spatial_merge_size
    advance = torch.maximum(run_grid[:, 1], run_grid[:, 2]) // spatial_merge_size

    # Text positions count valid tokens; after each media run the count jumps so that the next
    # token sits at (run start + advance). One cumsum places every text token.
    out = torch.empty(3, batch, length, dtype=torch.int64, device=device)
    if attention_mask is None:
        out[1].fill_(1)
    else:
        out[1].copy_(attention_mask)
    out[1, :, 0] -= 1  # so that the cumsum counts from 0 (leading padding is masked below)
    after = runs.start + runs.length
    inside_row = after % length != 0
    out[1].view(-1).index_put_((after[inside_row],), (advance - runs.length)[inside_row], accumulate=True)
    text = torch.cumsum(out[1], dim=1, out=out[0])
    run_pos = text.view(-1)[runs.start]
    if attention_mask is not None:
        text.mul_(attention_mask.view(torch.int8))
    out[1:].copy_(text.unsqueeze(0).expand(2, batch, length))
    if runs.count:
        run = runs.token_run
        # Grid coordinates of each media token from its offset in its run. float32 division is
        # several times faster than integer division and exact here: offsets stay below 2**24.
        per_run = torch.stack([runs.first_token.float(), grid_w.float(), (grid_h * grid_w).float()], dim=1)
        per_token = per_run.index_select(0, run)
        offset = torch.arange(run.numel(), dtype=torch.float32, device=device) - per_token[:, 0]
        frame = (offset / per_token[:, 2]).floor_()
        within = offset - frame * per_token[:, 2]
        row = (within / per_token[:, 1]).floor_()
        column = within - row * per_token[:, 1]
        start = run_pos.index_select(0, run)
        temporal = frame.long()
        for kind_runs, scale in scaled:
            # the reference multiplies int64 frame numbers in the scale's dtype, then truncates
            scale_index = torch.full((runs.count,), -1, dtype=torch.int64, device=device)
            scale_index[kind_runs] = torch.arange(kind_runs.numel(), device=device)
            token_scale = scale_index.index_select(0, run)
            selected = token_scale >= 0
            temporal[selected] = (temporal[selected] * scale[token_scale[selected]]).long()
        flat = out.view(3, -1)
        flat[0].index_copy_(0, runs.tokens, start + temporal)
        flat[1].index_copy_(0, runs.tokens, start + row.long())
        flat[2].index_copy_(0, runs.tokens, start + column.long())

    # The largest position of a sample, as the reference takes it over its valid tokens and three
    # axes: the temporal row holds every text position and temporal id; height and width ids
    # exceed it only in a media run with no text after it.
    row_max = out[0].amax(dim=1)
    if runs.count:
        run_hw_max = run_pos + torch.maximum(grid_h, grid_w) - 1
        row_max = row_max.scatter_reduce(0, runs.row, run_hw_max, reduce="amax")
    if attention_mask is None:
        row_len = torch.full((batch,), length, dtype=torch.int64, device=device)
    else:
        row_len = attention_mask.view(torch.int8).sum(dim=1, dtype=torch.int32).long()
    return out.to(out_dtype), (row_max + 1 - row_len).unsqueeze(1)


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
    token_types = _small_int(token_types)
    if attention_mask is not None and not _each_row_contiguous(attention_mask):
        token_types, attention_mask, _ = _compact(token_types, attention_mask)
    for _ in _match(_scan(token_types, attention_mask), kinds, grids, spatial_merge_size):
        pass


def _small_int(token_types: torch.Tensor) -> torch.Tensor:
    # int8 comparisons and nonzero are several times faster than bool or int64 ones
    return token_types.to(torch.int8).contiguous()


def _each_row_contiguous(mask: torch.Tensor) -> bool:
    """True when each sample's valid tokens form one span (left or right padding, no holes)."""
    flags = mask.view(torch.int8)
    rises = (flags[:, 1:] > flags[:, :-1]).view(torch.int8).sum(dim=1, dtype=torch.int32) + flags[:, 0]
    return bool(rises.max() <= 1)


def _compact(token_types: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each sample's valid tokens to the front, in order; ``order`` maps them back."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    lengths = mask.view(torch.int8).sum(dim=1, keepdim=True, dtype=torch.int64)
    compact_mask = torch.arange(mask.shape[1], device=mask.device) < lengths
    return token_types.gather(1, order), compact_mask, order


@dataclasses.dataclass(frozen=True)
class _Runs:
    """Media placeholder runs of a batch in reading order, and their tokens."""

    start: torch.Tensor  # flat index (row * L + column) of each run's first token
    length: torch.Tensor
    type: torch.Tensor
    row: torch.Tensor  # sample index
    tokens: torch.Tensor  # flat index of every media token
    token_run: torch.Tensor  # run of every media token
    first_token: torch.Tensor  # index into ``tokens`` of each run's first token

    @property
    def count(self) -> int:
        return self.start.numel()


def _scan(token_types: torch.Tensor, attention_mask: torch.Tensor | None) -> _Runs:
    length = token_types.shape[1]
    media = token_types if attention_mask is None else token_types * attention_mask.view(torch.int8)
    tokens = media.view(-1).nonzero().squeeze(1)
    types_ = token_types.view(-1).index_select(0, tokens).long()
    new_run = torch.ones(tokens.numel(), dtype=torch.bool, device=tokens.device)
    new_run[1:] = (tokens[1:] != tokens[:-1] + 1) | (types_[1:] != types_[:-1])
    if bool(media[:, -1].any()):  # a run ending a row must not continue into the next one
        new_run[1:] |= tokens[1:] % length == 0
    first_token = new_run.nonzero().squeeze(1)
    start = tokens.index_select(0, first_token)
    run_length = torch.diff(first_token, append=first_token.new_tensor([tokens.numel()]))
    return _Runs(
        start=start,
        length=run_length,
        type=types_.index_select(0, first_token),
        row=start // length,
        tokens=tokens,
        token_run=new_run.cumsum(0) - 1,
        first_token=first_token,
    )


def _match(runs: _Runs, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int):
    """Yield ``(kind, runs of that kind, their grids)`` after checking they agree."""
    known = runs.type.new_tensor([kind.type_id for kind in kinds])
    unknown = runs.type[~torch.isin(runs.type, known)]
    if unknown.numel():
        raise InvalidInputError(
            f"mm_token_type_ids holds type {int(unknown[0])}, which this family does not place; "
            f"known media types: {known.tolist()}"
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
            f"The sequence was probably truncated before a {kind.name} (drop the grids of removed "
            f"{kind.name}s), or the inputs come from another processor than the engine's"
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
