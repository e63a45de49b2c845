"""A batched M-RoPE kernel for Qwen-style layouts, for plugins to build on.

The sequence of a sample is cut into runs of equal token type (0 text, >0 a media kind).
Media runs take the media's grids in order across the batch. Text tokens count up from where the
previous run left off; a media run places its tokens on a ``(t, h, w)`` grid starting at the
current position and then advances it by ``max(h, w) // merge``, the rule of transformers'
Qwen2-VL family.

The work is done with whole-tensor operations, no Python loop over tokens, samples or media, and
as little of it per token as possible: runs are found from the few places where the token type
changes, text positions come from one cumsum, and media positions from a table with one entry
per line of each grid.
"""

from __future__ import annotations

import dataclasses
import itertools
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
        if any(not isinstance(token, int) or not 0 <= token < 2**31 for token in types):
            raise ValueError(f"token ids must be between 0 and 2**31 - 1, got {list(types)}")
        self.types = dict(types)

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        # In-place comparisons on an int32 copy are several times faster than comparisons that
        # produce bool. Ids that do not fit int32 are no token of any vocabulary; they are read
        # modulo 2**32.
        types = None
        for token, media_type in self.types.items():
            match = input_ids.to(torch.int32, copy=True).eq_(token)
            if types is None:
                types = match.mul_(media_type) if media_type != 1 else match
            else:
                types.add_(match, alpha=media_type)
        if types is None:
            return torch.zeros(input_ids.shape, dtype=torch.int8, device=input_ids.device)
        return types.to(torch.int8)

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
    # Inference mode skips autograd's bookkeeping, a fifth of the cost of the many small
    # operations here; the results are allocated outside it, so callers get ordinary tensors.
    with torch.inference_mode():
        try:
            runs = _scan(token_types, attention_mask)
            run_grid, scaled = _grids_of_runs(runs, kinds, grids, spatial_merge_size)
        except PlaceholderMismatchError:
            # The runs were read assuming one span of valid tokens per sample; with padding
            # inside a sample, a placeholder run the padding interrupts is still one run.
            if not _has_holes(attention_mask):
                raise
            placed = None
        else:
            placed = _place(token_types.shape, attention_mask, runs, run_grid, scaled, spatial_merge_size)
    if placed is None:
        return _compacted(token_types, attention_mask, kinds, grids, spatial_merge_size, out_dtype)
    positions, deltas = placed
    return positions.to(out_dtype), deltas.clone()


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
    if _has_holes(attention_mask):
        token_types, attention_mask, _ = _compact(token_types, attention_mask)
    for _ in _match(_scan(token_types, attention_mask), kinds, grids, spatial_merge_size):
        pass


def _small_int(token_types: torch.Tensor) -> torch.Tensor:
    # int8 arithmetic moves an eighth of the memory int64 does
    return token_types.to(torch.int8).contiguous()


@dataclasses.dataclass(frozen=True)
class _Spans:
    """Where each sample's valid tokens lie, assuming they form one span (left or right padding).

    ``first`` and ``last`` are flat indices (``row * L + column``); a sample without valid tokens
    has ``last = first - 1``.
    """

    count: torch.Tensor
    leading: torch.Tensor | None  # whether column 0 is valid; None without a mask
    first: torch.Tensor
    last: torch.Tensor

    @classmethod
    def of(cls, mask: torch.Tensor | None, shape: tuple[int, int], device: torch.device) -> _Spans:
        batch, length = shape
        row_start = torch.arange(0, batch * length, length, device=device)
        if mask is None:
            count = torch.full((batch,), length, dtype=torch.int64, device=device)
            return cls(count, None, row_start, row_start + (length - 1))
        count = mask.view(torch.int8).sum(dim=1, dtype=torch.int32).long()
        leading = mask[:, 0]
        first = row_start + torch.where(leading, 0, length - count)
        return cls(count, leading, first, first + count - 1)


def _has_holes(mask: torch.Tensor | None) -> bool:
    """True when some sample's valid tokens do not form one span (padding inside a sample)."""
    if mask is None:
        return False
    flags = mask.view(torch.int8)
    rises = (flags[:, 1:] > flags[:, :-1]).view(torch.int8).sum(dim=1, dtype=torch.int32) + flags[:, 0]
    return bool(rises.max() > 1)


