"""A batched M-RoPE kernel for layouts of placeholder runs, for plugins to build on: a plugin
describes its family as data (:class:`MropeFamily`: its placeholders, media keys and temporal rule).

The sequence of a sample is cut into runs of equal token type (0 text, >0 a media kind).
Media runs take the media's grids in order across the batch. Text tokens count up from where the
previous run left off; a media run places its tokens on a ``(t, h, w)`` grid starting at the
current position, and the text after it continues ``max(h, w) // merge`` past that start.

No Python loop runs over tokens, samples or media. Per token there are a few passes: the runs
are read off the places where the token type changes, and the rows of positions are written.
On the CPU those passes are compiled loops (``mmrope_core._native``) that read or write each
token once, the positions written from the runs themselves; on other devices, torch operations
over the batch, each row of positions the cumsum of a counter row with steps put in where
positions do not count on. What is per run, per frame or per grid line is a few hundred
numbers, worked out in numpy, whose small operations cost a fraction of torch's. On a single
sample even those cost more than the passes over its tokens, so on the CPU the common case (see
:mod:`._fused`) is one compiled call that reads the ids, finds and matches the runs and writes the
positions; whatever it does not take goes the step-by-step way.
"""

from ..temporal import TemporalRule
from ._family import MropeFamily
from ._kernel import MropeKernel
from ._media import BetweenMarkersTypes, MediaGrids, MediaKind, TokenTypeMap
from ._positions import check_placeholders, mrope_position_ids, mrope_positions
from ._probe import bind_mrope, fast_kernel, probe_batches

__all__ = [
    "BetweenMarkersTypes",
    "MediaGrids",
    "MediaKind",
    "MropeFamily",
    "MropeKernel",
    "TemporalRule",
    "TokenTypeMap",
    "bind_mrope",
    "check_placeholders",
    "fast_kernel",
    "mrope_position_ids",
    "mrope_positions",
    "probe_batches",
]
