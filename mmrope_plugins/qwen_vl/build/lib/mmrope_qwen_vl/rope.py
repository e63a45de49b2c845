"""The two implementations, ``fast`` and ``reference``, and the check that they agree."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from mmrope_core import InvalidInputError, RopeBinding
from mmrope_core.mrope import (
    MediaGrids,
    MediaKind,
    TokenTypeMap,
    check_placeholders,
    mrope_position_ids,
    mrope_positions,
)
from mmrope_core.reference import config_only_model, probe_once

from .families import Family

IMPLEMENTATIONS = ("fast", "reference")

#: How the installed transformers turns ``tokens_per_second * second_per_grid_ts`` into temporal ids.
#: ``scaled``: ``trunc(frame * tps * seconds)`` (transformers >= 5.11);
#: ``whole_seconds``: ``frame * tps * trunc(seconds)`` (transformers 5.10).
#: ``seconds`` is a tensor, or a numpy array of the tensor's dtype (which multiplies alike).
TEMPORAL_RULES: dict[str, Callable[[Any, Any], Any]] = {
    "scaled": lambda tps, seconds: tps * seconds,
    "whole_seconds": lambda tps, seconds: tps * (seconds.astype(np.int64) if isinstance(seconds, np.ndarray)
                                                 else seconds.long()),
}


def bind(family: Family, processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    impl = options.get("impl", "fast")
    if impl not in IMPLEMENTATIONS:
        raise InvalidInputError(f"impl={impl!r} is not an implementation of {family.name}; use one of {IMPLEMENTATIONS}")
    config = _resolve_config(family, processor, config)
    token_types = token_types_for(family, processor)
    tokens = (processor.image_token, processor.video_token)
    reference = ReferenceRopeIndex(family, config, tokens)
    if impl == "reference":
        return RopeBinding("mrope", reference, token_types, "reference", description=f"{family.name}, transformers reference")
    rule = agreeing_rule(family, config, reference)
    if rule is None:
        return RopeBinding(
            "mrope", reference, token_types, "reference",
            description=f"{family.name}, transformers reference (the fast kernel disagrees with this transformers)",
        )
    fast = FastRopeIndex(family, config, rule, tokens)
    # GLM's token types count video markers along the row: a packed row's are counted per segment
    packed_token_types = token_types.packed if family.video_inside_markers else None
    return RopeBinding("mrope", fast, token_types, "fast", description=f"{family.name}, batched kernel ({rule} temporal rule)",
                       position_ids=fast.position_ids, packed_rope_index=fast.packed,
                       packed_position_ids=fast.packed_position_ids, packed_token_types=packed_token_types)


def _resolve_config(family: Family, processor: Any, config: Any) -> Any:
    if config is None:
        from transformers import AutoConfig

        # The family's default config, with the merge size the processor really uses.
        config = AutoConfig.for_model(family.default_model_type)
        merge = getattr(getattr(processor, "image_processor", None), "merge_size", None)
        if merge is not None:
            config.vision_config.spatial_merge_size = merge
        return config
    model_type = getattr(config, "model_type", None)
    if model_type not in family.models:
        raise InvalidInputError(
            f"{type(processor).__name__} belongs to {family.name}, whose configs have model_type "
            f"{sorted(family.models)}, but the config given has model_type {model_type!r}. "
            f"Pass the model's top-level config (AutoConfig.from_pretrained) or None"
        )
    return config


def token_types_for(family: Family, processor: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """How ``mm_token_type_ids`` (0 text, 1 image, 2 video) are built from ``input_ids``."""
    if family.video_inside_markers:
        return GlmTokenTypes(processor.image_token_id, processor.video_start_id, processor.video_end_id)
    return TokenTypeMap({processor.image_token_id: 1, processor.video_token_id: 2})


class GlmTokenTypes:
    """GLM videos reuse the image token between begin- and end-of-video markers: an image token
    is a video token where more begin markers than end markers precede it in its row (the
    processor's own rule). Returns int8, like :class:`~mmrope_core.mrope.TokenTypeMap`;
    :meth:`packed` counts the markers from each segment's first token."""

    def __init__(self, image: int, video_start: int, video_end: int) -> None:
        self.image, self.video_start, self.video_end = image, video_start, video_end

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self._types(input_ids)

    def packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        """The types of one packed ``(1, T)`` row, each segment typed as the sample alone: a
        begin marker a segment leaves open does not turn the next segment's images into video."""
        return self._types(input_ids, cu_seqlens)

    def _types(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.device.type == "cpu":  # numpy compares several times faster than torch here
            ids = input_ids.numpy()
            image, opened = ids == self.image, ids == self.video_start
            if not opened.any():  # no video: every image token is an image
                return torch.from_numpy(image.view(np.int8))
            markers = opened.view(np.int8) - (ids == self.video_end).view(np.int8)
            image, markers = torch.from_numpy(image), torch.from_numpy(markers)
        else:
            image = input_ids == self.image
            markers = (input_ids == self.video_start).to(torch.int8) - (input_ids == self.video_end).to(torch.int8)
        open_videos = markers.cumsum(dim=1)  # one cumsum of the difference, not one per marker
        if cu_seqlens is not None:
            open_videos = _from_each_segment_start(open_videos, cu_seqlens)
        return image.view(torch.int8) + (image & (open_videos > 0)).view(torch.int8)


def _from_each_segment_start(counts: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """A packed row's running ``counts`` as each segment alone counts them: less the count the
    segments before it reached."""
    bounds = cu_seqlens.to(device=counts.device, dtype=torch.int64)
    reached = counts[0, bounds[1:-1] - 1]
    if not bool(reached.any()):  # every segment closes what it opens (a row of whole samples)
        return counts
    before = torch.cat((reached.new_zeros(1), reached))
    return counts - torch.repeat_interleave(before, bounds.diff()).unsqueeze(0)


def _kinds(family: Family, tokens: tuple[str, str]) -> tuple[MediaKind, MediaKind]:
    return (
        MediaKind(1, "image", tokens[0], "image_grid_thw"),
        MediaKind(2, "video frame" if family.per_frame_video else "video", tokens[1], "video_grid_thw"),
    )


_TOKENS = ("image placeholder", "video placeholder")


class _Implementation:
    def __init__(self, family: Family, config: Any, tokens: tuple[str, str] = _TOKENS) -> None:
        self.family = family
        self.kinds = _kinds(family, tokens)
        vision = config.vision_config
        self.merge = int(vision.spatial_merge_size)
        self.tokens_per_second = getattr(vision, "tokens_per_second", None) if family.timed_video else None

    def media(self, image_grid_thw: Any, video_grid_thw: Any, second_per_grid_ts: Any, rule: str) -> dict[int, MediaGrids]:
        images = _grid("image_grid_thw", image_grid_thw)
        videos = _grid("video_grid_thw", video_grid_thw)
        scale = None
        if videos is not None and self.family.timed_video:
            _, seconds = _seconds(second_per_grid_ts, videos.shape[0])
            scale = TEMPORAL_RULES[rule](self.tokens_per_second, seconds)
        if videos is not None and self.family.per_frame_video:
            videos = torch.repeat_interleave(videos, videos[:, 0], dim=0)
            videos[:, 0] = 1
        return {1: MediaGrids(images) if images is not None else None,
                2: MediaGrids(videos, scale) if videos is not None else None}


class FastRopeIndex(_Implementation):
    """The batched kernel. Same signature and results as the reference ``get_rope_index``;
    :meth:`position_ids` gives the engine's ``(B, 4, L)`` layout directly, :meth:`packed` and
    :meth:`packed_position_ids` the positions of a packed row where its segments lie."""

    def __init__(self, family: Family, config: Any, rule: str, tokens: tuple[str, str] = _TOKENS) -> None:
        super().__init__(family, config, tokens)
        self.rule = rule

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return mrope_positions(*self._kernel_arguments(attention_mask, **kwargs), spatial_merge_size=self.merge,
                               out_dtype=input_ids.dtype)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                     **kwargs: Any) -> torch.Tensor:
        return mrope_position_ids(*self._kernel_arguments(attention_mask, **kwargs), spatial_merge_size=self.merge)

    def packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               cu_seqlens: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return mrope_positions(*self._kernel_arguments(attention_mask, **kwargs), spatial_merge_size=self.merge,
                               out_dtype=input_ids.dtype, cu_seqlens=cu_seqlens)

    def packed_position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                            cu_seqlens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return mrope_position_ids(*self._kernel_arguments(attention_mask, **kwargs), spatial_merge_size=self.merge,
                                  cu_seqlens=cu_seqlens)

    def _kernel_arguments(self, attention_mask: torch.Tensor | None, *, mm_token_type_ids: torch.Tensor,
                          image_grid_thw: Any = None, video_grid_thw: Any = None, second_per_grid_ts: Any = None,
                          **ignored: Any) -> tuple[Any, ...]:
        media = self.media(image_grid_thw, video_grid_thw, second_per_grid_ts, self.rule)
        mask = attention_mask.bool() if attention_mask is not None else None
        return mm_token_type_ids, mask, self.kinds, media


class ReferenceRopeIndex(_Implementation):
    """The installed transformers model class's ``get_rope_index``, bound to the config alone.

    Inputs are checked first, so a mismatch raises a typed error instead of crashing inside.
    """

    def __init__(self, family: Family, config: Any, tokens: tuple[str, str] = _TOKENS) -> None:
        super().__init__(family, config, tokens)
        module, name = family.models[config.model_type]
        self.model = config_only_model(getattr(importlib.import_module(f"transformers.models.{module}"), name), config)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 mm_token_type_ids: torch.Tensor, image_grid_thw: Any = None, video_grid_thw: Any = None,
                 second_per_grid_ts: Any = None, **ignored: Any) -> tuple[torch.Tensor, torch.Tensor]:
        media = self.media(image_grid_thw, video_grid_thw, second_per_grid_ts, "scaled")
        mask = attention_mask.bool() if attention_mask is not None else None
        check_placeholders(mm_token_type_ids, mask, self.kinds, media, spatial_merge_size=self.merge)
        kwargs = {}
        if self.family.timed_video and video_grid_thw is not None:
            kwargs["second_per_grid_ts"], _ = _seconds(second_per_grid_ts, video_grid_thw.shape[0])
        return self.model.get_rope_index(
            input_ids=input_ids, mm_token_type_ids=mm_token_type_ids, image_grid_thw=image_grid_thw,
            video_grid_thw=video_grid_thw, attention_mask=mask, **kwargs,
        )


def _grid(key: str, value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise InvalidInputError(
            f"{key} must be a tensor of shape (N, 3), got {type(value).__name__}; "
            f"convert with torch.as_tensor({key}) or use the processor's output"
        )
    if value.dim() != 2 or value.shape[1] != 3 or value.dtype.is_floating_point:
        raise InvalidInputError(f"{key} must be an integer tensor of shape (N, 3), got {value.dtype} {tuple(value.shape)}")
    return value


def _seconds(value: Any, videos: int) -> tuple[torch.Tensor, np.ndarray | torch.Tensor]:
    """``second_per_grid_ts`` as a tensor (a list becomes float32, as the processor returns it),
    checked, and the same on the CPU (:func:`_host`)."""
    if value is None:
        seconds = torch.ones(videos, dtype=torch.int64)
        return seconds, seconds.numpy()
    seconds = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if seconds.dim() != 1:
        seconds = seconds.reshape(-1)
    if seconds.numel() != videos:
        raise InvalidInputError(
            f"second_per_grid_ts has {seconds.numel()} values for {videos} videos in video_grid_thw; "
            f"pass one value per video"
        )
    on_host = _host(seconds)
    # a handful: checked in numpy
    values = on_host if isinstance(on_host, np.ndarray) else on_host.to(torch.float64).numpy()
    if not values.size:
        return seconds, on_host
    low, high = values.min(), values.max()
    if not (low >= 0 and high < np.inf):  # NaN fails both
        what = "a negative" if low < 0 else "a non-finite"
        raise InvalidInputError(f"second_per_grid_ts holds {what} value: {seconds.tolist()}")
    return seconds, on_host


def _host(seconds: torch.Tensor) -> np.ndarray | torch.Tensor:
    """The seconds on the CPU: a numpy view where numpy holds their dtype, else a tensor."""
    seconds = seconds.detach().cpu()
    return seconds.numpy() if seconds.dtype in _NUMPY_DTYPES else seconds


_NUMPY_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32)


# -- does the fast kernel agree with the installed reference? -----------------------------------

def agreeing_rule(family: Family, config: Any, reference: ReferenceRopeIndex) -> str | None:
    """The temporal rule under which the fast kernel equals the reference on probe batches, or
    None (with one warning) when no rule does. Probed once per family and config facts."""
    key = ("qwen_vl", family.name, config.model_type, reference.merge, reference.tokens_per_second)
    return probe_once(key, lambda: _probe(family, config, reference), fast=f"mmrope-qwen-vl: the fast {family.name} kernel")


def _probe(family: Family, config: Any, reference: ReferenceRopeIndex) -> str | None:
    batches = list(probe_batches(family, reference.merge))
    expected = [reference(**batch) for batch in batches]
    rules = TEMPORAL_RULES if family.timed_video else {"scaled": TEMPORAL_RULES["scaled"]}
    for rule in rules:
        fast = FastRopeIndex(family, config, rule)
        if all(_equal(fast(**batch), want) for batch, want in zip(batches, expected)):
            return rule
    return None


def _equal(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))


