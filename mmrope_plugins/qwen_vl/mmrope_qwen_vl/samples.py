"""Random batches for the Qwen-VL family, laid out as each family's processor lays them out."""

from __future__ import annotations

import random

import torch

from mmrope_core.tiny import padded_batch

from .families import family_of

SECONDS = (0.5, 1.0, 2.0, 1 / 3, 0.77, 1.25, 0.1)


def random_batch(processor, rng: random.Random, *, max_batch: int = 16, max_images: int = 8,
                 max_videos: int = 2, max_frames: int = 16, bare_edges: bool = False, min_length: int = 0) -> dict:
    """``input_ids``, ``attention_mask`` and the grids of a random batch for ``processor``.

    Samples hold 0..max_images images of random grids and 0..max_videos videos of 1..max_frames
    frames, text runs between them, and are padded on one random side. With ``bare_edges``, a
    sample may begin or end with a placeholder run (no marker or text around it); rows are
    padded to at least ``min_length`` tokens.
    """
    family = family_of(processor)
    tokenizer = processor.tokenizer
    words = [tokenizer.convert_tokens_to_ids(word) for word in ("the", "cat", "sat", "on", "a", "mat")]
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _tokens(tokenizer).items()}
    rows, image_grids, video_grids, seconds = [], [], [], []
    for _ in range(rng.randint(1, max_batch)):
        media = ["image"] * rng.randint(0, max_images) + ["video"] * rng.randint(0, max_videos)
        rng.shuffle(media)
        row = [] if bare_edges and rng.random() < 0.5 else _text(rng, words, 1, 12)
        for position, item in enumerate(media):
            bare = bare_edges and position in (0, len(media) - 1)
            a, b = rng.randint(1, 6), rng.randint(1, 6)
            if item == "image":
                image_grids.append((1, 2 * a, 2 * b))
                run = [ids["image"]] * (a * b)
                row += run if bare else [ids["start"]] + run + [ids["end"]]
            else:
                frames = rng.randint(1, max_frames)
                a, b = min(a, 4), min(b, 4)
                video_grids.append((frames, 2 * a, 2 * b))
                seconds.append(rng.choice(SECONDS) if rng.random() < 0.8 else rng.uniform(0.05, 3.0))
                row += _video(family, ids, words, rng, frames, a * b)
            if not (bare and position == len(media) - 1 and rng.random() < 0.5):
                row += _text(rng, words, 1, 12)
        rows.append(row or _text(rng, words, 1, 12))
    input_ids, attention_mask = padded_batch(rows, tokenizer.pad_token_id, left=rng.random() < 0.5,
                                             length=max(min_length, *map(len, rows)))
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if image_grids:
        batch["image_grid_thw"] = torch.tensor(image_grids)
    if video_grids:
        batch["video_grid_thw"] = torch.tensor(video_grids)
        if family is not None and family.timed_video:
            batch["second_per_grid_ts"] = torch.tensor(seconds, dtype=torch.float32)
    return batch


def _text(rng, words, low, high):
    return [rng.choice(words) for _ in range(rng.randint(low, high))]


def _video(family, ids, words, rng, frames, tokens_per_frame):
    if family.video_inside_markers:  # GLM: frames are image runs inside video markers
        out = [ids["video_start"]]
        for _ in range(frames):
            out += [ids["start"]] + [ids["image"]] * tokens_per_frame + [ids["end"]] + _text(rng, words, 1, 2)
        return out + [ids["video_end"]]
    if family.per_frame_video:  # Qwen3-VL: "<t seconds>" text before each frame
        out = []
        for _ in range(frames):
            out += _text(rng, words, 1, 3) + [ids["start"]] + [ids["video"]] * tokens_per_frame + [ids["end"]]
        return out
    return [ids["start"]] + [ids["video"]] * (frames * tokens_per_frame) + [ids["end"]]


def _tokens(tokenizer):
    if hasattr(tokenizer, "vision_start_token"):
        return {"start": tokenizer.vision_start_token, "end": tokenizer.vision_end_token,
                "image": tokenizer.image_token, "video": tokenizer.video_token}
    return {"start": tokenizer.begin_of_image_token, "end": tokenizer.end_of_image_token,
            "image": tokenizer.image_token, "video": tokenizer.video_token,
            "video_start": tokenizer.begin_of_video_token, "video_end": tokenizer.end_of_video_token}
