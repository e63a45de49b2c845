"""Media items between marker tokens, placed by a layout given as data: the compiled primitives
any family composes (reading masks and grids, finding items, writing blocks of t/h/w ramps,
merging media by time, temporal ids by a rule), with numpy doing the same where they are missing.

A family describes its reference as an :class:`ItemLayout`: its media (:class:`GridMedia`,
:class:`SequenceMedia`), its kinds of items (:class:`ItemKind`: the tokens that open and close
each, its placeholders, how it is placed) and a :class:`TemporalRule`. :class:`ItemKernel` turns
a layout into a kernel that places padded batches, packed rows and the model's four rows.

Example (a video and its audio between two markers, merged by time)::

    from mmrope_core.items import GridMedia, ItemKernel, ItemKind, ItemLayout, SequenceMedia, TemporalRule

    layout = ItemLayout(
        media=(GridMedia("video", merge=2, timed=True), SequenceMedia("audio")),
        kinds=(ItemKind("clip", key=(CLIP_START,), media=("video", "audio"), placeholders=(VIDEO, AUDIO),
                        closing=(CLIP_END,), interleave="time"),),
        temporal=TemporalRule(per_second=2.0))
    kernel = ItemKernel(layout, {"video": ("clip_grids", "clip_seconds"), "audio": "sound_lengths"})
"""

from ..temporal import TemporalRule
from ._kernel import ItemKernel, host_batch, packed_segments
from ._layout import ItemLayout
from ._read import Found, Item
from ._spec import (
    BAD_MEDIA,
    EMPTY_SAMPLE,
    MISMATCH,
    PADDING_INSIDE,
    PLACED,
    GridMedia,
    ItemKind,
    SequenceMedia,
)

__all__ = [
    "BAD_MEDIA",
    "EMPTY_SAMPLE",
    "MISMATCH",
    "PADDING_INSIDE",
    "PLACED",
    "Found",
    "GridMedia",
    "Item",
    "ItemKernel",
    "ItemKind",
    "ItemLayout",
    "SequenceMedia",
    "TemporalRule",
    "host_batch",
    "packed_segments",
]
