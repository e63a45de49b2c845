"""Positions of batches and packed rows from token types and grids: the kernel's functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..compiled import native
from ..errors import InvalidInputError, SegmentCutError
from ._media import MediaGrids, MediaKind
from ._mismatch import explain, match
from ._runs import Runs, Spans, grids_of_runs, scan
from ._write import write


def mrope_positions(
    token_types: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kinds: Sequence[MediaKind],
    grids: Mapping[int, MediaGrids | None],
    *,
    spatial_merge_size: int,
    out_dtype: torch.dtype = torch.int64,
    cu_seqlens: torch.Tensor | np.ndarray | None = None,
    resume_past_frames: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(3, B, L)`` (0 at padding) and deltas ``(B, 1)`` (``max + 1 - valid length``),
    as a family's ``get_rope_index`` returns them.

    ``attention_mask`` is a bool ``(B, L)`` tensor or None. With ``cu_seqlens`` (``(K + 1,)``
    boundaries from 0 to L, increasing) the batch is one packed row of K samples and no mask:
    positions restart at 0 in every segment, deltas are ``(K, 1)``, and sample k in errors is
    segment k. Raises :class:`~mmrope_core.PlaceholderMismatchError` naming the sample when
    placeholder runs and grids disagree in number or size, or a run crosses a segment boundary.
    With ``resume_past_frames`` (a rollout engine's rule), the text after a run resumes past its last
    frame's temporal id too, where that is further than ``max(h, w)``.
    """
    positions, deltas = _computed(token_types, attention_mask, kinds, grids, spatial_merge_size, text_row=False,
                                  cu_seqlens=cu_seqlens, resume_past_frames=resume_past_frames)
    return (positions if positions.dtype == out_dtype else positions.to(out_dtype)), deltas


def mrope_position_ids(
    token_types: torch.Tensor,
    attention_mask: torch.Tensor | None,
    kinds: Sequence[MediaKind],
    grids: Mapping[int, MediaGrids | None],
    *,
    spatial_merge_size: int,
    cu_seqlens: torch.Tensor | np.ndarray | None = None,
    resume_past_frames: bool = False,
) -> torch.Tensor:
    """The ``(B, 4, L)`` int64 layout of ``RopeEngine.compute_position_ids`` in one pass: row 0
    counts each sample's valid tokens from 0 (1 at padding), rows 1 to 3 are the positions
    :func:`mrope_positions` returns: a kernel's ``position_ids``. With ``cu_seqlens``, as in
    :func:`mrope_positions`, every row restarts at 0 in every segment."""
    positions, _ = _computed(token_types, attention_mask, kinds, grids, spatial_merge_size, text_row=True,
                             cu_seqlens=cu_seqlens, resume_past_frames=resume_past_frames)
    return positions


def _computed(token_types, attention_mask, kinds, grids, merge, *, text_row, cu_seqlens=None, resume_past_frames=False):
    token_types = _small_int(token_types)
    code = _coded(token_types, attention_mask)
    runs, spans = scan(code, padded=attention_mask is not None)
    cut = None
    if cu_seqlens is not None:
        runs, spans, cut = _in_segments(runs, code.shape, attention_mask, cu_seqlens)
    if spans is None:  # padding inside a sample
        return _compacted(token_types, attention_mask, kinds, grids, merge, text_row, resume_past_frames)
    matched = grids_of_runs(runs, kinds, grids, merge)
    if matched is None:
        if cut is not None:  # a run split at a boundary, whose parts do not fit the grids: an item cut in two
            raise SegmentCutError(*cut)
        explain(runs, kinds, grids, merge)
    return write(code, attention_mask, runs, spans, matched.grid, matched.scaled, merge, text_row=text_row,
                 resume_past_frames=resume_past_frames)


