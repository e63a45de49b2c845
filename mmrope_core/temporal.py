"""How a grid's frame gets its temporal id from the grid's seconds: a rule given as data, which
every layout of the core (media items, placeholder runs) and the compiled loops follow."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

#: The arithmetic a rule computes in: float32 or float64 whatever the seconds' dtype, or
#: ``"seconds"``, the dtype numpy and torch form ``per_second * seconds`` in (float seconds keep
#: theirs; whole seconds give int64 for a whole ``per_second``).
Precision = Literal["float32", "float64", "seconds"]


@dataclasses.dataclass(frozen=True)
class TemporalRule:
    """How a grid's frame ``f`` gets its temporal id from its seconds per grid ``s`` and the
    positions per second ``p``: ``(f * s) * p`` (``order="frame_first"``) or ``f * (s * p)``
    (``"scale_first"``), in the arithmetic of ``precision``, truncated toward zero or not; with
    ``whole_seconds``, ``s`` is truncated to whole seconds first. Each family's reference fixes
    all of them; untimed grids take ``s = 1``.

    Example: ``TemporalRule(25.0, "frame_first", "float32", truncate=False)`` keeps fractions.
    """

    per_second: float = 1.0
    order: Literal["frame_first", "scale_first"] = "scale_first"
    precision: Precision = "float64"
    truncate: bool = True
    whole_seconds: bool = False

    def __post_init__(self) -> None:
        if type(self.per_second) not in (int, float) or not (math.isfinite(self.per_second) and self.per_second >= 0):
            raise ValueError(f"TemporalRule.per_second must be a finite number, not negative, got {self.per_second!r}")
        if self.order not in ("frame_first", "scale_first"):
            raise ValueError(f"TemporalRule.order must be 'frame_first' or 'scale_first', got {self.order!r}")
        if self.precision not in ("float32", "float64", "seconds"):
            raise ValueError(f"TemporalRule.precision must be 'float32', 'float64' or 'seconds', "
                             f"got {self.precision!r}")
        if not isinstance(self.truncate, bool) or not isinstance(self.whole_seconds, bool):
            raise ValueError("TemporalRule.truncate and TemporalRule.whole_seconds must be bools")

    def __str__(self) -> str:
        seconds = "trunc(s)" if self.whole_seconds else "s"
        product = (f"(f * {seconds}) * {self.per_second}" if self.order == "frame_first"
                   else f"f * ({seconds} * {self.per_second})")
        arithmetic = "the seconds' dtype" if self.precision == "seconds" else self.precision
        return f"{'trunc(' + product + ')' if self.truncate else product} in {arithmetic}"
