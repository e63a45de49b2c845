"""What a family of placeholder runs tells the batched kernel: its placeholders, the keys of its
media and their grids, and how its videos are timed."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ..media import read_seconds
from ..temporal import TemporalRule
from ._media import BetweenMarkersTypes, MediaKind, TokenTypeMap


def temporal_scale(rule: TemporalRule, seconds: Any) -> Any:
    """The videos' temporal scales under ``rule`` for their seconds (a tensor, or a numpy array
    of the tensor's dtype), in the dtype the kernel multiplies int64 frame numbers in: ``(videos,)``
    for ``scale_first``, ``(videos, 2)`` (the seconds, then ``per_second``) for ``frame_first``."""
    host = isinstance(seconds, np.ndarray)
    per_second: Any = rule.per_second
    if rule.whole_seconds:
        seconds = seconds.astype(np.int64) if host else seconds.long()
    if rule.precision != "seconds":
        fixed: Any = np.float32 if rule.precision == "float32" else np.float64
        seconds = seconds.astype(fixed) if host else seconds.to(getattr(torch, rule.precision))
        per_second = fixed(per_second) if host else float(per_second)
    if rule.order == "scale_first":
        return per_second * seconds
    # each frame number times the seconds, then per_second, in the dtype torch forms
    # ``int64 frames * seconds * per_second`` in (the seconds' if floating, else int64, or float32
    # for a fractional per_second)
    integral = not (seconds.dtype.kind == "f" if host else seconds.is_floating_point())
    whole = isinstance(rule.per_second, int)
    dtype: Any
    if host:
        dtype = (np.int64 if whole else np.float32) if integral else seconds.dtype
        return np.stack((seconds.astype(dtype), np.full(seconds.shape, per_second, dtype=dtype)), axis=1)
    dtype = (torch.int64 if whole else torch.float32) if integral else seconds.dtype
    return torch.stack((seconds.to(dtype), torch.full(seconds.shape, per_second, dtype=dtype, device=seconds.device)),
                       dim=1)


@dataclasses.dataclass(frozen=True)
class MropeFamily:
    """A family whose positions follow runs of placeholders: runs of placeholder tokens take the
    media grids in order across the batch, each placed on its ``(t, h, w)`` grid (after merging)
    from the current position; text counts on, and after a run resumes ``max(h, w)`` past its
    start. Its plugin gives it as data, the keys of its media included.

    Attributes:
        name: shown in listings and errors.
        spatial_merge_size: patches merged per side (the vision config's ``spatial_merge_size``).
        image_token_id: the image placeholder's id.
        video_token_id: the video placeholder's id, or None for a family without videos.
        image_token, video_token: the placeholders' texts, for error messages.
        temporal: set for families that time their videos: how a video's frame gets its temporal
            id from the video's seconds (see :class:`~mmrope_core.temporal.TemporalRule`).
        per_frame_video: each video frame is its own placeholder run (the processor writes a
            timestamp between frames), each taking a ``(1, h, w)`` grid.
        video_markers: ``(begin, end)`` token ids for families whose video frames reuse the
            image token between begin- and end-of-video markers.
        resume_past_frames: the text after a run resumes past its last frame's temporal id too,
            where that is further than ``max(h, w)`` (some rollout engines' rule; transformers
            resumes at ``max(h, w)`` past the run's start).
        image_key: the input key holding the images' ``(N, 3)`` grids (keyword only).
        video_key: the key holding the videos' grids, for a family with videos.
        seconds_key: the key holding each video's seconds per grid, for a timed family.
    """

    name: str
    spatial_merge_size: int
    image_token_id: int
    video_token_id: int | None = None
    image_token: str = "image placeholder"
    video_token: str = "video placeholder"
    temporal: TemporalRule | None = None
    per_frame_video: bool = False
    video_markers: tuple[int, int] | None = None
    resume_past_frames: bool = False
    image_key: str = dataclasses.field(kw_only=True)
    video_key: str | None = dataclasses.field(default=None, kw_only=True)
    seconds_key: str | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TypeError("MropeFamily.name must be a non-empty string")
        if not isinstance(self.spatial_merge_size, int) or self.spatial_merge_size < 1:
            raise TypeError(f"MropeFamily.spatial_merge_size must be a positive int, got {self.spatial_merge_size!r}")
        if self.temporal is not None and not (isinstance(self.temporal, TemporalRule) and self.temporal.truncate):
            raise TypeError(f"MropeFamily.temporal must be a truncating TemporalRule or None, got {self.temporal!r}")
        if self.video_markers is not None and len(self.video_markers) != 2:
            raise TypeError("MropeFamily.video_markers must be a (begin, end) pair of token ids")
        ids = [self.image_token_id, self.video_token_id, *(self.video_markers or ())]
        if any(token is not None and (not isinstance(token, int) or token < 0) for token in ids):
            raise TypeError(f"MropeFamily token ids must be non-negative ints, got {ids}")
        for field, needed in {"image_key": True, "video_key": self.has_video, "seconds_key": self.timed}.items():
            key = getattr(self, field)
            if (needed or key is not None) and not (isinstance(key, str) and key):
                raise TypeError(f"MropeFamily {self.name!r} needs {field}, the input key of its media, got {key!r}")

    @property
    def timed(self) -> bool:
        """Its videos' temporal ids are scaled by their seconds."""
        return self.has_video and self.temporal is not None

    @property
    def keys(self) -> tuple[str, str | None, str | None]:
        """The keys it reads: its images', its videos' and its videos' seconds', None for media it
        does not have (a key declared for those is not read)."""
        return self.image_key, self.video_key if self.has_video else None, self.seconds_key if self.timed else None

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The keys of the media it reads."""
        return tuple(key for key in self.keys if key is not None)

    @property
    def has_video(self) -> bool:
        return self.video_token_id is not None or self.video_markers is not None

    @property
    def kinds(self) -> tuple[MediaKind, ...]:
        image = MediaKind(1, "image", self.image_token, self.image_key)
        if not self.has_video:
            return (image,)
        assert self.video_key is not None  # (checked when built)
        return image, MediaKind(2, "video frame" if self.per_frame_video else "video", self.video_token, self.video_key)

    def token_types(self) -> TokenTypeMap | BetweenMarkersTypes:
        """How ``mm_token_type_ids`` (0 text, 1 image, 2 video) are built from ``input_ids``, as
        the family's processor builds them."""
        if self.video_markers is not None:
            return BetweenMarkersTypes(self.image_token_id, *self.video_markers)
        types = {self.image_token_id: 1}
        if self.video_token_id is not None:
            types[self.video_token_id] = 2
        return TokenTypeMap(types)

    def temporal_scale(self, seconds: Any) -> Any:
        """The videos' temporal scales for their seconds (a tensor or numpy array)."""
        assert self.temporal is not None  # (only timed families scale)
        return temporal_scale(self.temporal, seconds)

    def seconds_per_grid(self, value: Any, videos: int) -> tuple[torch.Tensor, np.ndarray | torch.Tensor]:
        """The value of :attr:`seconds_key` as a checked ``(videos,)`` tensor (a list becomes
        float32, as processors return it; None, one second each), and the same on the CPU: a
        numpy view where numpy holds its dtype, else a tensor."""
        assert self.seconds_key is not None and self.video_key is not None  # (only timed families scale)
        return _seconds_per_grid(self.seconds_key, value, videos, self.video_key)


def _seconds_per_grid(key: str, value: Any, videos: int, grid: str) -> tuple[torch.Tensor, np.ndarray | torch.Tensor]:
    if value is None:
        seconds = torch.ones(videos, dtype=torch.int64)
        return seconds, seconds.numpy()
    checked = read_seconds(key, value, videos=videos, grid=grid)
    assert checked is not None  # (value is not None)
    host = checked.detach().cpu()
    return checked, host.numpy() if host.dtype in _NUMPY_DTYPES else host


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)
