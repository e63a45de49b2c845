"""Reading an Omni sequence item by item: where each audio, image, video and audio-in-video item
sits, checked against the grids and audio lengths. The reference implementation's input check,
and what says why when the batched kernel refuses a batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from mmrope_core import PlaceholderMismatchError
from mmrope_core.errors import a, counted


@dataclasses.dataclass(frozen=True)
class Tokens:
    """Token ids of the Omni markers and placeholders."""

    image: int
    video: int
    audio: int
    vision_start: int
    vision_end: int
    audio_start: int
    audio_end: int


def tokens_of(config: Any, processor_tokens: Mapping[str, int]) -> Tokens:
    """The thinker config's token ids, with the end markers the processor's tokenizer gives."""
    return Tokens(
        image=config.image_token_id,
        video=config.video_token_id,
        audio=config.audio_token_id,
        vision_start=config.vision_start_token_id,
        vision_end=processor_tokens["vision_end"],
        audio_start=config.audio_start_token_id,
        audio_end=processor_tokens["audio_end"],
    )


@dataclasses.dataclass(frozen=True)
class Item:
    """One media item of a sample.

    Attributes:
        kind: ``"image"``, ``"video"``, ``"audio"`` or ``"audio_in_video"``.
        start: index of its first start marker among the sample's valid tokens.
        index: its position among the batch's items of its grid kind (image, video) or audio.
        audio_index: for audio-in-video, the position of its audio among the batch's audios.
        media_tokens: placeholder tokens between the markers.
        markers: start plus end marker tokens (2, or 4 for audio-in-video).
    """

    kind: str
    start: int
    index: int
    audio_index: int
    media_tokens: int
    markers: int

    @property
    def length(self) -> int:
        return self.media_tokens + self.markers


@dataclasses.dataclass
class Counters:
    image: int = 0
    video: int = 0
    audio: int = 0


def read_items(sample: int, tokens: np.ndarray, ids: Tokens, counters: Counters, **media) -> list[Item]:
    """The media items of one sample's valid tokens, in order (see :func:`iter_items`)."""
    return list(iter_items(sample, tokens, ids, counters, **media))


def iter_items(
    sample: int,
    tokens: np.ndarray,
    ids: Tokens,
    counters: Counters,
    *,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    audio_lengths: torch.Tensor | None,
    merge: int,
    use_audio_in_video: bool,
    video_token_first: bool = False,
) -> Iterator[Item]:
    """The media items of one sample's valid tokens (on the host: numpy compares several times
    faster than torch here), in order; raises a typed error naming the sample when markers,
    placeholders, grids and audio lengths disagree. A start marker that opens no item (a
    ``<|vision_start|>`` or ``<|audio_start|>`` sampled in a response, followed by text or
    ending the sequence) is text, as the model reads it. ``video_token_first``: a video with its
    audio must begin with a video token (Qwen2.5-Omni finds it by its first one)."""
    vision_starts = np.flatnonzero(tokens == ids.vision_start).tolist()
    audio_starts = np.flatnonzero(tokens == ids.audio_start).tolist()
    in_video = {start + 1 for start in vision_starts}
    starts = sorted([(p, "vision") for p in vision_starts] + [(p, "audio") for p in audio_starts if p not in in_video])
    expected = 0
    length = tokens.size
    for position, marker in starts:
        following = int(tokens[position + 1]) if position + 1 < length else None
        if marker == "audio":
            if following != ids.audio:
                continue  # opens nothing: text
            audio = _take(counters, "audio", audio_lengths, sample, "audio", "feature_attention_mask (audio_seqlens)")
            assert audio_lengths is not None  # _take raises without them
            n = int(audio_lengths[audio])
            _expect_run(sample, tokens, position + 1, n, {ids.audio}, "audio", audio, ids.audio_end)
            item = Item("audio", position, audio, audio, n, 2)
        elif following == ids.image:
            image = _take(counters, "image", image_grid_thw, sample, "image", "image_grid_thw")
            assert image_grid_thw is not None
            n = int(image_grid_thw[image].prod()) // merge**2
            _expect_run(sample, tokens, position + 1, n, {ids.image}, "image", image, ids.vision_end)
            item = Item("image", position, image, -1, n, 2)
        elif following == ids.video:
            if use_audio_in_video:
                raise PlaceholderMismatchError(
                    f"sample {sample}: a video at token {position} has no audio start marker after its vision "
                    f"start, but use_audio_in_video is set; pass use_audio_in_video=False for silent videos "
                    f"or the processor output made with load_audio_from_video"
                )
            video = _take(counters, "video", video_grid_thw, sample, "video", "video_grid_thw")
            assert video_grid_thw is not None
            n = int(video_grid_thw[video].prod()) // merge**2
            _expect_run(sample, tokens, position + 1, n, {ids.video}, "video", video, ids.vision_end)
            item = Item("video", position, video, -1, n, 2)
        elif following == ids.audio_start:
            if not use_audio_in_video:
                raise PlaceholderMismatchError(
                    f"sample {sample}: an audio start marker follows the vision start at token {position} "
                    f"(audio in video), but use_audio_in_video is not set; pass "
                    f"mm_processor_kwargs={{'use_audio_in_video': True}}"
                )
            item = _audio_in_video(sample, tokens, ids, counters, position, video_grid_thw, audio_lengths, merge,
                                   video_token_first)
        else:
            continue  # a vision start opening nothing: text
        expected += item.media_tokens
        yield item
    placeholders = int(((tokens == ids.image) | (tokens == ids.video) | (tokens == ids.audio)).sum())
    if placeholders != expected:
        raise PlaceholderMismatchError(
            f"sample {sample}: {counted(placeholders - expected, 'image, video or audio placeholder token')} "
            f"{'stands' if placeholders - expected == 1 else 'stand'} outside "
            f"any start/end markers (a missing start marker, or placeholders sampled in a response); "
            f"mask them out or restore the markers"
        )


