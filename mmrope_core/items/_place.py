"""Placing media items in numpy, as the compiled loops place them (``place.c``, ``blocks.c``,
``interleave.c``): every sum in the positions' dtype and in the same order, so both give the same
positions to the bit. Python runs per item and per frame, never per token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._read import Reading, grid_temporal, read, stamp_starts
from ._spec import PLACED, GridMedia, SequenceMedia

if TYPE_CHECKING:
    from ._layout import ItemLayout


class _Values:
    """Positions' arithmetic: float32 sums rounded as the reference rounds them, else exact."""

    def __init__(self, float32: bool) -> None:
        self.float32 = float32
        self.dtype = np.float32 if float32 else np.int64

    def add(self, a: float, b: float) -> float:
        return float(np.float32(np.float32(a) + np.float32(b))) if self.float32 else a + b

    def added(self, values: np.ndarray, start: float) -> np.ndarray:
        """``values + start`` elementwise, each sum as :meth:`add` makes it."""
        if self.float32:
            return values.astype(np.float32) + np.float32(start)
        return values.astype(np.int64) + int(start)

    def ramp(self, count: int, first: int, start: float) -> np.ndarray:
        return self.added(np.arange(first, first + count, dtype=np.int64), start)


class _Grid:
    """A grid placed from ``start``: its tokens' three rows, and its frames' temporal ids."""

    def __init__(self, values: _Values, grid: np.ndarray, merge: int, temporal: np.ndarray, start: float) -> None:
        self.frames, self.height, self.width = int(grid[0]), int(grid[1]) // merge, int(grid[2]) // merge
        self.per_frame = self.height * self.width
        self.values, self.start = values, start
        self.temporal = temporal
        times = values.added(self.temporal, start)
        lines = values.added(np.arange(self.height, dtype=np.int64), start)
        columns = values.ramp(self.width, 0, start)
        self.rows = (np.repeat(times, self.per_frame), np.tile(np.repeat(lines, self.width), self.frames),
                     np.tile(columns, self.frames * self.height))

    def largest(self) -> float:
        last = float(self.temporal[-1])
        return self.values.add(max(last, float(max(self.height - 1, self.width - 1))), self.start)

    def write(self, out: Sequence[np.ndarray], at: int, begin: int, end: int) -> None:
        for row, values in zip(out, self.rows):
            row[at : at + end - begin] = values[begin:end]


def _ramp3(values: _Values, out: Sequence[np.ndarray], at: int, count: int, first: int, start: float) -> None:
    if count > 0:
        ramp = values.ramp(count, first, start)
        for row in out:
            row[at : at + count] = ramp


def _by_time(values: _Values, out: Sequence[np.ndarray], at: int, g: _Grid, tokens: int) -> float:
    heard_at = values.ramp(tokens, 0, g.start)
    times = values.added(g.temporal, g.start)
    heard = 0
    for frame in range(g.frames):
        until = max(heard, int(np.searchsorted(heard_at, times[frame], side="left")))
        _ramp3(values, out, at, until - heard, heard, g.start)
        at += until - heard
        heard = until
        g.write(out, at, frame * g.per_frame, (frame + 1) * g.per_frame)
        at += g.per_frame
    _ramp3(values, out, at, tokens - heard, heard, g.start)
    last_heard, last_seen = values.add(tokens - 1, g.start), float(times[-1])
    return last_heard if last_heard >= last_seen else g.largest()


def _by_chunks(values: _Values, out: Sequence[np.ndarray], at: int, g: _Grid, tokens: int, chunk: int) -> float:
    grid_tokens = g.frames * g.per_frame
    seen = heard = tested = grid_chunks = sequence_chunks = 0
    reached = 1
    while seen < grid_tokens or heard < tokens:
        if seen < grid_tokens:
            end = grid_tokens
            while tested < grid_tokens:  # the next token that starts a chunk
                frame = tested // g.per_frame
                if float(g.temporal[frame]) >= reached * chunk:
                    end = tested
                    tested += 1
                    reached += 1
                    break
                tested = (frame + 1) * g.per_frame
            g.write(out, at, seen, end)
            at += end - seen
            seen = end
            grid_chunks += 1
        if heard < tokens:
            end = min(heard + chunk, tokens)
            _ramp3(values, out, at, end - heard, heard, g.start)
            at += end - heard
            heard = end
            sequence_chunks += 1
    return values.add(tokens - 1, g.start) if sequence_chunks >= grid_chunks else g.largest()


