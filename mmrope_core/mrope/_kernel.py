"""The batched kernel of a :class:`~._family.MropeFamily`: its runs placed by the item primitives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import torch

from ..items import ItemKernel, ItemLayout
from ..items._kernel import Arrays, host_grid
from ..media import read_grid
from ._family import MropeFamily
from ._layout import COMPUTED_SECONDS, IMAGE, VIDEO, family_layout, scales_videos
from ._media import MediaGrids
from ._positions import check_placeholders, in_segments_explained, packed_without_mask, temporal_ids_by_frame

_FIRST = torch.tensor([0])


class MropeKernel(ItemKernel):
    """Positions of a family of placeholder runs without a loop over tokens, samples or media,
    equal to the family's reference; places packed rows where their segments lie.

    Takes the media keys the family declares (:attr:`MropeFamily.input_keys`): its images' and
    videos' grids and, for families that time their videos, their seconds. Other keys are
    ignored, as the reference ignores them.

    Example::

        family = MropeFamily("My-VL", spatial_merge_size=2, image_token_id=151655, image_key="pictures")
        positions, deltas = MropeKernel(family).rope_index(input_ids, attention_mask, pictures=grids)
    """

    def __init__(self, family: MropeFamily) -> None:
        if callable(getattr(type(self), "media", None)):  # an override nothing would call: say so
            raise TypeError(f"{type(self).__name__} defines media(); a kernel of placeholder runs reads its grids "
                            f"through grids(images, videos): override that")
        self.family = family
        self.kinds = family.kinds
        self.token_types = family.token_types()
        self._timed = scales_videos(family)
        image_key, video_key, seconds_key = family.keys
        keys: dict[str, Any] = {IMAGE: image_key}
        if video_key is not None:
            keys[VIDEO] = (video_key, seconds_key) if self._timed else video_key
        # seconds a per-frame family is given place nothing: taken, and left unread
        unread = (seconds_key,) if seconds_key is not None and not self._timed else ()
        super().__init__(family_layout(family), keys, switches=unread)
        self.input_keys = family.input_keys
        self._enabled = self.layout.enabled()
        self._stamped_layout: ItemLayout | None = None
        # the common call hands its inputs on as they are
        self._plain = type(self).grids is MropeKernel.grids

    def __repr__(self) -> str:
        timed = f", temporal ids {self.family.temporal}" if self.family.temporal is not None else ""
        return f"MropeKernel({self.family.name}{timed})"

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        positions, deltas = self.placed(False, input_ids, attention_mask, cu_seqlens,
                                        self._taken(input_ids, attention_mask, cu_seqlens, inputs))
        return (positions if positions.dtype == input_ids.dtype else positions.to(input_ids.dtype)), deltas

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> torch.Tensor:
        positions, _ = self.placed(True, input_ids, attention_mask, cu_seqlens,
                                   self._taken(input_ids, attention_mask, cu_seqlens, inputs))
        return positions

    def _taken(self, input_ids: Any, mask: Any, cu_seqlens: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        """The family's media keys of ``inputs`` (the reference ignores the rest), their grids
        bounded by the batch where the kernel sizes arrays from them."""
        shape = getattr(input_ids, "shape", ())
        if cu_seqlens is not None and len(shape) == 2:
            packed_without_mask(tuple(shape), mask)
        if self._timed and self._half_seconds(inputs):
            read_grid(self.family.video_key or "", inputs.get(self.family.video_key or ""),
                      tokens=int(np.prod(shape)) if len(shape) == 2 else 0)
        if self._known.issuperset(inputs):
            return inputs
        return {key: value for key, value in inputs.items() if key in self._known}

    def layout_for(self, inputs: Mapping[str, Any]) -> tuple[ItemLayout, int]:
        if self._timed and self._half_seconds(inputs):
            if self._stamped_layout is None:
                self._stamped_layout = family_layout(self.family, stamped=True)
            return self._stamped_layout, self._enabled
        return self.layout, self._enabled

    def _half_seconds(self, inputs: Mapping[str, Any]) -> bool:
        """Seconds in a dtype the item loops do not multiply in (half precision)."""
        seconds = inputs.get(self.family.seconds_key)  # type: ignore[arg-type]
        return (isinstance(seconds, torch.Tensor) and seconds.dtype not in COMPUTED_SECONDS
                and inputs.get(self.family.video_key) is not None)  # type: ignore[arg-type]

    def media_arrays(self, inputs: Mapping[str, Any]) -> tuple[Arrays, Arrays]:
        """The grids as the family reads them (see :meth:`grids`) and the videos' seconds;
        half-precision seconds become each frame's temporal id, scaled in torch as the reference
        scales them (see :meth:`layout_for`)."""
        family = self.family
        if self._plain and not self._timed:
            return super().media_arrays(inputs)
        images, videos = self.grids(inputs.get(family.image_key), inputs.get(family.video_key or ""))
        given = {family.image_key: images}
        if family.video_key is not None:
            given[family.video_key] = videos
        if not (self._timed and self._half_seconds(inputs)):
            if self._timed:  # no seconds: one second a grid, as the reference's default
                seconds = inputs.get(family.seconds_key)  # type: ignore[arg-type]
                if seconds is None and isinstance(videos, torch.Tensor) and videos.dim() == 2:
                    seconds = torch.ones(videos.shape[0], dtype=torch.int64)
                given[family.seconds_key] = seconds  # type: ignore[index]
            return super().media_arrays(given)
        grid = host_grid(family.video_key or "", videos)  # (bounded by the batch in _taken)
        _, host = family.seconds_per_grid(inputs.get(family.seconds_key), len(grid))  # type: ignore[arg-type]
        stamps = temporal_ids_by_frame(torch.from_numpy(grid[:, 0]), torch.as_tensor(family.temporal_scale(host)))
        image_grid = None if images is None else host_grid(family.image_key, images)
        return (image_grid, grid), (None, stamps)

    def grids(self, images: Any, videos: Any) -> tuple[Any, Any]:
        """The images' and videos' grids the runs take, from the values of the family's keys: as
        given; a family that reads them otherwise (merged frames, say) overrides this."""
        return images, videos

    def refuse(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
               first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
               inputs: Mapping[str, Any]) -> NoReturn:
        self.read_media(inputs)
        self.explain(layout, enabled, ids, mask, first, count, media, seconds, inputs)  # the runs' messages first
        super().refuse(layout, enabled, ids, mask, first, count, media, seconds, inputs)

    def explain(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
                first: np.ndarray | None, count: np.ndarray | None, media: Arrays, seconds: Arrays,
                inputs: Mapping[str, Any]) -> None:
        """The runs' own messages: which sample, which run, which grid, and how to fix it."""
        bounds = None if first is None else torch.from_numpy(np.append(first, first[-1] + count[-1]))  # type: ignore[index]
        types = self.token_types(ids, bounds)
        grids = {kind.type_id: None if values is None else MediaGrids(torch.from_numpy(values))
                 for kind, values in zip(self.kinds, media)}
        videos = grids.get(2)
        if self.family.per_frame_video and videos is not None:  # the runs take frames
            frames = videos.grid[:, 0]
            if len(frames) and int(frames.min()) > 0 and int(frames.sum()) <= ids.numel():
                grids[2] = MediaGrids(torch.repeat_interleave(videos.grid, frames, dim=0).index_fill_(1, _FIRST, 1))
        if first is not None:
            assert count is not None
            in_segments_explained(types, first, count, self.kinds, grids, self.family.spatial_merge_size)
        else:
            check_placeholders(types, mask, self.kinds, grids, spatial_merge_size=self.family.spatial_merge_size)

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              **inputs: Any) -> dict[str, Any]:
        """Raise the errors :meth:`rope_index` raises for these inputs and return them as the
        family's reference takes them (the seconds as a tensor): the ``check`` of a
        :class:`~mmrope_core.reference.ReferenceKernel`, so that bad inputs get typed errors
        instead of a crash inside the reference."""
        self.rope_index(input_ids, attention_mask, **inputs)
        _, video_key, seconds_key = self.family.keys
        videos = inputs.get(video_key) if video_key is not None and seconds_key is not None else None
        if videos is not None:
            assert seconds_key is not None
            inputs[seconds_key], _ = self.family.seconds_per_grid(inputs.get(seconds_key), videos.shape[0])
        return inputs
