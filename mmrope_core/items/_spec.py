"""What a layout of media items is made of: its media, its kinds of items and its temporal rule.
Each checks itself when built, so a plugin's mistake shows where it is made."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

#: What placing a batch returns: placed, or why not (see :meth:`ItemLayout.place`).
PLACED, MISMATCH, PADDING_INSIDE, BAD_MEDIA, EMPTY_SAMPLE = range(5)

#: mmrope_core.media.MAX_SECONDS_PER_GRID: temporal ids of any grid a row holds fit int64.
MAX_SECONDS = 2.0**20
MAX_KEY, MAX_CLOSING, MAX_MEDIA, MAX_KINDS, MAX_STEPS = 4, 4, 8, 16, 4
_LIMIT = 2**20


def _tokens(owner: str, field: str, value: object, most: int, least: int = 0) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not least <= len(value) <= most or not all(
            type(token) is int and -(2**63) <= token < 2**63 for token in value):
        raise ValueError(f"{owner}.{field} must be a tuple of {least} to {most} token ids (ints), got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class GridMedia:
    """Media whose items are ``(t, h, w)`` grids of patches (images, videos): an item takes
    ``t * (h / merge) * (w / merge)`` placeholder tokens and is placed frame by frame, its tokens
    on ``(temporal id, line, column)`` from where it starts.

    Attributes:
        name: what kinds and messages call it, e.g. ``"video"``.
        merge: patches merged per side.
        timed: each grid comes with its seconds per grid (float32, float64 or int64), which
            scale its temporal ids (see :class:`TemporalRule`; ``precision="seconds"`` computes in
            the arithmetic their dtype gives); untimed grids count one whole second each (an int64
            1 for ``precision="seconds"``).
        stamped: each frame comes with its own time stamp, in seconds from its grid's start (not
            decreasing within a grid): frame ``f`` takes the rule applied to its stamp, as
            if the stamp were ``f * seconds`` (a float32 or float64 rule, without
            ``whole_seconds``). A grid is timed or stamped, not both.
        per_frame: each frame is an item of its own (a processor writes text, a time stamp,
            between frames): each item taking this medium takes the next frame, of the current
            grid then of the next, placed as a grid of one frame ``(1, h, w)``. Untimed and
            unstamped; media left over count frames.
        scaled: its frames' temporal ids follow the layout's rule (untimed: at one second a
            grid); False: each frame at its index, whatever the rule (a reference that spaces out
            only its videos in time). Neither timed nor stamped.
    """

    name: str
    merge: int = 1
    timed: bool = False
    stamped: bool = False
    per_frame: bool = False
    scaled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"GridMedia.name must be a non-empty string, got {self.name!r}")
        if type(self.merge) is not int or not 1 <= self.merge <= _LIMIT:
            raise ValueError(f"GridMedia {self.name!r}: merge must be an int from 1 to 2**20, got {self.merge!r}")
        if not all(isinstance(flag, bool) for flag in (self.timed, self.stamped, self.per_frame, self.scaled)):
            raise ValueError(f"GridMedia {self.name!r}: timed, stamped, per_frame and scaled must be bools")
        if not self.scaled and (self.timed or self.stamped):
            raise ValueError(f"GridMedia {self.name!r}: unscaled grids place each frame at its index; they are not "
                             f"timed nor stamped")
        if self.per_frame and (self.timed or self.stamped):
            raise ValueError(f"GridMedia {self.name!r}: per_frame grids are placed a frame at a time as untimed grids; "
                             f"they are not timed nor stamped")
        if self.timed and self.stamped:
            raise ValueError(f"GridMedia {self.name!r}: a grid is timed (seconds per grid) or stamped (a time stamp "
                             f"per frame), not both")


@dataclasses.dataclass(frozen=True)
class SequenceMedia:
    """Media whose items are sequences of frames (audio): an item of ``n`` frames takes the
    tokens an encoder leaves of them, one position each from where it starts.

    The frames left after whole windows of ``window`` frames (each giving ``per_window`` tokens)
    pass the strided ``steps``, each taking ``n`` frames to ``(n - drop) // stride + 1``. Without
    steps and windows, the lengths given are the tokens.

    Attributes:
        name: what kinds and messages call it, e.g. ``"audio"``.
        steps: ``((drop, stride), ...)``, at most four.
        window, per_window: frames of a window, and the tokens it gives (at most 64 a frame).

    Example: a convolution of stride 2 then a pooling of 2, ``((1, 2), (2, 2))``.
    """

    name: str
    steps: tuple[tuple[int, int], ...] = ()
    window: int = 0
    per_window: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"SequenceMedia.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.steps, tuple) or len(self.steps) > MAX_STEPS or not all(
                isinstance(step, tuple) and len(step) == 2 and all(type(v) is int for v in step)
                and 0 <= step[0] <= _LIMIT and 1 <= step[1] <= _LIMIT for step in self.steps):
            raise ValueError(f"SequenceMedia {self.name!r}: steps must be up to {MAX_STEPS} (drop, stride) pairs of "
                             f"ints, drop from 0 and stride from 1 to 2**20, got {self.steps!r}")
        if not (type(self.window) is int and type(self.per_window) is int and 0 <= self.window <= _LIMIT
                and 0 <= self.per_window <= 64 * self.window):
            raise ValueError(f"SequenceMedia {self.name!r}: window and per_window must be ints with window up to "
                             f"2**20 and 0 <= per_window <= 64 * window, got {self.window!r} and {self.per_window!r}")

    def tokens(self, lengths: Any) -> Any:
        """The tokens of each of ``lengths`` (an int64 numpy array or torch tensor)."""
        whole, rest = (lengths // self.window, lengths % self.window) if self.window else (0, lengths)
        for drop, stride in self.steps:
            rest = (rest - drop) // stride + 1
        return rest + whole * self.per_window


Media = GridMedia | SequenceMedia


INTERLEAVES = {None: 0, "time": 1, "chunks": 2, "groups": 3}
RESUMES = {"largest": 0, "last": 1, "spatial": 2}
#: the compiled loops' forms of positions, by (summed in float32, written truncated to int64)
FORMS = {(False, False): 0, (True, False): 1, (True, True): 2}


@dataclasses.dataclass(frozen=True)
class ItemKind:
    """One kind of media item: the tokens that open it, its media's placeholders, the markers
    that close it, and how it is placed.

    Reading: an item opens where its ``key`` tokens stand (markers, then possibly its first
    placeholder), takes the next item of each of its ``media`` (in the batch's order), whose
    placeholders follow its opening markers (as many as the media take, in any order), then its
    ``closing`` markers. A placeholder outside any item is a mismatch; so is, with
    ``whole_run``, a placeholder of its own right after its media's (a reference that cuts media
    at runs of equal placeholders takes an item's placeholders as a whole run). A kind ``inside`` a
    ``(begin, end)`` pair of markers opens only where more ``begin`` than ``end`` markers precede
    its key in its sample (a video reusing the image placeholder between begin- and end-of-video
    markers, listed before the image kind, which opens everywhere else); the markers are text.

    Placing: text counts on to it; ``lead`` tokens of its opening count on (``markers="count"``)
    or share one position (``"share"``); its media block starts one past them: a grid frame by
    frame, a sequence one position a token, or both merged by ``interleave``; the tokens after the
    block (its closing markers) count on (or share one position) from one past the block's
    largest position (``resume="largest"``), that of the part placed last (``"last"``) or its
    largest line or column position, its temporal ids left out (``"spatial"``: ``max(h, w)``
    past a grid's start however many frames it has; one grid medium only); the next text or
    item goes on from there. A sample's delta counts every position either way.

    Attributes:
        name: shown in messages, e.g. ``"video with its audio"``.
        key: one to four tokens that open it.
        media: one medium's name, or a grid's and a sequence's to interleave.
        placeholders: each medium's placeholder token.
        closing: up to four closing markers.
        begins_with: the placeholder its media must begin with, if any.
        markers, lead, resume: how its markers are placed (``lead``: tokens of its key before its
            media block; by default its opening markers).
        interleave: ``"time"`` (each frame at its temporal id, the sequence's tokens before the
            frames they precede, the frame first on a tie), ``"chunks"`` (both cut into chunks of
            ``chunk`` positions, the grid's chunk then the sequence's) or ``"groups"`` (frames
            grouped by temporal id // ``chunk``, each group then the next ``chunk`` tokens).
        whole_run: its placeholders are a whole run: the token after them may not be one of its
            placeholders.
        inside: ``(begin, end)``: two text tokens between which it opens, or None (anywhere).
    """

    name: str
    key: tuple[int, ...]
    media: tuple[str, ...]
    placeholders: tuple[int, ...]
    closing: tuple[int, ...] = ()
    begins_with: int | None = None
    markers: Literal["count", "share"] = "count"
    lead: int | None = None
    interleave: Literal["time", "chunks", "groups"] | None = None
    chunk: int = 0
    resume: Literal["largest", "last", "spatial"] = "largest"
    whole_run: bool = False
    inside: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        owner = f"ItemKind {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ItemKind.name must be a non-empty string, got {self.name!r}")
        _tokens(owner, "key", self.key, MAX_KEY, 1)
        _tokens(owner, "closing", self.closing, MAX_CLOSING)
        _tokens(owner, "placeholders", self.placeholders, 2, 1)
        if not isinstance(self.media, tuple) or len(self.media) != len(self.placeholders) or not all(
                isinstance(name, str) for name in self.media):
            raise ValueError(f"{owner}: media must name one medium per placeholder, got {self.media!r}")
        if self.begins_with is not None and self.begins_with not in self.placeholders:
            raise ValueError(f"{owner}: begins_with must be one of its placeholders, got {self.begins_with!r}")
        if self.markers not in ("count", "share") or self.resume not in RESUMES:
            raise ValueError(f"{owner}: markers is 'count' or 'share', resume 'largest', 'last' or 'spatial'")
        if not isinstance(self.whole_run, bool):
            raise ValueError(f"{owner}: whole_run must be a bool, got {self.whole_run!r}")
        if self.lead is not None and not (type(self.lead) is int and 0 <= self.lead <= self.opening):
            raise ValueError(f"{owner}: lead must be an int from 0 to its {self.opening} opening markers")
        if self.interleave not in INTERLEAVES or (self.interleave is None) != (len(self.media) == 1):
            raise ValueError(f"{owner}: two media are interleaved by 'time', 'chunks' or 'groups'; one is not")
        if type(self.chunk) is not int or (self.interleave in ("chunks", "groups") and not 1 <= self.chunk <= _LIMIT):
            raise ValueError(f"{owner}: interleave={self.interleave!r} needs a chunk from 1 to 2**20")
        if self.inside is not None and (_tokens(owner, "inside", self.inside, 2, 2)[0] == self.inside[1] or set(
                self.inside) & {*self.key, *self.placeholders, *self.closing}):
            raise ValueError(f"{owner}: inside must be two distinct text tokens (begin, end), none of its key, "
                             f"placeholders or closing markers, got {self.inside!r}")

    @property
    def opening(self) -> int:
        """The key's markers: its tokens before the first of its placeholders."""
        return next((k for k, token in enumerate(self.key) if token in self.placeholders), len(self.key))