def _by_groups(values: _Values, out: Sequence[np.ndarray], at: int, g: _Grid, tokens: int, chunk: int) -> float:
    groups = (g.temporal.astype(np.int64) // chunk).tolist() if g.frames else []
    heard = taken = 0
    frame = 0
    while frame < g.frames:
        end = frame + 1
        while end < g.frames and groups[end] == groups[frame]:
            end += 1
        g.write(out, at, frame * g.per_frame, end * g.per_frame)
        at += (end - frame) * g.per_frame
        taken = min(tokens - heard, chunk)
        _ramp3(values, out, at, taken, heard, g.start)
        at += taken
        heard += taken
        frame = end
    _ramp3(values, out, at, tokens - heard, heard, g.start)
    return values.add(tokens - 1, g.start) if taken or heard < tokens else g.largest()


class _Placer:
    def __init__(self, layout: ItemLayout, media: Sequence[Any], seconds: Sequence[Any]) -> None:
        self.layout, self.media, self.seconds = layout, media, seconds
        self.values = _Values(layout.float32)
        self.names = [medium.name for medium in layout.media]
        self.starts = stamp_starts(media)

    def markers(self, out: Sequence[np.ndarray], at: int, n: int, share: bool, closing: bool, cursor: float,
                largest: float) -> tuple[float, float]:
        if n <= 0:
            return cursor, largest
        add = self.values.add
        if share:
            fill = self.values.added(np.zeros(n, dtype=np.int64), cursor)
            for row in out:
                row[at : at + n] = fill
            return add(cursor, 1), max(largest, cursor)
        _ramp3(self.values, out, at, n, 0, cursor)
        last = add(n - 1, cursor)
        return (add(last, 1) if closing else add(cursor, n)), max(largest, last)

    def media_block(self, out: Sequence[np.ndarray], at: int, kind: Any, item: Any, tokens: tuple[int, int],
                    start: float) -> tuple[float, float]:
        """The item's media from ``start``: (largest of the part placed last, largest)."""
        add = self.values.add
        m = self.names.index(kind.media[0])
        medium = self.layout.media[m]
        if isinstance(medium, SequenceMedia):
            _ramp3(self.values, out, at, tokens[0], 0, start)
            block = add(tokens[0] - 1, start)
            return block, block
        assert isinstance(medium, GridMedia)
        grid = self.media[m][item.media]
        if medium.per_frame:  # a frame of it, alone
            grid = np.array((1, grid[1], grid[2]), dtype=np.int64)
        frames = np.arange(int(grid[0]), dtype=np.int64)
        g = _Grid(self.values, grid, medium.merge,
                  grid_temporal(self.layout, m, item.media, self.media, self.seconds, self.starts, frames), start)
        block = g.largest()
        if len(kind.media) == 1:
            g.write(out, at, 0, g.frames * g.per_frame)
            return block, block
        block = max(block, add(tokens[1] - 1, start))
        if kind.interleave == "time":
            return _by_time(self.values, out, at, g, tokens[1]), block
        merge = _by_chunks if kind.interleave == "chunks" else _by_groups
        return merge(self.values, out, at, g, tokens[1], kind.chunk), block

    def sample(self, out: Sequence[np.ndarray], count: int, items: list) -> float:
        layout, add = self.layout, self.values.add
        if layout.text_only:
            _ramp3(self.values, out, 0, count, 0, 0)
            return float(count - 1) if count else -1.0
        cursor, largest, at = 0.0, -1.0, 0
        for item, first_tokens, second_tokens in items:
            kind = layout.kinds[item.kind]
            share = kind.markers == "share"
            text = item.start - at
            if text:
                _ramp3(self.values, out, at, text, 0, cursor)
                largest = max(largest, add(text - 1, cursor))
                cursor = add(cursor, text)
                at += text
            lead = kind.opening if kind.lead is None else kind.lead
            cursor, largest = self.markers(out, at, lead, share, False, cursor, largest)
            at += lead
            last, block = self.media_block(out, at, kind, item, (first_tokens, second_tokens), cursor)
            largest = max(largest, block)
            if kind.resume == "spatial":  # past its lines and columns, its frames left out
                grid = self.media[self.names.index(kind.media[0])][item.media]
                merge = self.layout.media[self.names.index(kind.media[0])].merge  # type: ignore[union-attr]
                last = add(max(int(grid[1]), int(grid[2])) // merge - 1, cursor)
            cursor = add(last if kind.resume in ("last", "spatial") else block, 1)
            at += first_tokens + second_tokens
            cursor, largest = self.markers(out, at, item.start + item.tokens - at, share, True, cursor, largest)
            at = item.start + item.tokens
        if at < count:
            _ramp3(self.values, out, at, count - at, 0, cursor)
            largest = max(largest, add(count - at - 1, cursor))
        return largest


def place(layout: ItemLayout, out: np.ndarray, text_row: bool, ids: np.ndarray, mask: np.ndarray | None,
          first: np.ndarray | None, count: np.ndarray | None, media: Sequence[np.ndarray | None],
          seconds: Sequence[np.ndarray | None], deltas: np.ndarray, enabled: int) -> int:
    """:meth:`ItemLayout.place` without the compiled loops."""
    reading: Reading = read(layout, ids, mask, first, count, media, seconds, enabled)
    batch, length = ids.shape
    samples = batch if first is None else len(first)
    if out.size != (4 if text_row else 3) * batch * length or deltas.size != samples:
        raise ValueError(f"place_items: out and deltas do not fit a batch of {batch} x {length}")
    if reading.found.status != PLACED:
        return reading.found.status
    assert reading.first is not None and reading.count is not None
    placer, values = _Placer(layout, media, seconds), _Values(layout.float32)
    flat_deltas = deltas.reshape(-1)
    for s, items in enumerate(reading.per_sample):
        begin, tokens = int(reading.first[s]), int(reading.count[s])
        b, column = divmod(begin, length) if begin < batch * length else (batch - 1, length)  # empty, at the end
        rows = [out[b, k] for k in range(4)] if text_row else [out[k, b] for k in range(3)]
        positions = [row[column : column + tokens] for row in (rows[1:] if text_row else rows)]
        largest = placer.sample(positions, tokens, items)
        if text_row:
            rows[0][column : column + tokens] = np.arange(tokens)
        if reading.one_per_row:
            for k, row in enumerate(rows):
                row[:column] = 1 if text_row and k == 0 else layout.padding
                row[column + tokens :] = 1 if text_row and k == 0 else layout.padding
            if layout.padding_in_largest and tokens < length:
                largest = max(largest, float(layout.padding))
        delta = values.add(values.add(largest, 1), -tokens)
        flat_deltas[s] = np.float32(delta) if layout.float32 else int(delta)
    return PLACED
