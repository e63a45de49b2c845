"""How a model takes a batch, as its plugin declares it: what its media keys hold (grids,
seconds, time stamps, audio lengths, audio masks), the keys its processor batches in its own way, the padding
side the model itself gets wrong, the rows of positions it reads.

A plugin returns a :class:`BatchLayout` from the ``batch_layout`` hook. The engine reads and
checks every key of a declared :attr:`MediaKey.role` before any hook or kernel sees it (see
:mod:`mmrope_core.media`); its ``batch`` and ``collate`` and both collators follow the batching
rules. A key declared with a role only is batched the common way: concatenated on dim 0, the
varying dimensions zero-padded.

A key's :attr:`MediaKey.medium` says which kind of media item it holds one entry of each: by it
a trainer's padded batch is shared out among its rows (each row computed as its sample alone).

Example::

    BatchLayout(media={"image_grid_thw": IMAGE_GRID, "video_grid_thw": VIDEO_GRID,
                       "second_per_grid_ts": MediaKey(role="seconds", grid="video_grid_thw")})
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

#: ``empty_item(shape, dtype)``: the value of the item slots a sample does not fill.
EmptyItem = Callable[[tuple[int, ...], Any], Any]
#: What a media key holds, as the engine reads it (see :mod:`mmrope_core.media`).
Role = Literal["grid", "seconds", "stamps", "audio_lengths", "audio_mask"]
ROLES: tuple[Role, ...] = ("grid", "seconds", "stamps", "audio_lengths", "audio_mask")
#: Roles that count the rows of a grid key.
_GRID_COUNTS = ("seconds", "stamps")
#: The kinds of media item a trainer counts in a sample, of which a key may hold one entry each.
Medium = Literal["image", "video", "audio"]
MEDIA: tuple[Medium, ...] = ("image", "video", "audio")
#: Roles that hold one entry per audio by what they are.
_AUDIO_ROLES = ("audio_lengths", "audio_mask")


@dataclasses.dataclass(frozen=True)
class MediaKey:
    """What one media key holds, and how its per-sample tensors become the batch's, as the
    processor's own batched call makes them.

    Attributes:
        role: what the key holds, read and checked by the engine before any hook or kernel sees
            it: ``"grid"``, ``(N, 3)`` positive ``(t, h, w)`` patch counts that fit the batch's
            tokens; ``"seconds"``, seconds per grid, one per row of the key ``grid`` names;
            ``"stamps"``, a time stamp per frame of those grids (seconds from its grid's start, not
            decreasing within a grid), grid after grid;
            ``"audio_lengths"``, feature frames per audio; ``"audio_mask"``, an
            ``(audios, frames)`` feature mask. None: the engine passes the key on unread.
        grid: for ``role="seconds"`` or ``"stamps"``, the grid key (declared with ``role="grid"``)
            whose rows the values count: one value per video of ``"video_grid_thw"``, or one per
            frame of its videos.
        medium: the kind of media item the key holds one entry (row) of each, in the samples'
            order: ``"image"``, ``"video"`` or ``"audio"``. A trainer's padded batch is shared
            out among its rows by it, where each row is computed as its sample alone. A
            ``"seconds"`` or ``"stamps"`` key counts its grid's items (or their frames), an ``"audio_lengths"`` or
            ``"audio_mask"`` key one entry per audio: they need none.
        join: ``"rows"``: each sample's tensor is one or more rows, concatenated on dim 0;
            ``"last"``: each sample's ``(1, ..., W_i)`` is joined on the last dim into one
            ``(1, ..., sum W_i)`` (MiniCPM-V's image strips).
        items_dim: the dim counting a sample's items (Mllama's images): every sample gets a row,
            a sample without the key one with no items, and the slots a sample does not fill
            hold ``empty_item`` (zeros by default).
        empty_item: ``empty_item(shape, dtype)``, the value of unfilled item slots of that shape.
        pad_value: the value of the entries added where samples' tensors differ in size (1 for
            Phi-4-multimodal's crop masks: its image processor marks a padded crop attended).
        token_dim: the dim holding one entry per token (Mllama's ``cross_attention_mask``: 1):
            padded to the batch's length on the padding side, as the ids are.
        per_row: the model places the key itself, one per batch row (GIT prepends each row's
            image; the text holds no placeholder): every sample must hold it, and a packed row
            cannot hold several.
        uniform: the model reads one value for the whole batch (GLM-Image's
            ``images_per_sample``): samples whose values differ cannot share a batch.
        all_or_none: every sample of a batch holds the key or none does (GLM-Image's source
            images: its processor batches image-to-image or text-to-image samples, not a mix).
        indexes: the name of the key whose entries this key's values index, counted over all its
            dims but the last (Molmo2's ``image_token_pooling`` indexes the patches of its
            ``pixel_values``): each sample's indices are shifted past the entries of the samples
            before it, as the processor numbers them in one call; negative values (none) are kept.
        switched_by: a key whose presence anywhere in the batch switches how the model takes
            this one (Phi-4-multimodal projects audio for vision once the batch holds
            ``image_pixel_values``): a sample holding this key without that one cannot share a
            batch with samples holding it.
        one_shape: why samples whose tensors of the key differ in shape cannot share a batch
            (Granite Speech's encoder reads every frame of the batch's longest clip, a shorter
            clip's padding too); empty where they can.
    """

    join: Literal["rows", "last"] = "rows"
    items_dim: int | None = None
    empty_item: EmptyItem | None = None
    pad_value: float = 0
    token_dim: int | None = None
    per_row: bool = False
    uniform: bool = False
    all_or_none: bool = False
    indexes: str | None = None
    switched_by: str | None = None
    one_shape: str = ""
    role: Role | None = None
    grid: str | None = None
    medium: Medium | None = None

    def __post_init__(self) -> None:
        if self.role is not None and self.role not in ROLES:
            raise TypeError(f"MediaKey.role must be one of {ROLES} or None, got {self.role!r}")
        if (self.role in _GRID_COUNTS) != (self.grid is not None) or not isinstance(self.grid, (str, type(None))):
            raise TypeError(f"MediaKey(role={self.role if self.role in _GRID_COUNTS else 'seconds'!r}) needs grid, "
                            f"the name of the grid key whose rows it counts; other roles take no grid")
        if self.medium is not None and self.medium not in MEDIA:
            raise TypeError(f"MediaKey.medium must be one of {MEDIA} or None, got {self.medium!r}")
        if self.role in _AUDIO_ROLES and self.medium not in (None, "audio"):
            raise TypeError(f"MediaKey(role={self.role!r}) holds one entry per audio: its medium is 'audio', "
                            f"not {self.medium!r}")
        if self.role == "stamps" and self.medium is not None:
            raise TypeError(f"MediaKey(role='stamps') holds one entry per frame of its grid, not per item: it takes no "
                            f"medium (got {self.medium!r}); declare the medium on its grid")
        if self.join not in ("rows", "last"):
            raise TypeError(f"MediaKey.join must be 'rows' or 'last', got {self.join!r}")
        for name in ("items_dim", "token_dim"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise TypeError(f"MediaKey.{name} must be a dim >= 1 (dim 0 is the batch's) or None, got {value!r}")
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, (int, float)):
            raise TypeError(f"MediaKey.pad_value must be a number, got {self.pad_value!r}")
        if self.empty_item is not None and (self.items_dim is None or not callable(self.empty_item)):
            raise TypeError("MediaKey.empty_item must be callable, and needs items_dim")
        if not isinstance(self.one_shape, str):
            raise TypeError("MediaKey.one_shape must be a reason users can read (empty when shapes may differ)")
        if self.join == "last" and (self.items_dim is not None or self.token_dim is not None):
            raise TypeError("MediaKey(join='last') joins one row per sample: it takes no items_dim or token_dim")
        if self.indexes is not None and (not isinstance(self.indexes, str) or self.join != "rows"):
            raise TypeError("MediaKey.indexes must name the key it indexes, and joins rows")

    @property
    def common_batching(self) -> bool:
        """Whether the key is batched the common way (concatenated on dim 0): it declares its role only."""
        return dataclasses.replace(self, role=None, grid=None, medium=None) == MediaKey()


#: A key holding ``(N, 3)`` grids, batched the common way.
GRID = MediaKey(role="grid")
#: A key holding one ``(t, h, w)`` grid per image, batched the common way.
IMAGE_GRID = MediaKey(role="grid", medium="image")
#: A key holding one ``(t, h, w)`` grid per video, batched the common way.
VIDEO_GRID = MediaKey(role="grid", medium="video")


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """How a model takes a batch of samples, where it differs from the common case.

    Attributes:
        media: media key -> :class:`MediaKey`: what the key holds, and how it is batched; keys
            not listed are passed on unread and concatenated on dim 0.
        text_positions: whether the model takes M-RoPE positions with the text positions as their
            first row (transformers' ``(4, B, L)`` for three M-RoPE rows); False: only the rows
            its rotary embedding reads (HunYuan-VL's four xD-RoPE rows).
        takes_positions: False where the model takes no ``position_ids`` and counts its 1-D
            positions from the attention mask itself (InstructBLIP-Video's forward hands them on to
            its Q-Former): ``PaddedCollator`` leaves them out of the batch.
        refused_sides: padding side -> why the model's own layers give a sample padded on that
            side other logits than the sample alone; ``PaddedCollator`` refuses the side.
        labels_right: the labels are a sequence of their own (an encoder-decoder's decoder
            targets): padded on the right whatever side the ids are padded on.
        packing: why a packed row cannot hold this model's media (empty when it can).
        first_position: the 1-D position the model gives a sample's first token, where it is not 0
            (RoBERTa-style position embeddings count from ``padding_idx + 1``, Kosmos-2's): the
            collators' positions start there.
    """

    media: Mapping[str, MediaKey] = dataclasses.field(default_factory=dict)
    text_positions: bool = True
    takes_positions: bool = True
    refused_sides: Mapping[str, str] = dataclasses.field(default_factory=dict)
    labels_right: bool = False
    packing: str = ""
    first_position: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.media, Mapping) or not all(
                isinstance(key, str) and isinstance(rule, MediaKey) for key, rule in self.media.items()):
            raise TypeError("BatchLayout.media must map key names to MediaKey")
        for key, rule in self.media.items():
            if rule.grid is not None and getattr(self.media.get(rule.grid), "role", None) != "grid":
                raise TypeError(f"BatchLayout.media[{key!r}] counts the rows of {rule.grid!r}: declare "
                                f"{rule.grid!r} too, as MediaKey(role='grid')")
            own = self.media[rule.grid].medium if rule.grid is not None else None
            if rule.medium is not None and own is not None and rule.medium != own:
                raise TypeError(f"BatchLayout.media[{key!r}] counts the {own} items of {rule.grid!r}: its medium is "
                                f"{own!r}, not {rule.medium!r}")
        if not set(self.refused_sides) <= {"left", "right"} or not all(
                isinstance(why, str) and why for why in self.refused_sides.values()):
            raise TypeError("BatchLayout.refused_sides must map 'left'/'right' to a reason users can read")
        if not isinstance(self.packing, str):
            raise TypeError("BatchLayout.packing must be a string (empty when packed rows hold the media)")
        if isinstance(self.first_position, bool) or not isinstance(self.first_position, int) or self.first_position < 0:
            raise TypeError(f"BatchLayout.first_position must be an int >= 0, got {self.first_position!r}")
        object.__setattr__(self, "media", types.MappingProxyType(dict(self.media)))
        object.__setattr__(self, "refused_sides", types.MappingProxyType(dict(self.refused_sides)))

    def with_media(self, media: Mapping[str, MediaKey]) -> BatchLayout:
        """This layout with the keys of ``media`` added; a key it holds already keeps its batching
        rule and takes the role and medium given in ``media`` where it declares none."""
        merged = dict(self.media)
        for key, rule in media.items():
            own = merged.get(key)
            if own is not None and own.role is None:
                own = dataclasses.replace(own, role=rule.role, grid=rule.grid)
            if own is not None and own.medium is None:
                own = dataclasses.replace(own, medium=rule.medium)
            merged[key] = rule if own is None else own
        return dataclasses.replace(self, media=merged)

    def medium_of(self, key: str) -> Medium | None:
        """The kind of media item ``key`` holds one entry of each, as declared: its own
        :attr:`MediaKey.medium`, its grid's for a ``"seconds"`` key, ``"audio"`` for an audio
        role; None for a ``"stamps"`` key (one entry a frame) and where the layout does not say."""
        rule = self.media.get(key)
        if rule is None:
            return None
        if rule.medium is not None:
            return rule.medium
        if rule.role == "stamps":  # one entry per frame of its grid's items, not per item
            return None
        if rule.grid is not None:
            return self.media[rule.grid].medium
        return "audio" if rule.role in _AUDIO_ROLES else None

    @property
    def packing_refusal(self) -> str:
        """Why a packed row cannot hold the media: the layout's own reason, or the keys placed per row."""
        per_row = [key for key, rule in self.media.items() if rule.per_row]
        if self.packing or not per_row:
            return self.packing
        return (f"the model places {', '.join(per_row)} itself, one per batch row (the text holds no placeholder), "
                f"so a packed row would hand every segment's media to one row")


COMMON = BatchLayout()


def first_item_slot(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Unfilled item slots marking their first entry (Mllama's ``aspect_ratio_mask``: an absent
    image counts one tile, as its image processor pads it)."""
    import torch  # listing plugins does not need it

    value = torch.zeros(shape, dtype=dtype)
    value[..., 0] = 1
    return value
