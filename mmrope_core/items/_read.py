"""Reading media items in numpy, as the compiled loops read them (``items.c``): where placing
goes without the loops, and what says why a batch is refused, with messages."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import counted
from ._spec import BAD_MEDIA, EMPTY_SAMPLE, MAX_SECONDS, MISMATCH, PADDING_INSIDE, PLACED, GridMedia, SequenceMedia

if TYPE_CHECKING:
    from ..temporal import TemporalRule
    from ._layout import ItemLayout

_INT64 = 2**63
_BEYOND = 4611686018427387904.0  # 2**62: temporal ids beyond it do not fit positions


@dataclasses.dataclass(frozen=True)
class Item:
    """One media item found: its sample, its first token among the sample's tokens, its tokens
    (markers included), its kind (index in the layout's kinds) and the index of its media item
    in each of its media (the second -1 for one medium; a per-frame grid medium's: the grid of
    its frame)."""

    sample: int
    start: int
    tokens: int
    kind: int
    media: int
    second_media: int


@dataclasses.dataclass(frozen=True)
class Found:
    """What reading a batch found: the status :meth:`ItemLayout.place` returns for it, where
    reading stopped (``sample`` -1: before any sample, or the number of samples: media left
    over), the items found (none unless placed) and, from :meth:`ItemLayout.refusal`, a message."""

    status: int
    sample: int
    token: int
    items: tuple[Item, ...]
    message: str = ""


@dataclasses.dataclass
class Reading:
    """A batch read: its samples (flat first token and count), whether each row holds one, and
    its items per sample."""

    found: Found
    first: np.ndarray | None = None
    count: np.ndarray | None = None
    one_per_row: bool = False
    per_sample: list[list[tuple[Item, int, int]]] = dataclasses.field(default_factory=list)


def arithmetic(rule: TemporalRule, seconds: np.dtype) -> str:
    """What ``rule`` multiplies seconds of dtype ``seconds`` in (``"float32"``, ``"float64"`` or
    ``"int64"``), as ``temporal_rule_for`` (temporal.c) decides: for the seconds' precision,
    float seconds keep theirs; whole seconds (integers, or truncated first) give int64 for a whole
    ``per_second``, else float64 (float32 multiplying frame first), as numpy multiplies them."""
    if rule.precision != "seconds":
        return rule.precision
    if rule.whole_seconds or seconds.kind != "f":
        return "int64" if isinstance(rule.per_second, int) else "float32" if rule.order == "frame_first" else "float64"
    return "float32" if seconds == np.float32 else "float64"


def temporal(layout: ItemLayout, seconds: np.generic | None, frames: np.ndarray) -> np.ndarray:
    """Frames' temporal ids (float64 values) under the layout's rule for a grid's seconds (a
    numpy scalar of their dtype; None: untimed, one whole second), as ``temporal.c`` computes
    them."""
    rule = layout.temporal
    given = np.int64(1) if seconds is None else seconds
    precision = arithmetic(rule, given.dtype)
    if rule.whole_seconds:
        given = np.int64(given)  # truncated toward zero
    values: np.ndarray
    if precision == "int64":  # exact factors, so the product rounds as the exact one would
        values = frames.astype(np.float64) * float(int(rule.per_second) * int(given))
    elif precision == "float32":
        index, s, p = frames.astype(np.float32), np.float32(given), np.float32(rule.per_second)
        values = ((index * s) * p if rule.order == "frame_first" else index * (p * s)).astype(np.float64)
    else:
        index, s, p = frames.astype(np.float64), float(given), float(rule.per_second)
        values = (index * s) * p if rule.order == "frame_first" else index * (p * s)
    if rule.truncate:
        with np.errstate(invalid="ignore"):
            values = np.trunc(values)
    return values


def stamped_temporal(layout: ItemLayout, stamps: np.ndarray) -> np.ndarray:
    """Stamped frames' temporal ids (float64 values): the rule applied to each stamp as to
    ``frame * seconds``, as ``temporal_stamped`` (native.h) computes them."""
    rule = layout.temporal
    if rule.precision == "float32":
        values = (stamps.astype(np.float32) * np.float32(rule.per_second)).astype(np.float64)
    else:
        values = stamps.astype(np.float32).astype(np.float64) * float(rule.per_second)
    if rule.truncate:
        with np.errstate(invalid="ignore"):
            values = np.trunc(values)
    return values


def stamp_starts(media: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """Per grid medium, where each grid's stamps begin (its frames summed before it), and where
    the last ends; None for sequences."""
    return [None if values is None or values.ndim != 2 else np.concatenate([[0], np.cumsum(values[:, 0])])
            for values in media]


def grid_temporal(layout: ItemLayout, medium: int, index: int, media: Sequence[Any], seconds: Sequence[Any],
                  starts: Sequence[np.ndarray | None], frames: np.ndarray) -> np.ndarray:
    """The temporal ids of ``frames`` of grid ``index`` of ``medium``: by its stamps, its seconds
    per grid or one second."""
    spec, given = layout.media[medium], seconds[medium]
    if isinstance(spec, GridMedia) and spec.stamped:
        first = int(starts[medium][index])  # type: ignore[index]
        return stamped_temporal(layout, given[first + frames])
    if isinstance(spec, GridMedia) and not spec.scaled:
        return frames.astype(np.float64)
    timed = isinstance(spec, GridMedia) and spec.timed and given is not None
    return temporal(layout, given[index] if timed else None, frames)


def media_problem(layout: ItemLayout, media: Sequence[np.ndarray | None], seconds: Sequence[np.ndarray | None]) -> str:
    """What keeps the media from being placed (``items_media_fit``), or ""."""
    for m, (medium, values) in enumerate(zip(layout.media, media)):
        if values is None:
            continue
        if isinstance(medium, SequenceMedia):
            if (values < 0).any():
                return f"{medium.name} lengths must not be negative, got {values.tolist()}"
            continue
        if (values < 1).any() or (values[:, 1:] % medium.merge != 0).any():
            return (f"{medium.name} grids need positive sides, heights and widths divisible by {medium.merge}; "
                    f"got {values.tolist()}")
        if medium.timed and len(values):
            given = seconds[m]
            assert given is not None
            if not (np.isfinite(given).all() and (given >= 0).all() and (given <= MAX_SECONDS).all()):
                return f"{medium.name} seconds per grid must be finite, from 0 to 2**20, got {given.tolist()}"
        if medium.stamped and len(values):
            given = seconds[m]
            assert given is not None  # the sizes were checked
            problem = _stamps_problem(medium.name, values[:, 0], given)
            if problem:
                return problem
    return ""


def _stamps_problem(name: str, frames: np.ndarray, stamps: np.ndarray) -> str:
    """What is wrong with stamped grids' stamps (one a frame, grid after grid), or ""."""
    bad = ~((stamps >= 0) & (stamps <= MAX_SECONDS))
    grid_of = np.repeat(np.arange(len(frames)), frames)
    steps = np.diff(stamps) < 0
    falls = np.flatnonzero(steps & (grid_of[1:] == grid_of[:-1]))
    if bad.any() or falls.size:
        frame = int(np.flatnonzero(bad)[0]) if bad.any() else int(falls[0]) + 1
        return (f"{name} time stamps must be finite, from 0 to 2**20 seconds and not decreasing within a grid; "
                f"{name} {int(grid_of[frame])} has {float(stamps[frame])!r} at its frame "
                f"{frame - int(np.searchsorted(grid_of, grid_of[frame]))}")
    return ""