def probe_batches(family: Family, merge: int):
    """Small batches covering text, images, videos with fractional seconds and both paddings."""
    image = (1, 2 * merge, 3 * merge)
    video = (3, 2 * merge, 2 * merge)
    frame_tokens = 4
    image_tokens = 6

    def sample(video_seconds: float) -> list[int]:
        types_ = [0] * 3 + [1] * image_tokens + [0] * 2
        if family.per_frame_video:
            for _ in range(video[0]):
                types_ += [0] * 2 + [2] * frame_tokens
        else:
            types_ += [2] * (frame_tokens * video[0])
        return types_ + [0] * 3

    for left in (False, True):
        rows = [sample(0.5), sample(1.3)[:-1]]
        length = max(map(len, rows))
        types_ = torch.zeros(2, length, dtype=torch.int32)
        mask = torch.zeros(2, length, dtype=torch.bool)
        for row, values in enumerate(rows):
            span = slice(length - len(values), length) if left else slice(0, len(values))
            types_[row, span] = torch.tensor(values, dtype=torch.int32)
            mask[row, span] = True
        yield {
            "input_ids": torch.zeros(2, length, dtype=torch.int64),
            "attention_mask": mask,
            "mm_token_type_ids": types_,
            "image_grid_thw": torch.tensor([image, image]),
            "video_grid_thw": torch.tensor([video, video]),
            "second_per_grid_ts": torch.tensor([0.5, 1.3]),
        }
