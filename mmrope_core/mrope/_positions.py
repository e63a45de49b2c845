"""Positions of batches and packed rows from token types and grids: the kernel's functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from ..compiled import native
from ..errors import InvalidInputError, SegmentCutError
from ..items import ItemKernel, ItemLayout
from ..items._kernel import Arrays, host_grid
from ..temporal import TemporalRule
from ._layout import COMPUTED_SECONDS, UNTIMED, item_name, types_layout
from ._media import MediaGrids, MediaKind
from ._mismatch import match
from ._runs import Runs, Spans, scan


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
    positions, deltas = _placed(False, token_types, attention_mask, kinds, grids, spatial_merge_size, cu_seqlens,
                                resume_past_frames)
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
    positions, _ = _placed(True, token_types, attention_mask, kinds, grids, spatial_merge_size, cu_seqlens,
                           resume_past_frames)
    return positions


def _placed(text_row: bool, token_types: torch.Tensor, mask: torch.Tensor | None, kinds: Sequence[MediaKind],
            grids: Mapping[int, MediaGrids | None], merge: int, cu_seqlens: Any,
            resume_past_frames: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The runs of each kind placed as items of the token types (see :func:`._layout.types_layout`)."""
    types = _small_int(token_types)
    if cu_seqlens is not None:
        packed_without_mask(tuple(types.shape), mask)
    present = np.bincount(types.cpu().numpy().reshape(-1).view(np.uint8), minlength=128)
    present[[0, *(kind.type_id for kind in kinds if 0 < kind.type_id < 128)]] = 0
    if present.any():  # a type no kind places: said as the runs' reading says it
        check_placeholders(types, mask, kinds, grids, spatial_merge_size=merge)
    if cu_seqlens is not None and not isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = torch.from_numpy(np.asarray(cu_seqlens))
    kernel = _TypesKernel(kinds, grids, merge, resume_past_frames)
    if kernel.half and not kernel.frames_fit(grids, types.numel()):  # before sizing an array by the grids
        check_placeholders(types, mask, kinds, grids, spatial_merge_size=merge)
        raise InvalidInputError("the temporal scales do not fit the grids: give one scale per grid")
    return kernel.placed(text_row, types.to(torch.int64), mask, cu_seqlens, kernel.inputs(grids))


