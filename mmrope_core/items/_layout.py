"""A layout of media items: what a family's reference does with markers, placeholders and media,
as data the compiled loops (or, without them, numpy) carry out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from .. import compiled
from ..temporal import TemporalRule
from . import _decode, _place, _read
from ._spec import FORMS, INTERLEAVES, MAX_KINDS, MAX_MEDIA, RESUMES, GridMedia, ItemKind, Media, SequenceMedia

_PRECISIONS = {"float32": 0, "float64": 1, "seconds": 2}  # the compiled layout's


@dataclasses.dataclass(frozen=True)
class ItemLayout:
    """How a family lays out media items and places their positions.

    Attributes:
        media: the media items come from, each in the batch's order (:class:`GridMedia`,
            :class:`SequenceMedia`).
        kinds: the kinds of items (:class:`ItemKind`), tried in this order where a key opens.
        temporal: how grids' frames get their temporal ids (``precision="seconds"`` and
            ``whole_seconds`` for layouts without stamped media).
        dtype: ``torch.int64``, or ``torch.float32`` where the reference keeps fractions (sums are
            then rounded to float32 as the reference rounds them).
        truncated: float32 positions (and deltas) are written as int64, each truncated toward
            zero, as ``.to(torch.int64)`` truncates the reference's (a rollout engine's cast).
        padding: what positions hold at padding.
        padding_in_largest: a sample's delta counts the padding's value as a position.
        text_only: items are read and checked, but every token counts on as text (a reference's
            path for batches without grids).
        empty_samples: a sample without tokens is placed (else :data:`EMPTY_SAMPLE`).
        exclusive: pairs of kind names that may not share a sample.
    """

    media: tuple[Media, ...]
    kinds: tuple[ItemKind, ...]
    temporal: TemporalRule = dataclasses.field(default_factory=TemporalRule)
    dtype: torch.dtype = torch.int64
    truncated: bool = False
    padding: float = 0
    padding_in_largest: bool = False
    text_only: bool = False
    empty_samples: bool = False
    exclusive: tuple[tuple[str, str], ...] = ()
    _compiled: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.media, tuple) or len(self.media) > MAX_MEDIA or not all(
                isinstance(medium, (GridMedia, SequenceMedia)) for medium in self.media):
            raise ValueError(f"ItemLayout.media must be a tuple of up to {MAX_MEDIA} GridMedia and SequenceMedia")
        names = [medium.name for medium in self.media]
        if len(set(names)) != len(names):
            raise ValueError(f"ItemLayout.media must have distinct names, got {names}")
        if not isinstance(self.kinds, tuple) or len(self.kinds) > MAX_KINDS or not all(
                isinstance(kind, ItemKind) for kind in self.kinds):
            raise ValueError(f"ItemLayout.kinds must be a tuple of up to {MAX_KINDS} ItemKind")
        kinds = [kind.name for kind in self.kinds]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"ItemLayout.kinds must have distinct names, got {kinds}")
        items = {token for kind in self.kinds for token in (*kind.key, *kind.placeholders, *kind.closing)}
        for kind in self.kinds:
            if kind.inside is not None and set(kind.inside) & items:
                raise ValueError(f"ItemKind {kind.name!r}: its inside markers {kind.inside} must be text, not a "
                                 f"token of any kind's items (key, placeholders or closing markers)")
        for kind in self.kinds:
            media = [self.medium(name, kind) for name in kind.media]
            if len(media) == 2 and not (isinstance(media[0], GridMedia) and isinstance(media[1], SequenceMedia)):
                raise ValueError(f"ItemKind {kind.name!r}: two media are a grid's then a sequence's, got {kind.media}")
            if kind.resume == "spatial" and not (len(media) == 1 and isinstance(media[0], GridMedia)):
                raise ValueError(f"ItemKind {kind.name!r}: resume='spatial' resumes past one grid's lines and columns; "
                                 f"its media are {kind.media}")
        if not isinstance(self.temporal, TemporalRule):
            raise ValueError("ItemLayout.temporal must be a TemporalRule")
        rule = self.temporal
        if (rule.precision == "seconds" or rule.whole_seconds) and any(
                isinstance(medium, GridMedia) and medium.stamped for medium in self.media):
            raise ValueError("ItemLayout.temporal scales time stamps in float32 or float64: precision='seconds' and "
                             "whole_seconds=True are for timed grids, not a layout with stamped media")
        if rule.precision == "seconds" and isinstance(rule.per_second, int) and rule.per_second >= 2**24:
            raise ValueError(f"ItemLayout.temporal: a whole per_second multiplies in int64 with precision='seconds'; "
                             f"it must be below 2**24, got {rule.per_second}")
        if self.dtype not in (torch.int64, torch.float32):
            raise ValueError(f"ItemLayout.dtype must be torch.int64 or torch.float32, got {self.dtype}")
        if self.dtype == torch.int64 and not self.temporal.truncate:
            raise ValueError("int64 positions need truncated temporal ids: TemporalRule(truncate=True)")
        if not isinstance(self.truncated, bool) or (self.truncated and self.dtype != torch.float32):
            raise ValueError("ItemLayout.truncated is a bool, True only with dtype=torch.float32")
        if type(self.padding) not in (int, float) or not -(2**24) <= self.padding <= 2**24:
            raise ValueError(f"ItemLayout.padding must be a number of magnitude at most 2**24, got {self.padding!r}")
        for pair in self.exclusive:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(name in kinds for name in pair)):
                raise ValueError(f"ItemLayout.exclusive holds pairs of kind names, got {pair!r}")

    def medium(self, name: str, kind: ItemKind | None = None) -> Media:
        """The medium called ``name``."""
        for medium in self.media:
            if medium.name == name:
                return medium
        where = f"ItemKind {kind.name!r}: " if kind is not None else ""
        raise ValueError(f"{where}no medium is called {name!r}; the layout's media are "
                         f"{[medium.name for medium in self.media]}")

    def replace(self, **changes: Any) -> ItemLayout:
        """A copy with ``changes`` (as :func:`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    def enabled(self, names: Iterable[str] | None = None) -> int:
        """The ``enabled`` argument of :meth:`place` for kinds ``names`` (None: every kind); a key
        of another kind is then a mismatch."""
        kinds = [kind.name for kind in self.kinds]
        if names is None:
            return (1 << len(kinds)) - 1
        mask = 0
        for name in names:
            if name not in kinds:
                raise ValueError(f"no kind is called {name!r}; the layout's kinds are {kinds}")
            mask |= 1 << kinds.index(name)
        return mask

    @property
    def float32(self) -> bool:
        """Positions are summed in float32."""
        return self.dtype == torch.float32

    @property
    def out_dtype(self) -> torch.dtype:
        """What positions and deltas are written in: int64 where :attr:`truncated`, else :attr:`dtype`."""
        return torch.int64 if self.truncated else self.dtype

    def place(self, out: np.ndarray, text_row: bool, ids: np.ndarray, mask: np.ndarray | None,
              first: np.ndarray | None, count: np.ndarray | None, media: Sequence[np.ndarray | None],
              seconds: Sequence[np.ndarray | None], deltas: np.ndarray, enabled: int, threads: int = 1,
              generated: np.ndarray | None = None) -> int:
        """Write a batch's positions: one read of its tokens finds and checks its items, then each
        position is written once. On the compiled loops where they are loaded, else in numpy,
        with the same results.

        Arrays are C-contiguous numpy arrays on the host.

        Args:
            out: written, in :attr:`out_dtype`: ``(3, B, L)``, or ``(B, 4, L)`` with ``text_row``,
                whose row 0 counts each sample's tokens from 0 and holds 1 at padding.
            ids: int64 ``(B, L)`` token ids.
            mask: bool ``(B, L)``, one sample per row, its valid tokens; None: every token.
            first, count: int64 ``(K,)`` samples lying back to back over the rows (packed rows),
                by the flat index of their first token and their token count; both None for one
                sample per row.
            media: per medium, in :attr:`media`'s order: int64 ``(N, 3)`` grids or ``(N,)``
                sequence lengths, or None.
            seconds: per medium: float32, float64 or int64 ``(N,)`` seconds per grid of a timed grid
                medium (the temporal rule computes from them in their dtype, see
                :class:`~mmrope_core.temporal.TemporalRule`), float32 time stamps of a stamped one
                (one a frame, grid after grid), else None.
            deltas: written, ``(S,)`` in :attr:`out_dtype`: each sample's largest position + 1 - its tokens.
            enabled: the kinds that may occur (:meth:`enabled`).
            threads: at most this many threads share the work.
            generated: bool ``(B, L)``, True at the tokens a rollout engine generated (never at a
                sample's first token), or None; int64 :attr:`out_dtype` only. Each run of them is
                one request's decode, after a prompt of every token before it in its sample: its
                tokens sit at their index in the sample plus the request's delta (the largest
                position before the run + 1 - the run's first index, summed as positions are,
                truncated toward zero) on every row; a sample ending in one has its delta.

        Returns:
            :data:`PLACED`; else ``out`` and ``deltas`` hold nothing to read and the status says
            why: :data:`MISMATCH` (tokens and media disagree), :data:`PADDING_INSIDE` (a mask with
            padding between a row's valid tokens: compact the rows and call again),
            :data:`BAD_MEDIA` (media that cannot be placed), :data:`EMPTY_SAMPLE`.
            :meth:`refusal` says what is wrong.

        Raises:
            ValueError: arrays whose sizes do not fit the batch, or samples that do not cover it
                back to back.
        """
        if generated is not None and self.out_dtype != torch.int64:
            raise ValueError("ItemLayout.place: generated tokens are placed in int64 positions only")
        if generated is not None and generated.dtype != np.bool_:
            raise ValueError(f"ItemLayout.place: generated must be a bool array, got {generated.dtype}")
        native = compiled.native
        if native is None:
            if not self.truncated and generated is None:
                return _place.place(self, out, text_row, ids, mask, first, count, media, seconds, deltas, enabled)
            return _decode.place_decoded(self, out, text_row, ids, mask, first, count, media, seconds, deltas,
                                         enabled, generated)
        layout = self._compiled if self._compiled is not None else self._compile(native)
        status: int = native.place_items(layout, out, text_row, ids.shape[0], ids.shape[1], ids, mask, first, count,
                                         tuple(media), tuple(seconds), deltas, enabled, threads, generated)
        return status

    def find(self, ids: np.ndarray, mask: np.ndarray | None, first: np.ndarray | None, count: np.ndarray | None,
             media: Sequence[np.ndarray | None], seconds: Sequence[np.ndarray | None], enabled: int) -> _read.Found:
        """The items :meth:`place` would place, read as it reads them (same arguments)."""
        native = compiled.native
        if native is None:
            return _read.find(self, ids, mask, first, count, media, seconds, enabled)
        layout = self._compiled if self._compiled is not None else self._compile(native)
        status, sample, token, records = native.find_items(layout, ids.shape[0], ids.shape[1], ids, mask, first, count,
                                                           tuple(media), tuple(seconds), enabled)
        items = np.frombuffer(records, dtype=np.int64).reshape(-1, 6)
        return _read.Found(status, sample, token, tuple(_read.Item(*map(int, row)) for row in items))

    def refusal(self, ids: np.ndarray, mask: np.ndarray | None, first: np.ndarray | None, count: np.ndarray | None,
                media: Sequence[np.ndarray | None], seconds: Sequence[np.ndarray | None],
                enabled: int) -> _read.Found:
        """Why :meth:`place` refuses a batch (same arguments): where reading stopped and a message
        that says what is wrong there and how to fix it (``message`` is empty where it is placed)."""
        return _read.find(self, ids, mask, first, count, media, seconds, enabled, explain=True)

    def _compile(self, native: Any) -> Any:
        kinds = [kind.name for kind in self.kinds]
        media = tuple((int(isinstance(m, SequenceMedia)), m.merge if isinstance(m, GridMedia) else 1,
                       isinstance(m, GridMedia) and m.timed, m.steps if isinstance(m, SequenceMedia) else (),
                       m.window if isinstance(m, SequenceMedia) else 0,
                       m.per_window if isinstance(m, SequenceMedia) else 0,
                       isinstance(m, GridMedia) and m.stamped, isinstance(m, GridMedia) and m.per_frame,
                       isinstance(m, GridMedia) and not m.scaled)
                      for m in self.media)
        names = [medium.name for medium in self.media]
        specs = []
        for kind in self.kinds:
            exclusive = 0
            for a, b in self.exclusive:
                if kind.name in (a, b):
                    exclusive |= 1 << kinds.index(b if kind.name == a else a)
            specs.append((kind.key, kind.opening, tuple(names.index(name) for name in kind.media), kind.placeholders,
                          kind.closing, kind.begins_with, kind.markers == "share",
                          kind.opening if kind.lead is None else kind.lead, INTERLEAVES[kind.interleave], kind.chunk,
                          RESUMES[kind.resume], exclusive, kind.whole_run, kind.inside))
        rule = self.temporal
        layout = native.compile_layout(
            media, tuple(specs), (float(rule.per_second), rule.order == "frame_first", _PRECISIONS[rule.precision],
                                  rule.truncate, rule.whole_seconds,
                                  rule.precision == "seconds" and isinstance(rule.per_second, int)),
            (FORMS[self.float32, self.truncated], float(self.padding), self.padding_in_largest, self.text_only,
             not self.empty_samples))
        object.__setattr__(self, "_compiled", layout)
        return layout

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_compiled": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