def _audio_in_video(sample, tokens, ids, counters, position, video_grid_thw, audio_lengths, merge,
                    video_token_first) -> Item:
    video = _take(counters, "video", video_grid_thw, sample, "video", "video_grid_thw")
    audio = _take(counters, "audio", audio_lengths, sample, "audio of a video", "feature_attention_mask (audio_seqlens)")
    video_tokens = int(video_grid_thw[video].prod()) // merge**2
    audio_tokens = int(audio_lengths[audio])
    if audio_tokens < 1:
        raise PlaceholderMismatchError(
            f"sample {sample}, video {video}: its audio (audio {audio} of the batch) is too short to make an "
            f"audio token; pass the processor's feature_attention_mask, or the video without its audio"
        )
    _expect_run(sample, tokens, position + 2, video_tokens + audio_tokens, {ids.video, ids.audio},
                "video with its audio", video, ids.audio_end)
    run = tokens[position + 2 : position + 2 + video_tokens + audio_tokens]
    found_audio = int((run == ids.audio).sum())
    if found_audio != audio_tokens:
        raise PlaceholderMismatchError(
            f"sample {sample}, video {video}: its audio needs {counted(audio_tokens, 'audio token')} (from "
            f"feature_attention_mask), found {found_audio} among the video's placeholders"
        )
    end = position + 3 + video_tokens + audio_tokens
    if end >= tokens.size or int(tokens[end]) != ids.vision_end:
        raise PlaceholderMismatchError(
            f"sample {sample}, video {video}: the vision end marker is missing after its audio; "
            f"the sequence was probably truncated inside the video"
        )
    if video_token_first and int(run[0]) != ids.video:
        raise PlaceholderMismatchError(
            f"sample {sample}, video {video}: its placeholders begin with an audio token, but Qwen2.5-Omni "
            f"finds a video with its audio by its first video token; pass the processor's output unchanged"
        )
    return Item("audio_in_video", position, video, audio, video_tokens + audio_tokens, 4)


def check_all_used(counters: Counters, image_grid_thw, video_grid_thw, audio_lengths) -> None:
    for name, used, given, key in (
        ("image", counters.image, image_grid_thw, "image_grid_thw"),
        ("video", counters.video, video_grid_thw, "video_grid_thw"),
        ("audio", counters.audio, audio_lengths, "audio_seqlens (feature_attention_mask)"),
    ):
        available = 0 if given is None else given.shape[0]
        if available != used:
            raise PlaceholderMismatchError(
                f"{key} describes {counted(available, name)} but the batch holds {used}; the sequence was "
                f"probably truncated before {a(name)}, drop the inputs of removed {name}s"
            )


def _take(counters: Counters, field: str, given, sample: int, name: str, key: str) -> int:
    index = getattr(counters, field)
    available = 0 if given is None else given.shape[0]
    if index >= available:
        raise PlaceholderMismatchError(
            f"sample {sample}: {name} {index} of the batch has no entry in {key} ({available} given); "
            f"pass the inputs of every sample's {name}s"
        )
    setattr(counters, field, index + 1)
    return index


def _expect_run(sample, tokens, begin, n, allowed, name, index, end_marker) -> None:
    run = tokens[begin : begin + n]
    found = sum(int((run == token).sum()) for token in allowed)
    if run.size < n or found != n:
        raise PlaceholderMismatchError(
            f"sample {sample}, {name} {index}: needs {counted(n, 'placeholder token')}, found {found}. "
            f"The sequence was probably truncated inside it; truncate before the item or drop it"
        )
    if begin + n >= tokens.size or int(tokens[begin + n]) != end_marker:
        raise PlaceholderMismatchError(
            f"sample {sample}, {name} {index}: {counted(n, 'placeholder token')} {'is' if n == 1 else 'are'} followed by token "
            f"{int(tokens[begin + n]) if begin + n < tokens.size else 'end of sequence'} instead of the "
            f"end marker; the placeholder count does not match its grid or audio length"
        )

