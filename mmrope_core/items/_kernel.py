"""A kernel placing a family's media items by its :class:`ItemLayout`: every layout the engine
hands it (batches padded on either side, packed rows, the model's four rows) in one pass."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from ..errors import InvalidInputError, PlaceholderMismatchError, SegmentCutError, counted
from ..inputs import read_generated_mask
from ..kernel import RopeKernel
from ..media import read_audio_lengths, read_grid, read_seconds, read_stamps
from ._layout import ItemLayout
from ._read import cut_by
from ._spec import BAD_MEDIA, EMPTY_SAMPLE, PADDING_INSIDE, PLACED, GridMedia

Arrays = tuple[np.ndarray | None, ...]
_SECONDS = (torch.float32, torch.float64, torch.int64)  # the dtypes the layout reads seconds in


class ItemKernel(RopeKernel):
    """The positions of a family whose reference lays out media items between markers, from its
    :class:`ItemLayout`, on the compiled loops where they are loaded and in numpy elsewhere.

    ``keys`` name, for each medium of the layout, the keyword of :meth:`rope_index` that gives
    it: ``{"video": ("clip_grids", "clip_seconds"), "audio": "sound_lengths"}`` (a timed
    grid medium: its grids' keyword and its seconds', a float32 or float64 tensor read in its
    dtype, integers as int64, a list as float32, as the layout's temporal rule reads them; a
    stamped one: its grids' and its time stamps', one a frame, grid after grid). ``switches``:
    other keywords a family's reference takes, which :meth:`layout_for` reads. A family whose
    reference changes its layout with the inputs (no grids given, a flag) overrides
    :meth:`layout_for`; one with messages of its own overrides :meth:`explain`.
    ``reads_generated_mask``: :meth:`rope_index` and :meth:`position_ids` take ``generated_mask``
    and place the runs of generated tokens where a rollout engine decodes them (see
    :meth:`ItemLayout.place`; int64 positions only).

    Example::

        kernel = ItemKernel(layout, {"video": ("clip_grids", "clip_seconds"), "audio": "sound_lengths"})
        positions, deltas = kernel.rope_index(input_ids, attention_mask, clip_grids=..., ...)
    """

    places_packed_rows = True
    samples_independent = True  # every row computed alike: the conformance suite holds it to that

    def __init__(self, layout: ItemLayout, keys: Mapping[str, str | Sequence[str]], *,
                 switches: Collection[str] = (), position_dtype: torch.dtype | None = None,
                 reads_generated_mask: bool = False) -> None:
        if reads_generated_mask and layout.out_dtype != torch.int64:
            raise ValueError("ItemKernel(reads_generated_mask=True) places generated tokens in int64 positions: the "
                             "layout must write int64 (dtype=torch.int64, or truncated=True)")
        self.layout = layout
        self.reads_generated_mask = reads_generated_mask
        self.position_dtype = layout.out_dtype if position_dtype is None else position_dtype
        self._media: list[tuple[bool, str, str | None, str]] = []
        self._stamped = frozenset(medium.name for medium in layout.media
                                  if isinstance(medium, GridMedia) and medium.stamped)
        for medium in layout.media:
            given = keys.get(medium.name)
            timed = isinstance(medium, GridMedia) and (medium.timed or medium.stamped)
            if isinstance(given, str) and not timed:
                key, seconds_key = given, None
            elif isinstance(given, (tuple, list)) and len(given) == 2 and timed:
                key, seconds_key = given
            else:
                what = "time stamps" if medium.name in self._stamped else "seconds per grid"
                raise ValueError(f"ItemKernel keys must give the keyword of medium {medium.name!r}"
                                 f"{f' and of its {what}, as a pair' if timed else ''}")
            self._media.append((isinstance(medium, GridMedia), key, seconds_key, medium.name))
        self.keys = tuple(name for _, key, seconds_key, _ in self._media for name in (key, seconds_key) if name)
        self.keys += tuple(switches)
        self._known = self.input_keys = frozenset(self.keys)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, generated_mask: torch.Tensor | None = None,
                   **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, B, L)`` positions and ``(B, 1)`` deltas; with ``cu_seqlens`` (``(K + 1,)``
        boundaries from 0 to L) one packed ``(1, L)`` row of K samples, each placed as it is
        alone, and ``(K, 1)`` deltas."""
        return self.placed(False, input_ids, attention_mask, cu_seqlens, inputs, generated_mask)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, generated_mask: torch.Tensor | None = None,
                     **inputs: Any) -> torch.Tensor:
        """The engine's ``(B, 4, L)`` layout written in the same pass: row 0 counts each sample's
        (segment's) valid tokens from 0, 1 at padding; rows 1 to 3 are :meth:`rope_index`'s."""
        positions, _ = self.placed(True, input_ids, attention_mask, cu_seqlens, inputs, generated_mask)
        return positions if positions.dtype == self.position_dtype else positions.to(self.position_dtype)

    def layout_for(self, inputs: Mapping[str, Any]) -> tuple[ItemLayout, int]:
        """The layout for a call's inputs and the kinds it enables (:meth:`ItemLayout.enabled`)."""
        return self.layout, self.layout.enabled()

    def placed(self, text_row: bool, input_ids: Any, attention_mask: torch.Tensor | None, cu_seqlens: Any,
               inputs: Mapping[str, Any], generated_mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions and deltas for a call: ``(B, 4, L)`` with ``text_row``, else ``(3, B, L)``."""
        if not self._known.issuperset(inputs) or (generated_mask is not None and not self.reads_generated_mask):
            unknown = sorted(set(inputs) - self._known) or ["generated_mask"]
            raise InvalidInputError(f"get_rope_index got {', '.join(map(repr, unknown))}, which this kernel does not "
                                    f"take; it takes {', '.join(map(repr, self.keys))}")
        layout, enabled = self.layout_for(inputs)
        media, seconds = self.media_arrays(inputs)
        ids, mask = host_batch(input_ids, attention_mask)
        generated = None if generated_mask is None else _generated(generated_mask, ids, mask)
        positions, deltas = self._placed(text_row, ids, mask, cu_seqlens, layout, enabled, media, seconds, inputs,
                                         generated)
        if input_ids.device.type != "cpu":
            return positions.to(input_ids.device), deltas.to(input_ids.device)
        return positions, deltas

    def media_arrays(self, inputs: Mapping[str, Any]) -> tuple[Arrays, Arrays]:
        """Each medium's grids or lengths, and each timed grid medium's seconds (a stamped one's
        time stamps), as host arrays. Values are not checked here: what the layout cannot place,
        :meth:`refuse` reads again."""
        media: list[np.ndarray | None] = []
        seconds: list[np.ndarray | None] = []
        for grid, key, seconds_key, name in self._media:
            value = inputs.get(key)
            given = None
            if value is not None:
                value = host_grid(key, value) if grid else _host(torch.as_tensor(value), torch.int64)
                if seconds_key is not None and name in self._stamped:
                    given = _stamps(seconds_key, inputs.get(seconds_key), name, key, value)
                elif seconds_key is not None:
                    given = _seconds(seconds_key, inputs.get(seconds_key), name, key, len(value))
            media.append(value)
            seconds.append(given)
        return tuple(media), tuple(seconds)

    def _placed(self, text_row: bool, ids: torch.Tensor, mask: torch.Tensor | None, cu_seqlens: Any,
                layout: ItemLayout, enabled: int, media: Arrays, seconds: Arrays, inputs: Mapping[str, Any],
                generated: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = ids.shape
        first = count = None
        if cu_seqlens is not None:
            first, count = packed_segments(cu_seqlens, (batch, length), mask)
            mask = None
            if generated is not None and generated.reshape(-1)[first[count > 0]].any():
                segment = int(np.flatnonzero(generated.reshape(-1)[first] & (count > 0))[0])
                raise InvalidInputError(f"generated_mask marks the first token of segment {segment} as generated; a "
                                        f"rollout generates after a prompt: mark the prompt's tokens 0")
        # numpy allocates in a third of torch.empty's time on a single sample; torch shares the memory
        dtype = np.float32 if layout.out_dtype == torch.float32 else np.int64
        out = np.empty((batch, 4, length) if text_row else (3, batch, length), dtype=dtype)
        deltas = np.empty((batch if first is None else first.size, 1), dtype=dtype)
        status = layout.place(out, text_row, ids.numpy(), None if mask is None else mask.numpy(), first, count, media,
                              seconds, deltas, enabled, torch.get_num_threads(), generated)
        if status == PADDING_INSIDE:
            return self._compacted(text_row, ids, mask, layout, enabled, media, seconds, inputs, generated)
        if status != PLACED:
            self.refuse(layout, enabled, ids, mask, first, count, media, seconds, inputs)
        return torch.from_numpy(out), torch.from_numpy(deltas)

    def _compacted(self, text_row: bool, ids: torch.Tensor, mask: Any, layout: ItemLayout, enabled: int,
                   media: Arrays, seconds: Arrays, inputs: Mapping[str, Any],
                   generated: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions for masks with padding inside a sample: computed with each sample's valid
        tokens moved to the front, in order, then put back (the padding goes where padding was)."""
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
        valid = torch.arange(mask.shape[1]) < mask.sum(dim=1, keepdim=True)
        if generated is not None:
            generated = np.take_along_axis(generated, order.numpy(), axis=1)
        compact, deltas = self._placed(text_row, ids.gather(1, order), valid, None, layout, enabled, media, seconds,
                                       inputs, generated)
        order = order.unsqueeze(1 if text_row else 0).expand_as(compact)
        return torch.empty_like(compact).scatter_(2, order, compact), deltas

    def refuse(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
               first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
               inputs: Mapping[str, Any]) -> NoReturn:
        """Raise the typed error that says why ``layout`` refuses a batch: a segment boundary that
        cuts an item (:class:`~mmrope_core.SegmentCutError`), else what :meth:`explain` raises,
        else what the layout's reading finds."""
        self.read_media(inputs)
        host = ids.numpy()
        if first is not None:
            bounds = np.append(first, first[-1] + count[-1])  # type: ignore[index]
            cut = cut_by(layout, host, bounds, media, seconds, enabled)
            if cut is not None:
                raise SegmentCutError((cut,), f"token {int(bounds[cut])}")
        self.explain(layout, enabled, ids, mask, first, count, media, seconds, inputs)
        found = layout.refusal(host, None if mask is None else mask.numpy(), first, count, media, seconds, enabled)
        if found.status in (BAD_MEDIA, EMPTY_SAMPLE):
            raise InvalidInputError(found.message)
        raise PlaceholderMismatchError(found.message or "the media placeholders of the batch do not fit its media; "
                                                        "pass the processor's outputs for these samples")

    def read_media(self, inputs: Mapping[str, Any]) -> None:
        """Raise the typed error of a media value a cheap reading let through (read for its message)."""
        for grid, key, seconds_key, name in self._media:
            value = inputs.get(key)
            if grid and value is not None:
                read_grid(key, value)
                if seconds_key is not None and name in self._stamped:
                    read_stamps(seconds_key, inputs.get(seconds_key), frames=host_grid(key, value)[:, 0].tolist(), grid=key)
                elif seconds_key is not None:
                    read_seconds(seconds_key, inputs.get(seconds_key), videos=len(value), grid=key)
            elif value is not None:
                read_audio_lengths(key, value)

    def explain(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
                first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
                inputs: Mapping[str, Any]) -> None:
        """Raise a family's own error for a refused batch (same arguments as :meth:`refuse`);
        returning leaves the message to the layout's reading."""


def host_batch(input_ids: Any, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The token ids as int64 and the mask as bool (a token is valid where the mask is 1),
    contiguous on the host."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InvalidInputError(f"input_ids must be a (B, L) tensor, got {type(input_ids).__name__} "
                                f"{tuple(getattr(input_ids, 'shape', ()))}")
    ids = input_ids
    if ids.dtype is not torch.int64 or not ids.is_cpu or not ids.is_contiguous():
        ids = ids.to(device="cpu", dtype=torch.int64).contiguous()
    if attention_mask is not None:
        attention_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 1
        if not attention_mask.is_cpu or not attention_mask.is_contiguous():
            attention_mask = attention_mask.cpu().contiguous()
    return ids, attention_mask


def packed_segments(cu_seqlens: Any, shape: tuple[int, int], mask: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """The first token and the length of each segment of one packed row."""
    if shape[0] != 1 or (mask is not None and not bool(mask.all())):
        raise InvalidInputError(f"cu_seqlens describes one packed (1, L) row without padding, got a batch of shape "
                                f"{tuple(shape)}{' with padding' if mask is not None else ''}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
        raise InvalidInputError("cu_seqlens must be a 1-D integer tensor (K + 1,) of segment boundaries")
    bounds = _host(cu_seqlens, torch.int64)
    count = np.diff(bounds)
    if bounds.size < 2 or bounds[0] != 0 or bounds[-1] != shape[1] or count.min() <= 0:
        raise InvalidInputError(f"cu_seqlens must increase from 0 to the row length {shape[1]}, got {bounds.tolist()}")
    return np.ascontiguousarray(bounds[:-1]), count


def _generated(value: Any, ids: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray | None:
    """``generated_mask`` as a host bool array shaped like the host ``ids``, checked as the engine
    checks it (never at padding nor at a row's first token), or None where it marks no token."""
    flags = read_generated_mask(value.cpu() if isinstance(value, torch.Tensor) else value, ids, mask)
    return None if flags is None else _host(flags, torch.bool)


def host_grid(key: str, value: Any) -> np.ndarray:
    """A grid as a host int64 ``(N, 3)`` array: as it is where it is one (its values are read
    where the layout refuses them), else read and converted."""
    if (type(value) is torch.Tensor and value.dtype is torch.int64 and value.dim() == 2 and value.shape[1] == 3
            and value.is_cpu and not value.requires_grad and value.is_contiguous()):
        return value.numpy()
    return _host(read_grid(key, value), torch.int64)  # type: ignore[arg-type]


def _seconds(key: str, value: Any, medium: str, grid_key: str, grids: int) -> np.ndarray:
    """A timed medium's seconds per grid, one per grid, in the dtype the temporal rule reads:
    a float32 or float64 tensor's, int64 for integers, float32 for half precision (exactly) and
    for lists and numbers (as processors give them and :func:`~mmrope_core.media.read_seconds`
    reads them)."""
    if type(value) is torch.Tensor and value.dtype in _SECONDS and value.dim() == 1 and value.shape[0] == grids \
            and value.is_cpu and not value.requires_grad and value.is_contiguous():
        return value.numpy()
    if value is None:
        raise InvalidInputError(f"{medium}s need {key} (seconds per grid), one per {medium} in {grid_key}")
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(value, dtype=torch.float32)
    if value.numel() != grids:
        raise InvalidInputError(f"{key} has {counted(value.numel(), 'value')} for {counted(grids, medium)} in "
                                f"{grid_key}; pass one value per {medium}")
    dtype = value.dtype if value.dtype in _SECONDS else torch.float32 if value.is_floating_point() else torch.int64
    return _host(value.reshape(-1), dtype)


def _stamps(key: str, value: Any, medium: str, grid_key: str, grids: np.ndarray) -> np.ndarray:
    """A stamped medium's time stamps as float32, one a frame of its grids (whose sizes are read
    first where they cannot count the stamps)."""
    if value is None:
        raise InvalidInputError(f"the {medium} medium needs {key} (a time stamp per frame), one per frame of the grids in "
                                f"{grid_key}")
    frames = grids[:, 0].tolist()
    if not (isinstance(value, torch.Tensor) and value.dtype.is_floating_point and value.numel() == sum(frames)
            and value.device.type != "meta"):
        if min(frames, default=1) < 1:
            read_grid(grid_key, torch.from_numpy(grids))  # raises for the grid first
        value = read_stamps(key, value, frames=frames, grid=grid_key)  # raises, or converts a list
    return _host(value.reshape(-1), torch.float32)


def _host(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``tensor``'s values as a contiguous numpy array of ``dtype`` on the host, without a copy
    when it is one (each check here costs a fraction of a conversion's microsecond)."""
    if tensor.dtype is dtype and tensor.is_cpu and not tensor.requires_grad and tensor.is_contiguous():
        return tensor.numpy()
    return tensor.detach().to(device="cpu", dtype=dtype).contiguous().numpy()