def _sizes(layout: ItemLayout, ids: np.ndarray, mask: Any, first: Any, count: Any, media: Sequence[Any],
           seconds: Sequence[Any]) -> None:
    batch, length = ids.shape
    fits = (batch >= 1 and 1 <= length <= 2**31 - 1 and (first is None) == (count is None)
            and (mask is None or mask.shape == ids.shape) and (first is None or first.shape == count.shape)
            and len(media) == len(layout.media) and len(seconds) == len(layout.media))
    for medium, values, given in zip(layout.media, media, seconds):
        if fits and isinstance(medium, GridMedia) and medium.timed and values is not None and len(values):
            fits = given is not None and given.shape == (len(values),)
            if fits and given.dtype not in (np.float32, np.float64, np.int64):
                raise ValueError(f"seconds: float32, float64 or int64, not {given.dtype}")
        if fits and isinstance(medium, GridMedia) and medium.stamped and values is not None and len(values):
            frames = values[:, 0].tolist()  # Python ints: a sum that cannot wrap
            fits = given is not None and given.ndim == 1 and (min(frames) < 1 or sum(frames) == given.shape[0])
    if not fits:
        raise ValueError(f"items: sizes do not fit a batch of {batch} x {length}")


def read(layout: ItemLayout, ids: np.ndarray, mask: np.ndarray | None, first: np.ndarray | None,
         count: np.ndarray | None, media: Sequence[np.ndarray | None], seconds: Sequence[np.ndarray | None],
         enabled: int, explain: bool = False) -> Reading:
    """Each sample's items, checked against its media, as ``items.c`` reads them."""
    _sizes(layout, ids, mask, first, count, media, seconds)
    problem = media_problem(layout, media, seconds)
    if problem:
        return Reading(Found(BAD_MEDIA, -1, 0, (), problem if explain else ""))
    batch, length = ids.shape
    one_per_row = first is None
    if first is None:
        valid = np.ones(ids.shape, dtype=bool) if mask is None else mask
        count = valid.sum(axis=1).astype(np.int64)
        low = np.where(count > 0, valid.argmax(axis=1), 0)
        high = np.where(count > 0, length - valid[:, ::-1].argmax(axis=1), 0)
        if (high - low != count).any():
            message = "padding lies between valid tokens of a row; compact the rows" if explain else ""
            return Reading(Found(PADDING_INSIDE, -1, 0, (), message))
        first = np.arange(batch, dtype=np.int64) * length + low
    else:
        assert count is not None  # with first, as the sizes checked
        ends = np.cumsum(count)
        starts = np.concatenate([[0], ends[:-1]]) if len(count) else ends
        rows_left = np.asarray((count > 0) & (first // length != (first + count - 1) // length))
        if (count < 0).any() or (first != starts).any() or rows_left.any():
            bad = int(np.flatnonzero((count < 0) | (first != starts) | rows_left)[0])
            raise ValueError(f"items: sample {bad} does not follow the one before in a row")
        if len(count) and ends[-1] != batch * length:
            raise ValueError("items: the samples do not cover the batch")
    reader = _Reader(layout, media, seconds, enabled, explain)
    flat = ids.reshape(-1)
    per_sample = []
    for s in range(len(first)):
        items = reader.sample(s, flat[int(first[s]) : int(first[s]) + int(count[s])])
        if reader.failure is not None:
            return Reading(reader.failure, first, count, one_per_row)
        per_sample.append(items)
    leftover = reader.leftover(len(first))
    if leftover is not None:
        return Reading(leftover, first, count, one_per_row)
    found = Found(PLACED, -1, 0, tuple(item for items in per_sample for item, _, _ in items))
    return Reading(found, first, count, one_per_row, per_sample)


def find(layout: ItemLayout, ids: np.ndarray, mask: np.ndarray | None, first: np.ndarray | None,
         count: np.ndarray | None, media: Sequence[np.ndarray | None], seconds: Sequence[np.ndarray | None],
         enabled: int, explain: bool = False) -> Found:
    return read(layout, ids, mask, first, count, media, seconds, enabled, explain).found


class _Reader:
    def __init__(self, layout: ItemLayout, media: Sequence[Any], seconds: Sequence[Any], enabled: int,
                 explain: bool) -> None:
        self.layout, self.media, self.seconds, self.enabled, self.explain = layout, media, seconds, enabled, explain
        self.given = [0 if values is None else len(values) for values in media]
        self.starts = stamp_starts(media)
        self.used = [0] * len(media)
        self.frame = [0] * len(media)  # a per-frame medium's frames taken of its current grid
        self.names = [medium.name for medium in layout.media]
        self.keys = np.array(sorted({kind.key[0] for kind in layout.kinds}), dtype=np.int64)
        self.open: dict[tuple[int, int], np.ndarray] = {}  # per pair of inside markers: those open before each token
        self.placeholders = np.array(sorted({p for kind in layout.kinds for p in kind.placeholders}), dtype=np.int64)
        self.exclusive = [{b if kind.name == a else a for a, b in layout.exclusive if kind.name in (a, b)}
                          for kind in layout.kinds]
        self.failure: Found | None = None
        self.partial: list[tuple[Item, int, int]] = []  # the items of a sample before it failed

    def fail(self, status: int, sample: int, token: int, message: str) -> None:
        self.failure = Found(status, sample, token, (), message if self.explain else "")

    def sample(self, s: int, row: np.ndarray) -> list[tuple[Item, int, int]]:
        """The items of sample ``s`` (each with its media's tokens), or [] with ``failure`` set."""
        layout, n = self.layout, row.size
        if n == 0 and not layout.empty_samples:
            self.fail(EMPTY_SAMPLE, s, 0, f"sample {s} has no valid token; drop empty samples")
            return []
        placeholder = np.isin(row, self.placeholders)
        before = np.concatenate([[0], np.cumsum(placeholder)])  # placeholders before each token
        # markers are text, never inside an item (as the layout checks): each counts before what follows it
        self.open = {pair: np.concatenate([[0], np.cumsum((row == pair[0]).astype(np.int64) - (row == pair[1]))])
                     for pair in {kind.inside for kind in layout.kinds if kind.inside is not None}}
        items: list[tuple[Item, int, int]] = []
        self.partial = items
        seen: set[str] = set()
        at = 0
        for candidate in np.flatnonzero(np.isin(row, self.keys)).tolist() + [n]:
            if candidate < at:
                continue
            if before[candidate] > before[at]:  # a placeholder outside any item
                stray = at + int(np.argmax(placeholder[at:candidate]))
                self.fail(MISMATCH, s, stray, f"sample {s}: token {stray} is a placeholder outside any item (a "
                          f"missing start marker, or a placeholder sampled in a response); mask it out or restore "
                          f"the markers")
                return []
            if candidate == n:
                break
            k = self.kind_at(row, candidate)
            if k < 0:
                if placeholder[candidate]:
                    self.fail(MISMATCH, s, candidate, f"sample {s}: token {candidate} is a placeholder outside any "
                              f"item{self.closed(row, candidate)}; mask it out or restore its markers")
                    return []
                at = candidate + 1  # a marker opening nothing: text
                continue
            found = self.item(s, row, candidate, k, seen)
            if found is None:
                return []
            items.append(found)
            seen.add(layout.kinds[k].name)
            at = candidate + found[0].tokens
        return items

    def kind_at(self, row: np.ndarray, at: int, inside: bool = True) -> int:
        """The kind whose key opens at ``at`` (with ``inside`` False, whether or not its markers
        are open there), or -1."""
        for k, kind in enumerate(self.layout.kinds):
            key = kind.key
            if (len(key) <= row.size - at and all(int(row[at + j]) == token for j, token in enumerate(key))
                    and (not inside or kind.inside is None or self.open[kind.inside][at] > 0)):
                return k
        return -1

    def closed(self, row: np.ndarray, at: int) -> str:
        """Why the key at ``at`` opens nothing where a kind inside markers would open there, or ""."""
        k = self.kind_at(row, at, inside=False)
        if k < 0:
            return ""
        kind = self.layout.kinds[k]
        assert kind.inside is not None  # it opens only inside markers
        begin, end = kind.inside
        return (f" (a {kind.name} opens only where more {begin} than {end} markers precede it in its sample; "
                f"{int(np.count_nonzero(row[:at] == begin))} and {int(np.count_nonzero(row[:at] == end))} do here)")

    def tokens_of(self, m: int, index: int) -> int:
        medium, values = self.layout.media[m], self.media[m]
        if isinstance(medium, SequenceMedia):
            length = int(values[index])
            return -1 if length > 2**56 else int(medium.tokens(np.int64(length)))
        t, h, w = (int(v) for v in values[index])
        tokens = (1 if medium.per_frame else t) * (h // medium.merge) * (w // medium.merge)
        return -1 if tokens >= _INT64 else tokens

    def item(self, s: int, row: np.ndarray, at: int, k: int, seen: set[str]) -> tuple[Item, int, int] | None:
        kind = self.layout.kinds[k]
        what = f"sample {s}, {kind.name} at token {at}"
        if not self.enabled >> k & 1:
            self.fail(MISMATCH, s, at, f"{what}: this call does not take a {kind.name}")
            return None
        if seen & self.exclusive[k]:
            other = sorted(seen & self.exclusive[k])[0]
            self.fail(MISMATCH, s, at, f"{what}: a {kind.name} and a {other} may not share a sample")
            return None
        indices, tokens, left = [], [], row.size - at
        for name in kind.media:
            m = self.names.index(name)
            medium = self.layout.media[m]
            per_frame = isinstance(medium, GridMedia) and medium.per_frame
            if self.used[m] >= self.given[m]:
                taken, given = (self.frames(m, self.used[m]), self.frames(m, self.given[m])) if per_frame else (
                    self.used[m], self.given[m])
                what_given = f"{name} frame" if per_frame else name
                self.fail(MISMATCH, s, at, f"{what}: takes {what_given} {taken} of the batch, but "
                          f"{counted(given, what_given)} {'is' if given == 1 else 'are'} given; pass the "
                          f"media of every sample")
                return None
            index = self.used[m]
            self.frame[m] += 1
            if not per_frame or self.frame[m] == int(self.media[m][index][0]):
                self.used[m], self.frame[m] = index + 1, 0
            needed = self.tokens_of(m, index)
            if needed < 1 or needed > left:
                self.fail(MISMATCH, s, at, f"{what}: its {name} ({name} {index} of the batch) takes "
                          f"{counted(needed, 'placeholder token')}, which the sample cannot hold")
                return None
            if isinstance(self.layout.media[m], GridMedia) and not per_frame and not self.temporal_fits(m, index):
                self.fail(BAD_MEDIA, s, at, f"{what}: the temporal ids of {name} {index} do not fit int64 positions")
                return None
            indices.append(index)
            tokens.append(needed)
        content = sum(tokens)
        total = kind.opening + content + len(kind.closing)
        if total > left:
            self.fail(MISMATCH, s, at, f"{what}: needs {total} tokens, but the sample ends {left} tokens on; it was "
                      f"probably truncated inside the item: truncate before it or drop it")
            return None
        body = row[at + kind.opening : at + kind.opening + content]
        for name, placeholder, needed in zip(kind.media, kind.placeholders, tokens):
            found = int(np.count_nonzero(body == placeholder))
            if found != needed:
                self.fail(MISMATCH, s, at, f"{what}: its {name} needs {counted(needed, 'placeholder token')}, found "
                          f"{found}; the placeholders do not match its media (truncated, or media of another sample)")
                return None
        if kind.begins_with is not None and int(body[0]) != kind.begins_with:
            self.fail(MISMATCH, s, at, f"{what}: its placeholders must begin with token {kind.begins_with}, as the "
                      f"model finds it; pass the processor's output unchanged")
            return None
        after = at + kind.opening + content
        if kind.whole_run and after < row.size and int(row[after]) in kind.placeholders:
            self.fail(MISMATCH, s, at, f"{what}: token {after}, right after the "
                      f"{counted(content, 'placeholder token')} its media take, is one of its placeholders too; the "
                      f"model cuts media at runs of placeholders, so an item's run must end with its media: put text "
                      f"between items, or pass the media the placeholders were made for")
            return None
        closing = row[at + kind.opening + content : at + total].tolist()
        if closing != list(kind.closing):
            self.fail(MISMATCH, s, at, f"{what}: its placeholders are followed by {closing} instead of its closing "
                      f"markers {list(kind.closing)}; the placeholder count does not match its media")
            return None
        second = indices[1] if len(indices) > 1 else -1
        return Item(s, at, total, k, indices[0], second), tokens[0], tokens[1] if len(tokens) > 1 else 0

    def temporal_fits(self, m: int, index: int) -> bool:
        frames = int(self.media[m][index][0])
        last = float(grid_temporal(self.layout, m, index, self.media, self.seconds, self.starts,
                                   np.array([frames - 1]))[0])
        return math.isfinite(last) and abs(last) < _BEYOND

    def frames(self, m: int, grids: int) -> int:
        """The frames of medium ``m``'s first ``grids`` grids, and those taken of the next."""
        taken = self.frame[m] if grids < self.given[m] else 0
        values = self.media[m]
        return taken if values is None else sum(int(t) for t in values[:grids, 0]) + taken

    def leftover(self, samples: int) -> Found | None:
        for m, (name, used, given) in enumerate(zip(self.names, self.used, self.given)):
            if used != given:
                medium = self.layout.media[m]
                if isinstance(medium, GridMedia) and medium.per_frame:
                    name, used, given = f"{name} frame", self.frames(m, used), self.frames(m, given)
                message = (f"the batch gives {counted(given, name)} but its samples hold {used}; the sequence was "
                           f"probably truncated before one, drop the media of removed items") if self.explain else ""
                return Found(MISMATCH, samples, 0, (), message)
        return None


def cut_by(layout: ItemLayout, ids: np.ndarray, bounds: np.ndarray, media: Sequence[Any], seconds: Sequence[Any],
           enabled: int) -> int | None:
    """The first segment of a packed ``(1, L)`` row (its index in ``bounds``, the segments'
    boundaries) that starts inside an item of the row read as one sample, or None."""
    reader = _Reader(layout, media, seconds, enabled, explain=False)
    if media_problem(layout, media, seconds):
        return None
    reader.sample(0, ids.reshape(-1))
    for item, _, _ in reader.partial:
        inside = np.flatnonzero((bounds > item.start) & (bounds < item.start + item.tokens))
        if inside.size:
            return int(inside[0])
    return None
