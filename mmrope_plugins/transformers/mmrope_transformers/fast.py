"""Which batched kernel, if any, reproduces a model class's ``get_rope_index``: decided by
probing, not by name.

From the processor and the config come candidate descriptions of the layouts the core's
batched kernel knows (Qwen2-VL runs, Qwen3-VL frames, GLM-4V video markers, timed videos,
videos merged in time, rows ending with a newline placeholder); the first whose kernel equals
the reference on probe batches is bound.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from mmrope_core.media import read_grid
from mmrope_core.mrope import (
    MediaGrids,
    MediaKind,
    MropeFamily,
    MropeKernel,
    TemporalRule,
    check_placeholders,
    mrope_position_ids,
    mrope_positions,
    probe_batches,
)
from mmrope_core.reference import kernels_agree, probe_once

from .reference import media_token_ids

#: The keys of the images' and videos' grids and of the videos' seconds, as the model classes'
#: ``get_rope_index`` name them.
IMAGE_KEY, VIDEO_KEY, SECONDS_KEY = "image_grid_thw", "video_grid_thw", "second_per_grid_ts"

#: The ways timed videos' temporal ids have been formed, tried in this order: in the seconds'
#: dtype, with the seconds truncated first, in float64, and frame number times seconds first.
TEMPORAL_RULES = (
    TemporalRule(precision="seconds"),
    TemporalRule(precision="seconds", whole_seconds=True),
    TemporalRule(precision="float64"),
    TemporalRule(order="frame_first", precision="seconds"),
)


class TemporalMergeKernel(MropeKernel):
    """The batched kernel of a family whose videos are merged in time before placement
    (ERNIE-4.5-VL): a video of ``t`` frames is one run of ``t // temporal_merge_size`` merged
    frames, placed as the family's kernel places a video of that many frames."""

    def __init__(self, family: MropeFamily, temporal_merge_size: int) -> None:
        super().__init__(family)
        self.temporal_merge_size = temporal_merge_size

    def __repr__(self) -> str:
        return f"TemporalMergeKernel({self.family.name}, {self.temporal_merge_size} frames merged)"

    def grids(self, images: Any, videos: Any) -> tuple[Any, Any]:
        if isinstance(videos, torch.Tensor) and videos.dim() == 2 and videos.shape[1] == 3:
            videos = videos.clone()
            videos[:, 0] = torch.div(videos[:, 0], self.temporal_merge_size, rounding_mode="floor")
        return images, videos


class NewlineColumnKernel(MropeKernel):
    """The batched kernel of a family whose rows of merged patches each end with a newline
    placeholder and whose video is one run of frames laid out as blocks (HY-V4-VL): a frame of
    ``h' x w'`` merged patches is ``h' x (w' + 1)`` tokens placed as an image of that size, and
    the next frame (or text) starts ``max(h', w' + 1)`` later, where Qwen-style text resumes
    after such an image. So each frame is placed as an image one column wider: video runs are
    cut into frames by typing every other frame 3, and each kind takes its frames' grids."""

    def __init__(self, family: MropeFamily) -> None:
        super().__init__(family)
        if family.video_token_id is not None:
            image, video = family.kinds
            self.kinds = (image, video, MediaKind(3, video.name, video.token, video.grid_key))

    def __repr__(self) -> str:
        return f"NewlineColumnKernel({self.family.name})"

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        mask = _bool(attention_mask)
        types, media = self._frames(input_ids, mask, cu_seqlens, **inputs)
        return mrope_positions(types, mask, self.kinds, media, cu_seqlens=cu_seqlens,
                               spatial_merge_size=self.family.spatial_merge_size, out_dtype=input_ids.dtype)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> torch.Tensor:
        mask = _bool(attention_mask)
        types, media = self._frames(input_ids, mask, cu_seqlens, **inputs)
        return mrope_position_ids(types, mask, self.kinds, media, cu_seqlens=cu_seqlens,
                                  spatial_merge_size=self.family.spatial_merge_size)

    def check(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              **inputs: Any) -> dict[str, Any]:
        mask = _bool(attention_mask)
        types, media = self._frames(input_ids, mask, None, **inputs)
        check_placeholders(types, mask, self.kinds, media, spatial_merge_size=self.family.spatial_merge_size)
        return inputs

    def _frames(self, input_ids: torch.Tensor, mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                **inputs: Any) -> tuple[torch.Tensor, dict[int, MediaGrids | None]]:
        merge, (image_key, video_key, _) = self.family.spatial_merge_size, self.family.keys
        types = self.token_types(input_ids, cu_seqlens)
        images = read_grid(image_key, _wider(inputs.get(image_key), merge))
        media: dict[int, MediaGrids | None] = {1: None if images is None else MediaGrids(images), 2: None, 3: None}
        grids = read_grid(video_key, inputs.get(video_key)) if video_key is not None else None
        if grids is None or grids.shape[0] == 0:
            return types, media
        frames = _wider(torch.repeat_interleave(grids, grids[:, 0], dim=0), merge)
        frames[:, 0] = 1
        odd = torch.cat([torch.arange(int(count)) % 2 == 1 for count in grids[:, 0].tolist()])
        media[2] = MediaGrids(frames[~odd])
        media[3] = MediaGrids(frames[odd]) if bool(odd.any()) else None
        return _every_other_frame(types, grids, merge, mask, cu_seqlens), media


