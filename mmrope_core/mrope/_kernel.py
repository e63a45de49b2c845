"""The batched kernel of a :class:`~._family.MropeFamily`, on the kernel contract."""

from __future__ import annotations

from typing import Any

import torch

from ..kernel import RopeKernel
from ..media import read_grid
from ._family import MropeFamily
from ._fused import FusedPositions
from ._media import MediaGrids
from ._positions import check_placeholders, mrope_position_ids, mrope_positions


class MropeKernel(RopeKernel):
    """Positions of a family of placeholder runs without a loop over tokens, samples or media,
    equal to the family's reference; places packed rows where their segments lie.

    Takes the media keys the family declares (:attr:`MropeFamily.input_keys`): its images' and
    videos' grids and, for families that time their videos, their seconds. Other keys are
    ignored, as the reference ignores them.

    Example::

        family = MropeFamily("My-VL", spatial_merge_size=2, image_token_id=151655, image_key="pictures")
        positions, deltas = MropeKernel(family).rope_index(input_ids, attention_mask, pictures=grids)
    """

    places_packed_rows = True
    samples_independent = True  # every row computed alike: the conformance suite holds it to that

    def __init__(self, family: MropeFamily) -> None:
        self.family = family
        self.input_keys = family.input_keys
        self.kinds = family.kinds
        self.token_types = family.token_types()
        # a subclass that reads its inputs its own way takes the step-by-step path
        own_reading = type(self)._read is MropeKernel._read and type(self).media is MropeKernel.media
        self._fused = FusedPositions.of(family, self.kinds, self.token_types) if own_reading else None

    def __repr__(self) -> str:
        timed = f", temporal ids {self.family.temporal}" if self.family.temporal is not None else ""
        return f"MropeKernel({self.family.name}{timed})"

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        written = self._written(False, input_ids, attention_mask, cu_seqlens, inputs)
        if written is not None:
            return written
        types, media = self._read(input_ids, cu_seqlens, **inputs)
        return mrope_positions(types, _bool(attention_mask), self.kinds, media, cu_seqlens=cu_seqlens,
                               resume_past_frames=self.family.resume_past_frames,
                               spatial_merge_size=self.family.spatial_merge_size, out_dtype=input_ids.dtype)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> torch.Tensor:
        written = self._written(True, input_ids, attention_mask, cu_seqlens, inputs)
        if written is not None:
            return written
        types, media = self._read(input_ids, cu_seqlens, **inputs)
        return mrope_position_ids(types, _bool(attention_mask), self.kinds, media, cu_seqlens=cu_seqlens,
                                  resume_past_frames=self.family.resume_past_frames,
                                  spatial_merge_size=self.family.spatial_merge_size)

    def _written(self, text_row: bool, input_ids: Any, attention_mask: Any, cu_seqlens: Any,
                 inputs: dict[str, Any]) -> Any:
        """The positions of the compiled call (see :mod:`._fused`), or None where the
        step-by-step path is to compute them (or to say why it cannot)."""
        if self._fused is None or self.token_types is not self._fused.token_types:
            return None
        if attention_mask is not None and not isinstance(attention_mask, torch.Tensor):
            return None
        return self._fused(text_row, input_ids, _bool(attention_mask), cu_seqlens, inputs)

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              **inputs: Any) -> dict[str, Any]:
        """Raise the errors :meth:`rope_index` raises for these inputs, computing nothing, and
        return them as the family's reference takes them (the seconds as a tensor):
        the ``check`` of a :class:`~mmrope_core.reference.ReferenceKernel`, so that bad inputs
        get typed errors instead of a crash inside the reference."""
        types, media = self._read(input_ids, None, **inputs)
        check_placeholders(types, _bool(attention_mask), self.kinds, media,
                           spatial_merge_size=self.family.spatial_merge_size)
        _, video_key, seconds_key = self.family.keys
        videos = inputs.get(video_key) if video_key is not None and seconds_key is not None else None
        if videos is not None:
            assert seconds_key is not None
            inputs[seconds_key], _ = self.family.seconds_per_grid(inputs.get(seconds_key), videos.shape[0])
        return inputs

    def media(self, images: Any = None, videos: Any = None, seconds: Any = None) -> dict[int, MediaGrids | None]:
        """Each media type's grids (videos split into frames for per-frame families) and scales,
        from the values of the family's image, video and seconds keys."""
        family = self.family
        image_key, video_key, _ = family.keys
        images = read_grid(image_key, images)
        videos = read_grid(video_key, videos) if video_key is not None else None
        scale = None
        if videos is not None and family.temporal is not None:
            _, host_seconds = family.seconds_per_grid(seconds, videos.shape[0])
            scale = family.temporal_scale(host_seconds)
        if videos is not None and self.family.per_frame_video:
            videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
            videos[:, 0] = 1
        return {1: MediaGrids(images) if images is not None else None,
                2: MediaGrids(videos, scale) if videos is not None else None}

    def _read(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None,
              **inputs: Any) -> tuple[torch.Tensor, dict[int, MediaGrids | None]]:
        # sizes bounded by the batch before anything is sized from them, for kernels called directly
        tokens = input_ids.numel()
        image_key, video_key, seconds_key = self.family.keys
        videos = None if video_key is None else read_grid(video_key, inputs.get(video_key), tokens=tokens)
        media = self.media(read_grid(image_key, inputs.get(image_key), tokens=tokens), videos,
                           None if seconds_key is None else inputs.get(seconds_key))
        return self.token_types(input_ids, cu_seqlens), media


def _bool(mask: torch.Tensor | None) -> torch.Tensor | None:
    return mask if mask is None or mask.dtype == torch.bool else mask.bool()
