"""A family of placeholder runs as an item layout: each run of a placeholder is an item of its
kind, taking the kind's next grid (or frame), so the item primitives place every runs family."""

from __future__ import annotations

import functools
from typing import Literal

import torch

from ..items import GridMedia, ItemKind, ItemLayout
from ..temporal import TemporalRule
from ._family import MropeFamily
from ._media import MediaKind

#: The rule of untimed grids: frame ``f`` at temporal id ``f``.
UNTIMED = TemporalRule(per_second=1)
#: The rule of temporal ids given one a frame, before truncation (as "stamps").
STAMPS = TemporalRule(per_second=1, precision="float32")
#: What items are called in a family's layout.
IMAGE, VIDEO = "image", "video"
#: Seconds (and scales) the item loops multiply in, integers as int64; others (half precision)
#: are scaled in torch as the reference scales them, and handed over as one temporal id a frame.
COMPUTED_SECONDS = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def scales_videos(family: MropeFamily) -> bool:
    """Its videos' temporal ids are scaled by their seconds (a video split into frames places each
    frame alone, at temporal id 0)."""
    return family.timed and not family.per_frame_video


def resume(resume_past_frames: bool) -> Literal["largest", "spatial"]:
    """The text after a run goes on ``max(h, w)`` past its start (``"spatial"``), or past its
    largest position on any axis where that is further (a rollout engine's rule: ``"largest"``)."""
    return "largest" if resume_past_frames else "spatial"


def family_layout(family: MropeFamily, stamped: bool = False) -> ItemLayout:
    """``family``'s positions as an :class:`~mmrope_core.items.ItemLayout` over its token ids:
    images where the image placeholder runs, videos where the video placeholder runs (or, for a
    family whose videos reuse the image placeholder between markers, where it runs inside them),
    each video frame an item of its own for a per-frame family. ``stamped``: the videos' temporal
    ids come one a frame (the kernel's way with half-precision seconds)."""
    merge, after, timed = family.spatial_merge_size, resume(family.resume_past_frames), scales_videos(family)
    image = ItemKind(IMAGE, key=(family.image_token_id,), media=(IMAGE,), placeholders=(family.image_token_id,),
                     resume=after, whole_run=True)
    media: tuple[GridMedia, ...] = (GridMedia(IMAGE, merge, scaled=False),)
    kinds: tuple[ItemKind, ...] = (image,)
    if family.has_video:
        media += (GridMedia(VIDEO, merge, timed=timed and not stamped, stamped=timed and stamped,
                            per_frame=family.per_frame_video, scaled=timed),)
        if family.video_markers is not None:
            video = ItemKind(VIDEO, key=(family.image_token_id,), media=(VIDEO,),
                             placeholders=(family.image_token_id,), resume=after, whole_run=True,
                             inside=family.video_markers)
            kinds = (video, image)
        else:
            assert family.video_token_id is not None  # (a family with videos has one or the other)
            kinds += (ItemKind(VIDEO, key=(family.video_token_id,), media=(VIDEO,),
                               placeholders=(family.video_token_id,), resume=after, whole_run=True),)
    temporal = STAMPS if stamped else family.temporal if timed and family.temporal else UNTIMED
    return ItemLayout(media=media, kinds=kinds, temporal=temporal, empty_samples=True)


def types_layout(kinds: tuple[MediaKind, ...], merge: int, timed: frozenset[int], rule: TemporalRule,
                 resume_past_frames: bool, stamped: bool = False) -> ItemLayout:
    """The layout of :func:`~._positions.mrope_positions`: token types as ids, each kind's runs of
    its ``type_id`` taking its grids; the kinds ``timed`` (type ids) have their temporal ids
    scaled by ``rule`` (``stamped``: given one a frame, before truncation)."""
    # a rule's per_second of 2 and of 2.0 are equal, yet multiply in other dtypes: both are keys
    return _types_layout(kinds, merge, timed, rule, isinstance(rule.per_second, int), resume_past_frames, stamped)


@functools.lru_cache(maxsize=64)
def _types_layout(kinds: tuple[MediaKind, ...], merge: int, timed: frozenset[int], rule: TemporalRule,
                  whole_per_second: bool, resume_past_frames: bool, stamped: bool) -> ItemLayout:
    after = resume(resume_past_frames)
    return ItemLayout(
        media=tuple(GridMedia(item_name(kind), merge, timed=kind.type_id in timed and not stamped,
                              stamped=kind.type_id in timed and stamped, scaled=kind.type_id in timed)
                    for kind in kinds),
        kinds=tuple(ItemKind(item_name(kind), key=(kind.type_id,), media=(item_name(kind),), placeholders=(kind.type_id,),
                             resume=after, whole_run=True) for kind in kinds),
        temporal=STAMPS if stamped else rule, empty_samples=True)


def item_name(kind: MediaKind) -> str:
    """What the layout of :func:`types_layout` calls a kind's items and medium."""
    return f"{kind.name} ({kind.type_id})"