class _TypesKernel(ItemKernel):
    """Token types placed as items, each kind's grids under its grid key."""

    def __init__(self, kinds: Sequence[MediaKind], grids: Mapping[int, MediaGrids | None], merge: int,
                 resume_past_frames: bool) -> None:
        self.kinds, self.merge = tuple(kinds), merge
        self.scales = {kind.type_id: _host(media.temporal_scale) for kind in kinds
                       if (media := grids.get(kind.type_id)) is not None and media.temporal_scale is not None}
        self.half = any(scale.dtype not in COMPUTED_SECONDS for scale in self.scales.values())
        if self.half and len(self.scales) > 1:
            raise ValueError("mrope_positions scales one kind at most in half precision")
        names = [kind.grid_key for kind in kinds]
        self.keys_of = {kind.type_id: kind.grid_key if names.count(kind.grid_key) == 1 else
                        f"{kind.grid_key} (type {kind.type_id})" for kind in kinds}
        keys = {item_name(kind): (self.keys_of[kind.type_id], f"{self.keys_of[kind.type_id]} temporal scale")
                if kind.type_id in self.scales else self.keys_of[kind.type_id] for kind in kinds}
        super().__init__(types_layout(self.kinds, merge, frozenset(self.scales), self._rule(), resume_past_frames,
                                      self.half), keys)

    def _rule(self) -> TemporalRule:
        """The rule the scales were worked out by: ``f * scale``, or ``(f * seconds) * per_second``
        for ``(n, 2)`` scales, in the scale's dtype."""
        if self.half or not self.scales:
            return UNTIMED
        forms = {(scale.dim(), scale[0, 1].item() if scale.dim() == 2 and len(scale) else 1)
                 for scale in self.scales.values()}
        if len(forms) != 1:
            raise ValueError("mrope_positions: the kinds' temporal scales must come from one rule")
        (dims, per_second), = forms
        return TemporalRule(per_second, "frame_first" if dims == 2 else "scale_first", "seconds")

    def inputs(self, grids: Mapping[int, MediaGrids | None]) -> dict[str, Any]:
        given: dict[str, Any] = {}
        for kind in self.kinds:
            media = grids.get(kind.type_id)
            if media is not None:
                given[self.keys_of[kind.type_id]] = media.grid
        if not self.half:
            for type_id, scale in self.scales.items():
                given[f"{self.keys_of[type_id]} temporal scale"] = scale[:, 0] if scale.dim() == 2 else scale
        return given

    def frames_fit(self, grids: Mapping[int, MediaGrids | None], tokens: int) -> bool:
        """The scaled kind's grids are frames a batch of ``tokens`` holds, one scale a grid."""
        (type_id, scale), = self.scales.items()
        grid = grids[type_id].grid  # type: ignore[union-attr]
        return (isinstance(grid, torch.Tensor) and grid.dim() == 2 and grid.shape[1] == 3 and not grid.is_floating_point()
                and len(grid) == len(scale) and (not len(grid) or (int(grid[:, 0].min()) >= 1
                                                                    and int(grid[:, 0].sum()) <= tokens)))

    def media_arrays(self, inputs: Mapping[str, Any]) -> tuple[Arrays, Arrays]:
        if not self.half:
            return super().media_arrays(inputs)
        media = tuple(None if (grid := inputs.get(self.keys_of[kind.type_id])) is None else host_grid(kind.grid_key, grid)
                      for kind in self.kinds)
        seconds: list[np.ndarray | None] = [None] * len(self.kinds)
        (type_id, scale), = self.scales.items()
        index = [kind.type_id for kind in self.kinds].index(type_id)
        grid = media[index]
        if grid is not None and len(grid):  # (bounded by the batch in _placed)
            seconds[index] = temporal_ids_by_frame(torch.from_numpy(grid[:, 0]), scale)
        return media, tuple(seconds)

    def refuse(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
               first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
               inputs: Mapping[str, Any]) -> NoReturn:
        self.explain(layout, enabled, ids, mask, first, count, media, seconds, inputs)  # the runs' messages first
        super().refuse(layout, enabled, ids, mask, first, count, media, seconds, inputs)

    def explain(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
                first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
                inputs: Mapping[str, Any]) -> None:
        grids = {kind.type_id: None if (grid := inputs.get(self.keys_of[kind.type_id])) is None else MediaGrids(grid)
                 for kind in self.kinds}
        types = ids.to(torch.int8)
        if first is not None:
            assert count is not None
            in_segments_explained(types, first, count, self.kinds, grids, self.merge)
        else:
            check_placeholders(types, mask, self.kinds, grids, spatial_merge_size=self.merge)


def temporal_ids_by_frame(frames: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """Each frame's temporal id before truncation, grid after grid (``frames`` a grid): its int64
    number times its grid's scale in the scale's dtype, as the reference multiplies them; as
    float32, which holds half-precision products exactly."""
    number = torch.arange(int(frames.sum())) - torch.repeat_interleave(frames.cumsum(0) - frames, frames)
    scale = torch.repeat_interleave(scale, frames, dim=0)
    values = number * scale[:, 0] * scale[:, 1] if scale.dim() == 2 else number * scale
    return values.to(torch.float32).numpy()


def packed_without_mask(shape: tuple[int, ...], mask: Any) -> None:
    """Refuse ``cu_seqlens`` beside a mask or over several rows: it describes one packed row."""
    if shape[0] != 1 or mask is not None:
        raise InvalidInputError(f"cu_seqlens describes one packed (1, L) row without a mask, got a batch of shape "
                                f"{tuple(shape)}{' with a mask' if mask is not None else ''}")


def in_segments_explained(types: torch.Tensor, first: np.ndarray, count: np.ndarray, kinds: Sequence[MediaKind],
                          grids: Mapping[int, MediaGrids | None], merge: int) -> None:
    """Raise the runs' error for a packed row whose runs do not fit its grids, each segment read
    alone; a run going on across a boundary whose parts do not fit is an item cut in two."""
    runs, _ = scan(_small_int(types))
    bounds = np.append(first, first[-1] + count[-1]) if len(first) else np.zeros(1, dtype=np.int64)
    runs, _, cut = _in_segments(runs, (1, types.shape[-1]), None, bounds)
    if cut is not None:  # (called where the runs do not fit the grids)
        raise SegmentCutError(*cut)
    for _ in match(runs, kinds, grids, merge):
        pass


def _host(scale: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A scale on the host, integers as int64 (int64 frame numbers times them give int64)."""
    scale = scale.detach().cpu() if isinstance(scale, torch.Tensor) else torch.from_numpy(np.asarray(scale))
    return scale.long() if not scale.is_floating_point() and scale.dtype != torch.int64 else scale


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
