"""Qwen2.5-Omni's and Qwen3-Omni's layouts as data (:mod:`mmrope_core.items`), in transformers'
convention, vLLM 0.33's and SGLang 0.5.23's: what their ``get_rope_index`` does with markers,
placeholders, grids and audio, composed of the core's primitives."""

from __future__ import annotations

from typing import Literal

import torch

from mmrope_core.items import GridMedia, ItemKind, ItemLayout, SequenceMedia, TemporalRule

from .families import Family
from .layout import Tokens

#: The kinds' names, as the layouts and :meth:`ItemLayout.enabled` take them.
IMAGE, AUDIO, VIDEO, VIDEO_WITH_AUDIO = "image", "audio", "video", "video with its audio"
SILENT_VIDEOS, VIDEOS_WITH_AUDIO = (IMAGE, AUDIO, VIDEO), (IMAGE, AUDIO, VIDEO_WITH_AUDIO)


def omni_layout(family: Family, tokens: Tokens, merge: int, audio: SequenceMedia, per_second: float, chunk: int,
                vllm: bool, truncated: bool = False) -> ItemLayout:
    """The layout of batches with grids.

    Each item (an image, audio or video between its markers, or a video with its audio, whose
    tokens are merged by time) is placed one past where the one before left off. transformers:
    Qwen3-Omni counts on over a video's two start markers and keeps fractional temporal ids
    (float32), merging a video and its audio by exact time; Qwen2.5-Omni gives both markers one
    position and truncates, merging by chunks of ``chunk`` positions, and finds such a video by
    its first video token; both go on from the part placed last. vLLM: every marker counts on,
    temporal ids are float64 products truncated, Qwen2.5-Omni's block of a video with its audio
    starts one token early (at its audio start marker) and merges by groups of frames; the text
    after a block goes on past its largest position, and an audio of its own may not share a
    sample with a video with its audio. ``truncated``: transformers' float32 positions written
    truncated to int64 (SGLang's cast)."""
    qwen3 = family.float_positions
    markers: Literal["count", "share"] = "count" if qwen3 or vllm else "share"
    resume: Literal["largest", "last"] = "largest" if vllm else "last"

    def alone(name: str, opening: int, placeholder: int, closing: int) -> ItemKind:
        return ItemKind(name, key=(opening, placeholder), media=(name,), placeholders=(placeholder,),
                        closing=(closing,), markers=markers, resume=resume)

    t = tokens
    with_audio = ItemKind(
        VIDEO_WITH_AUDIO, key=(t.vision_start, t.audio_start), media=(VIDEO, AUDIO), placeholders=(t.video, t.audio),
        closing=(t.audio_end, t.vision_end), begins_with=None if qwen3 or vllm else t.video, markers=markers,
        lead=1 if vllm and not qwen3 else None, interleave="time" if qwen3 else "groups" if vllm else "chunks",
        chunk=0 if qwen3 else chunk, resume=resume)
    if vllm:
        temporal = TemporalRule(per_second, "scale_first", "float64", truncate=True)
    else:
        temporal = TemporalRule(per_second, "frame_first", "float32", truncate=not qwen3)
    return ItemLayout(
        media=(GridMedia(IMAGE, merge), GridMedia(VIDEO, merge, timed=True), audio),
        kinds=(alone(IMAGE, t.vision_start, t.image, t.vision_end), alone(AUDIO, t.audio_start, t.audio, t.audio_end),
               alone(VIDEO, t.vision_start, t.video, t.vision_end), with_audio),
        temporal=temporal, dtype=torch.float32 if qwen3 and not vllm else torch.int64, truncated=truncated,
        padding=0 if qwen3 else 1,
        exclusive=((AUDIO, VIDEO_WITH_AUDIO),) if vllm else ())


def text_layout(layout: ItemLayout, vllm: bool) -> ItemLayout:
    """The layout of batches without image and video grids: items read and checked, every token
    counting on; padding holds 1 and, in transformers' convention, counts in the deltas."""
    return layout.replace(text_only=True, padding=1, padding_in_largest=not vllm, empty_samples=True)
