"""A batched M-RoPE kernel for layouts of placeholder runs, for plugins to build on: a plugin
describes its family as data (:class:`MropeFamily`: its placeholders, media keys and temporal rule).

Each run of a placeholder is a media item of its kind, which takes the kind's next grid (or, for
a family that writes text between frames, the next frame): the family is an
:class:`~mmrope_core.items.ItemLayout`, placed by the item primitives (one compiled call that
reads the ids, finds and checks the runs and writes each position once; numpy without it).
Text counts on from where the previous run left off; a run places its tokens on a ``(t, h, w)``
grid from the current position, and the text after it goes on ``max(h, w) // merge`` past that
start. :func:`mrope_positions` does the same from token types, for kinds a plugin defines.
"""

from ..temporal import TemporalRule
from ._family import MropeFamily
from ._kernel import MropeKernel
from ._layout import family_layout
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
    "family_layout",
    "fast_kernel",
    "mrope_position_ids",
    "mrope_positions",
    "probe_batches",
]
