"""Generated Omni batches: text, images, audios, videos with fractional timing, audio in video,
left and right padding. The plugin checks itself on a few; the tests run hundreds."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from mmrope_core.tiny import padded_batch

from .audio import audio_token_counts
from .families import Family
from .layout import Tokens


def audio_tokens(family: Family, frames: int, thinker: Any, rule: str | None) -> int:
    counts = audio_token_counts(family, thinker, rule, torch.tensor([frames]))
    assert counts is not None
    return int(counts[0])


def random_batch(family: Family, tokens: Tokens, merge: int, thinker: Any, rng: random.Random, *,
                 use_audio_in_video: bool, max_batch: int = 6, max_items: int = 5, text_ids=None,
                 pad_id: int | None = None, max_frames: int = 8, audio_rule: str | None = None,
                 kinds: Sequence[str] = ("image", "audio", "video", "video"), ensure_grid: bool = True,
                 strays: str | None = None) -> dict[str, Any]:
    """A valid batch of ``input_ids``, ``attention_mask`` and the Omni keyword arguments.

    ``text_ids`` default to ids that are none of ``tokens``; padding uses the first of them.
    ``kinds``: what each item is drawn from. ``ensure_grid``: a batch without an image or video
    gets an image (the reference places media only when a grid is given). ``strays="markers"``
    puts start and end markers that open nothing between the items, as a sampled response holds
    them: a vision or audio start before text, before another item's start or ending the row, a
    lone end marker; ``strays="text"`` puts a text token in each of their places instead, with
    the same draws, so the two batches differ only there.
    """
    if text_ids is None:
        special = set(vars(tokens).values())
        text_ids = [token for token in range(len(special) + 4) if token not in special][:4]
    pad_id = text_ids[0] if pad_id is None else pad_id
    markers = (tokens.vision_start, tokens.audio_start, tokens.vision_end, tokens.audio_end)

    def stray() -> tuple[int, int]:
        """A marker drawn, and the token put in its place."""
        marker = rng.choice(markers)
        return marker, marker if strays == "markers" else text_ids[-1]

    rows, images, videos, seconds, audio_frames = [], [], [], [], []
    for _ in range(rng.randint(1, max_batch)):
        row = [rng.choice(text_ids) for _ in range(rng.randint(1, 8))]
        for _ in range(rng.randint(0, max_items)):
            if strays and rng.random() < 0.4:
                marker, token = stray()
                # a vision start right before an audio start would open a video with its audio
                row += [token] + ([rng.choice(text_ids)] if marker == tokens.vision_start or rng.random() < 0.5 else [])
            kind = rng.choice(kinds)
            if kind == "image":
                grid = (1, merge * rng.randint(1, 5), merge * rng.randint(1, 5))
                images.append(grid)
                row += [tokens.vision_start] + [tokens.image] * (grid[0] * grid[1] * grid[2] // merge**2) + [tokens.vision_end]
            elif kind == "audio":
                frames = rng.randint(20, 700)
                audio_frames.append(frames)
                row += [tokens.audio_start] + [tokens.audio] * audio_tokens(family, frames, thinker, audio_rule) + [tokens.audio_end]
            else:
                grid = (rng.randint(1, max_frames), merge * rng.randint(1, 3), merge * rng.randint(1, 3))
                videos.append(grid)
                # long grids (over 4 s at 25 positions a second) cut Qwen2.5-Omni's 2 s chunks inside a frame
                seconds.append(rng.choice([0.5, 1.0, 2.0, 1 / 3, 0.04, rng.uniform(0.05, 2.5), rng.uniform(4, 6)]))
                video_count = grid[0] * grid[1] * grid[2] // merge**2
                if use_audio_in_video:
                    frames = rng.randint(20, 900)
                    audio_frames.append(frames)
                    row += [tokens.vision_start, tokens.audio_start] + [tokens.video] * video_count
                    row += [tokens.audio] * audio_tokens(family, frames, thinker, audio_rule) + [tokens.audio_end, tokens.vision_end]
                else:
                    row += [tokens.vision_start] + [tokens.video] * video_count + [tokens.vision_end]
            row += [rng.choice(text_ids) for _ in range(rng.randint(0, 6))]
        if strays and rng.random() < 0.3:
            row.append(stray()[1])  # the row's last token
        rows.append(row)
    if ensure_grid and not images and not videos:
        grid = (1, merge, merge)
        images.append(grid)
        rows[0] += [tokens.vision_start, tokens.image, tokens.vision_end]
    input_ids, mask = padded_batch(rows, pad_id, left=rng.random() < 0.5)
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "image_grid_thw": torch.tensor(images) if images else None,
        "video_grid_thw": torch.tensor(videos) if videos else None,
        "second_per_grids": torch.tensor(seconds, dtype=torch.float32) if videos else None,
        "audio_seqlens": torch.tensor(audio_frames) if audio_frames else None,
        "use_audio_in_video": use_audio_in_video,
    }


def probe_batches(family: Family, tokens: Tokens, merge: int, thinker: Any, audio_rule: str) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"mmrope probe {family.name}")
    for use_audio_in_video in (False, True, False, True):
        yield random_batch(family, tokens, merge, thinker, rng, use_audio_in_video=use_audio_in_video, max_batch=3,
                           audio_rule=audio_rule)