def _in_segments(runs: Runs, shape: tuple[int, int], attention_mask: torch.Tensor | None,
                 cu_seqlens: torch.Tensor | np.ndarray) -> tuple[Runs, Spans, tuple[tuple[int, ...], str] | None]:
    """The runs of one packed row, each segment read as the sample alone (a run that goes on
    across a boundary is two runs), and the segments as samples. Also, where runs were split,
    the segments whose start split one and where the first starts: an item cut in two when the
    parts do not fit the grids."""
    if shape[0] != 1 or attention_mask is not None:
        raise InvalidInputError(f"cu_seqlens describes one packed (1, L) row without a mask, got a batch of shape "
                                f"{tuple(shape)}{' with a mask' if attention_mask is not None else ''}")
    bounds = cu_seqlens.cpu().numpy() if isinstance(cu_seqlens, torch.Tensor) else np.asarray(cu_seqlens)
    bounds = bounds.astype(np.int64, copy=False)
    covers = bounds.ndim == 1 and bounds.size >= 2 and bounds[0] == 0 and bounds[-1] == shape[1]
    count = bounds[1:] - bounds[:-1] if covers else np.zeros(1, dtype=np.int64)
    if not covers or count.min() <= 0:
        raise InvalidInputError(f"cu_seqlens must increase from 0 to the row length {shape[1]}, got {bounds.tolist()}")
    first = bounds[:-1]
    spans = Spans(count, first, bounds[1:] - 1)
    start, end = runs.start, runs.start + runs.length
    segment = first.searchsorted(start, side="right") - 1
    # the boundaries strictly inside each run: bounds[segment + 1 : last]
    last = bounds.searchsorted(end, side="left")
    splits = last - segment - 1
    if not splits.any():
        return Runs(start, runs.length, runs.type, segment), spans, None
    pieces = splits + 1
    run_of = np.arange(runs.count).repeat(pieces)
    nth = np.arange(run_of.size) - (np.add.accumulate(pieces) - pieces)[run_of]  # piece within its run
    piece_segment = segment[run_of] + nth
    piece_start = np.where(nth == 0, start[run_of], first[piece_segment])
    piece_end = np.minimum(end[run_of], bounds[piece_segment + 1])
    cut = piece_segment[nth > 0]
    where = f"token {int(first[cut[0]])}"
    return Runs(piece_start, piece_end - piece_start, runs.type[run_of], piece_segment), spans, (tuple(cut.tolist()), where)


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
    runs, spans = scan(_coded(token_types, attention_mask))
    if spans is None:
        assert attention_mask is not None  # padding inside a sample needs a mask
        token_types, attention_mask, _ = _compact(token_types, attention_mask)
        runs, _ = scan(_coded(token_types, attention_mask))
    for _ in match(runs, kinds, grids, spatial_merge_size):
        pass


def _small_int(token_types: torch.Tensor) -> torch.Tensor:
    """The token types as int8 (whose arithmetic moves an eighth of the memory int64 does),
    after checking they are 0 (text) to 127."""
    if token_types.device.type == "cpu":  # numpy's reductions over bytes are several times faster
        values = token_types.numpy()
        low, high = values.min(), values.max() if values.dtype != np.int8 else 0
    elif token_types.dtype == torch.int8:
        low, high = token_types.min(), 0
    else:
        low, high = torch.aminmax(token_types)
    if int(low) < 0 or int(high) > 127:
        raise InvalidInputError(
            f"mm_token_type_ids must hold 0 for text and 1 to 127 for media types, found "
            f"{int(low) if int(low) < 0 else int(high)}; build them with the plugin's token types"
        )
    return (token_types if token_types.dtype == torch.int8 else token_types.to(torch.int8)).contiguous()


def _coded(token_types: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The token types with -1 at masked tokens (``type * valid + valid - 1``)."""
    if mask is None:
        return token_types
    if mask.device.type == "cpu" and native is not None:
        code = torch.empty(token_types.shape, dtype=torch.int8)
        native.coded(token_types.numpy(), mask.contiguous().numpy(), code.numpy())
        return code
    valid = mask.view(torch.int8)
    return torch.addcmul(valid - 1, token_types, valid)


def _compact(token_types: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move each sample's valid tokens to the front, in order; ``order`` maps them back."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    lengths = mask.view(torch.int8).sum(dim=1, keepdim=True, dtype=torch.int64)
    compact_mask = torch.arange(mask.shape[1], device=mask.device) < lengths
    return token_types.gather(1, order), compact_mask, order


def _compacted(token_types, mask, kinds, grids, merge, text_row,
               resume_past_frames=False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positions for masks with padding inside a sample: computed with each sample's valid tokens
    moved to the front, then put back."""
    compact_types, compact_mask, order = _compact(token_types, mask)
    compact, deltas = _computed(compact_types, compact_mask, kinds, grids, merge, text_row=text_row,
                                resume_past_frames=resume_past_frames)
    order = order.unsqueeze(1 if text_row else 0).expand_as(compact)
    return torch.zeros_like(compact).scatter_(2, order, compact), deltas