def _compact(token_types: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each sample's valid tokens to the front, in order; ``order`` maps them back."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    lengths = mask.view(torch.int8).sum(dim=1, keepdim=True, dtype=torch.int64)
    compact_mask = torch.arange(mask.shape[1], device=mask.device) < lengths
    return token_types.gather(1, order), compact_mask, order


def _compacted(token_types, mask, kinds, grids, merge, out_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions for masks with padding inside a sample: computed with each sample's valid tokens
    moved to the front, then put back."""
    compact_types, compact_mask, order = _compact(token_types, mask)
    compact, deltas = mrope_positions(compact_types, compact_mask, kinds, grids, spatial_merge_size=merge,
                                      out_dtype=out_dtype)
    out = torch.zeros_like(compact)
    return out.scatter_(2, order.unsqueeze(0).expand_as(compact), compact), deltas


@dataclasses.dataclass(frozen=True)
class _Runs:
    """Media placeholder runs of a batch in reading order."""

    start: torch.Tensor  # flat index (row * L + column) of each run's first token
    length: torch.Tensor
    type: torch.Tensor
    row: torch.Tensor  # sample index

    @property
    def count(self) -> int:
        return self.start.numel()


def _scan(token_types: torch.Tensor, attention_mask: torch.Tensor | None) -> _Runs:
    """The runs of valid media tokens, read off the places where the token type changes."""
    batch, length = token_types.shape
    if attention_mask is not None:  # masked tokens are never media
        token_types = token_types * attention_mask.view(torch.int8)
    flat = token_types.view(-1)
    change = _nonzero(flat[1:] - flat[:-1])  # p such that flat[p] != flat[p + 1]
    starts = change[flat.index_select(0, change + 1) != 0] + 1
    ends = change[flat.index_select(0, change) != 0]
    if bool(token_types[:, :: max(length - 1, 1)].any()):
        # Media at a row's edge: a run must end with its row, even where the next row begins
        # with the same placeholder, and the batch's first and last tokens have no neighbour.
        starts, ends = _split_at_rows(flat, starts, ends, batch, length)
    return _Runs(start=starts, length=ends - starts + 1, type=flat.index_select(0, starts).long(), row=starts // length)


def _split_at_rows(flat, starts, ends, batch, length):
    row_start = torch.arange(0, batch * length, length, device=flat.device)
    row_end = row_start + (length - 1)
    inner_starts = starts[starts % length != 0]
    inner_ends = ends[(ends + 1) % length != 0]
    starts = torch.cat((inner_starts, row_start[flat.index_select(0, row_start) != 0])).sort().values
    ends = torch.cat((inner_ends, row_end[flat.index_select(0, row_end) != 0])).sort().values
    return starts, ends


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


def _grids_of_runs(runs: _Runs, kinds, grids, merge) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each run's ``(t, h, w)`` grid, and the runs whose temporal ids are scaled, with their scales.

    The runs of each kind take that kind's grids in order. The common case is checked in a few
    whole-batch operations; anything off is diagnosed run by run by :func:`_match`.
    """
    kinds = sorted(kinds, key=lambda kind: kind.type_id)
    given = [(kind, grids.get(kind.type_id)) for kind in kinds]
    given = [(kind, media) for kind, media in given if media is not None and media.grid_thw.shape[0]]
    try:
        counts = torch.bincount(runs.type, minlength=kinds[-1].type_id + 1).tolist()
    except RuntimeError:  # a negative type, which _match names
        return _grids_of_runs_checked(runs, kinds, grids, merge)
    expected = [0] * (kinds[-1].type_id + 1)
    for kind, media in given:
        expected[kind.type_id] = media.grid_thw.shape[0]
    if counts != expected[: len(counts)] or sum(expected) != runs.count or not all(
        media.grid_thw.dim() == 2 and media.grid_thw.shape[1] == 3 for _, media in given
    ):
        return _grids_of_runs_checked(runs, kinds, grids, merge)
    if not given:
        return torch.zeros(0, 3, dtype=torch.int64, device=runs.start.device), []
    grid = given[0][1].grid_thw if len(given) == 1 else torch.cat([media.grid_thw for _, media in given])
    grid = grid.to(device=runs.start.device, dtype=torch.int64)
    order = torch.argsort(runs.type, stable=True) if len(given) > 1 else None
    found = runs.length if order is None else runs.length.index_select(0, order)
    fits = (grid > 0).all() & (grid[:, 1:] % merge == 0).all() & torch.equal(found * (merge * merge), grid.prod(dim=1))
    if not bool(fits):
        return _grids_of_runs_checked(runs, kinds, grids, merge)
    if order is None:
        run_grid, kind_runs = grid, [slice(None)]
    else:
        run_grid = torch.empty_like(grid).index_copy_(0, order, grid)
        ends = itertools.accumulate(media.grid_thw.shape[0] for _, media in given)
        kind_runs = [order[end - media.grid_thw.shape[0] : end] for end, (_, media) in zip(ends, given)]
    scaled = [
        (runs_of_kind, media.temporal_scale.to(runs.start.device))
        for runs_of_kind, (_, media) in zip(kind_runs, given)
        if media.temporal_scale is not None
    ]
    return run_grid, scaled


def _grids_of_runs_checked(runs: _Runs, kinds, grids, merge):
    run_grid = torch.zeros(runs.count, 3, dtype=torch.int64, device=runs.start.device)
    scaled: list[tuple[torch.Tensor, torch.Tensor]] = []
    for kind, kind_runs, grid in _match(runs, kinds, grids, merge):
        if kind_runs.numel():
            run_grid[kind_runs] = grid
            media = grids.get(kind.type_id)
            if media is not None and media.temporal_scale is not None:
                scaled.append((kind_runs, media.temporal_scale.to(runs.start.device)))
    return run_grid, scaled


def _place(shape, mask, runs: _Runs, run_grid, scaled, merge) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Positions and deltas, or None when the mask turns out to have padding inside a sample.

    One cumsum places every text token: a counter row holds 1 per valid token, the jump after
    each media run, -1 at a sample's first valid token (so that it counts from 0) and, after its
    last one, minus everything counted so far (so that right padding stays 0).
    """
    batch, length = shape
    size = batch * length
    spans = _Spans.of(mask, shape, runs.start.device)
    hw = run_grid[:, 1:] // merge
    grid_h, grid_w = hw.unbind(1)
    after = runs.start + runs.length
    # the jump after a run, placed on the token after it (none when the run ends its row)
    jump = (hw.amax(dim=1) - runs.length) * (after % length != 0)
    jumps = torch.zeros_like(spans.count).index_add_(0, runs.row, jump)
    # no tail fix-up for a sample ending its row (or without valid tokens)
    tail = (1 - spans.count - jumps) * ((spans.last + 1) % length != 0)

    with torch.inference_mode(False):
        out = torch.empty(3, batch, length, dtype=torch.int64, device=spans.count.device)
    counter = out[1]
    if mask is None:
        counter.fill_(1)
    else:
        counter.copy_(mask)
    counter.view(-1).index_put_(
        (torch.cat((spans.first, after, spans.last + 1)).clamp_(max=size - 1),),
        torch.cat((-(spans.count > 0).long(), jump, tail)),
        accumulate=True,
    )
    text = torch.cumsum(counter, dim=1, out=out[0]).view(-1)
    run_pos = text.index_select(0, runs.start)
    row_max = text.index_select(0, spans.last)
    if mask is not None and not _spans_hold(text, spans, runs, after, jump):
        return None
    out[1].copy_(out[0])  # two plain copies are faster than one from an expanded view
    out[2].copy_(out[0])
    if runs.count:
        positions, tokens, run_max = _media_positions(runs, run_pos, run_grid[:, 0], grid_h, grid_w, scaled)
        out.view(3, -1).index_copy_(1, tokens, positions)
        # The largest position of a sample, as the reference takes it over its valid tokens and
        # three axes: its last text token, or a media run's largest id.
        row_max.index_fill_(0, runs.row[after - 1 == spans.last.index_select(0, runs.row)], 0)
        row_max = row_max.scatter_reduce(0, runs.row, run_max, reduce="amax")
    return out, (row_max + 1 - spans.count).unsqueeze(1)


def _spans_hold(text, spans: _Spans, runs: _Runs, after, jump) -> bool:
    """Whether every sample's valid tokens lie in ``first..last``, read off the counter's cumsum:
    the valid tokens counted up to ``last`` (right padding) or before ``first`` (left padding)."""
    probe = torch.where(spans.leading, spans.last, spans.first - 1)
    counted = (after <= probe.index_select(0, runs.row)) * jump
    valid_before = text.index_select(0, probe) + spans.leading - torch.zeros_like(spans.count).index_add_(0, runs.row, counted)
    return torch.equal(valid_before, spans.count * spans.leading)


def _media_positions(runs: _Runs, run_pos, frames, grid_h, grid_w, scaled):
    """``(3, N)`` positions of the media tokens, their ``(N,)`` flat indices, and each run's
    largest position.

    Per token there is only a gather and an add: every line of ``grid_w`` tokens of a grid gets
    one entry ``(t, h, w - token number, flat index - token number)`` and each token adds its
    number to the last two.
    """
    device = run_pos.device
    lines_of_run = frames * grid_h
    line_run = torch.repeat_interleave(lines_of_run)
    first_token = runs.length.cumsum(0) - runs.length
    per_run = torch.stack(
        (lines_of_run.cumsum(0) - lines_of_run, grid_h, grid_w, run_pos, run_pos - first_token, runs.start - first_token)
    )
    first_line, height, width, pos, w_base, token_base = per_run.gather(1, line_run.expand(6, -1))
    line = torch.arange(line_run.numel(), device=device).sub_(first_line)
    frame = line // height
    temporal = frame
    last_frame = frames - 1
    for kind_runs, scale in scaled:
        # the reference multiplies int64 frame numbers in the scale's dtype, then truncates
        last_frame[kind_runs] = (last_frame[kind_runs] * scale).long()
        scale_of_run = torch.full((runs.count,), -1, dtype=torch.int64, device=device)
        scale_of_run[kind_runs] = torch.arange(scale.numel(), device=device)
        line_scale = scale_of_run.index_select(0, line_run)
        selected = (line_scale >= 0).nonzero().squeeze(1)
        temporal = temporal.clone() if temporal is frame else temporal
        temporal[selected] = (frame[selected] * scale[line_scale[selected]]).long()
    table = torch.stack((pos + temporal, pos + line - frame * height, w_base - line * width, token_base))
    token_line = torch.repeat_interleave(width)
    per_token = table.gather(1, token_line.expand(4, -1))  # gather: index_select on dim 1 is much slower
    per_token[2:].add_(torch.arange(token_line.numel(), device=device))
    run_max = run_pos + torch.maximum(last_frame, torch.maximum(grid_h, grid_w) - 1)
    return per_token[:3], per_token[3], run_max


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