def _bool(mask: torch.Tensor | None) -> torch.Tensor | None:
    return mask if mask is None or mask.dtype == torch.bool else mask.bool()


def _wider(grids: Any, merge: int) -> Any:
    """Grids one merged column wider: the newline placeholder ending each row."""
    if not isinstance(grids, torch.Tensor) or grids.dim() != 2 or grids.shape[1] != 3:
        return grids
    wider = grids.clone()
    wider[:, 2] += merge
    return wider


def _every_other_frame(types: torch.Tensor, grids: torch.Tensor, merge: int, mask: torch.Tensor | None,
                       cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """``types`` with the odd frames of each video run typed 3, over valid tokens only. Left as
    they are where the runs do not fit the grids: the kernel then says where they do not."""
    flat = types.cpu().numpy().reshape(-1)
    where = np.arange(flat.size) if mask is None else np.flatnonzero(mask.cpu().numpy().reshape(-1))
    is_video = flat[where] == 2
    fresh = np.ones(where.size, dtype=bool)  # where a run may begin: after a non-video token or a row's end
    fresh[1:] = (where[1:] // types.shape[1] != where[:-1] // types.shape[1]) | ~is_video[:-1]
    if cu_seqlens is not None:  # nor does a run go on across a segment boundary
        fresh[np.isin(where, cu_seqlens.cpu().numpy()[1:-1])] = True
    run = np.cumsum(is_video & fresh)[is_video] - 1
    lengths = np.bincount(run, minlength=0) if run.size else run
    frame_tokens = (grids[:, 1] // merge * (grids[:, 2] // merge + 1)).numpy()
    if lengths.size != grids.shape[0] or not np.array_equal(lengths, frame_tokens * grids[:, 0].numpy()):
        return types
    within = np.arange(run.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    odd = within // frame_tokens[run] % 2 == 1
    out = flat.copy()
    out[where[np.flatnonzero(is_video)[odd]]] = 3
    return torch.from_numpy(out.reshape(types.shape)).to(types.device)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout to try: a family description, and the frames merged in time (1: none)."""

    layout: str
    family: MropeFamily
    temporal_merge_size: int = 1
    newline_column: bool = False

    def kernel(self, temporal: TemporalRule | None = None) -> MropeKernel:
        family = self.family if temporal is None else dataclasses.replace(self.family, temporal=temporal)
        if self.newline_column:
            return NewlineColumnKernel(family)
        if self.temporal_merge_size > 1:
            return TemporalMergeKernel(family, self.temporal_merge_size)
        return MropeKernel(family)

    def rules(self) -> list[TemporalRule | None]:
        """The temporal rules to try: for timed videos every rule of :data:`TEMPORAL_RULES` (they
        changed between releases), at the config's ``tokens_per_second``."""
        timed = self.family.temporal
        if timed is None:
            return [None]
        return [dataclasses.replace(rule, per_second=timed.per_second) for rule in TEMPORAL_RULES]

    def batches(self) -> Iterator[dict[str, Any]]:
        """Probe batches laid out for this candidate; merged videos get ``t * merge`` frames (and
        one more, which the merge drops)."""
        merge = self.family.spatial_merge_size
        for index, batch in enumerate(probe_batches(self.family)):
            if self.newline_column:  # the probe's runs (6 image tokens, 3 frames of 4) with a newline column
                batch[IMAGE_KEY] = torch.tensor([[1, 2 * merge, 2 * merge]] * 2)
                if VIDEO_KEY in batch:
                    batch[VIDEO_KEY] = torch.tensor([[3, 2 * merge, merge]] * 2)
            if self.temporal_merge_size > 1 and VIDEO_KEY in batch:
                grids = batch[VIDEO_KEY].clone()
                grids[:, 0] = grids[:, 0] * self.temporal_merge_size + index % 2
                batch[VIDEO_KEY] = grids
            yield batch


def candidates(name: str, processor: Any, config: Any) -> tuple[list[Candidate], str]:
    """The layouts the batched kernel could take for this processor and config, most common
    first, or none and why: the kernel places one image and at most one video placeholder id,
    merged ``vision_config.spatial_merge_size`` patches per side."""
    images, videos, audios = media_token_ids(processor)
    vision = getattr(config, "vision_config", None)
    merge = getattr(vision, "spatial_merge_size", None)
    if len(images) != 1 or len(videos) > 1 or audios:
        return [], "its processor's placeholder ids are not one image and at most one video id"
    if not isinstance(merge, int) or merge < 1:
        return [], "its config has no vision_config.spatial_merge_size"
    image, video = images[0], (videos[0] if videos else None)
    seconds = getattr(vision, "tokens_per_second", None)
    seconds = seconds if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None
    if seconds is not None and not 0 < seconds < math.inf:
        seconds = None  # no rule times videos by it
    timed = TemporalRule(seconds, precision="seconds") if seconds else None
    base = MropeFamily(name, spatial_merge_size=merge, image_token_id=image, video_token_id=video,
                       image_token=str(getattr(processor, "image_token", "image placeholder")),
                       video_token=str(getattr(processor, "video_token", None) or "video placeholder"),
                       image_key=IMAGE_KEY, video_key=None if video is None else VIDEO_KEY)
    out = [Candidate("Qwen2-VL runs", base if timed is None or video is None else
                     dataclasses.replace(base, temporal=timed, seconds_key=SECONDS_KEY))]
    if video is not None:
        out.append(Candidate("Qwen3-VL frames", dataclasses.replace(base, per_frame_video=True)))
    markers = getattr(processor, "video_start_id", None), getattr(processor, "video_end_id", None)
    if all(isinstance(marker, int) for marker in markers):
        out.append(Candidate("GLM-4V video markers", dataclasses.replace(
            base, video_token_id=None, per_frame_video=True, video_markers=markers,  # type: ignore[arg-type]
            video_key=VIDEO_KEY)))
    merged = getattr(vision, "temporal_merge_size", None)
    if video is not None and isinstance(merged, int) and merged > 1:
        out.append(Candidate(f"videos merged {merged} frames to one", base, merged))
    out.append(Candidate("rows ending with a newline placeholder, frames as blocks", base, newline_column=True))
    return out, ""


def probed_kernel(key: Any, options: Sequence[Candidate], reference: Any, token_types_agree: Any,
                  *, what: str, why_none: str = "") -> tuple[Candidate, MropeKernel] | None:
    """The first candidate whose kernel equals ``reference`` on its probe batches (and whose token
    types equal the processor's, ``token_types_agree(family)``), worked out once per process per
    ``key``; None, with one warning, when none does (``why_none`` says why there are none)."""

    def probe() -> str:
        for index, candidate in enumerate(options):
            if not token_types_agree(candidate.family):
                continue
            batches = list(candidate.batches())
            for number, rule in enumerate(candidate.rules()):
                if kernels_agree(candidate.kernel(rule), reference, batches):
                    return f"{index}:{number}"
        if options:
            why = (f"follows none of the batched kernel's layouts on probe inputs (tried: "
                   f"{', '.join(candidate.layout for candidate in options)})")
        else:
            why = f"fits no layout of the batched kernel: {why_none}"
        warnings.warn(f"mmrope-transformers: {what} {why}, so its transformers reference computes the positions "
                      f"(same results, slower)", RuntimeWarning, stacklevel=2)
        return ""

    answer = probe_once(key, probe, fast=f"the batched kernel of {what}")
    if not answer:
        return None
    index, number = answer.split(":")
    candidate = options[int(index)]
    return candidate, candidate.kernel(candidate.rules()[int(number)])
