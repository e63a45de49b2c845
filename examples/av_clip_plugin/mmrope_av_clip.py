"""mmrope plugin for AV-Clip, an audio-visual family of its own: a clip is a video with its
sound between two markers, the video's frames and the sound's tokens interleaved in time.

The family's rule is written as data for mmrope's media-item primitives
(:mod:`mmrope_core.items`); no code of mmrope knows it. A clip's markers count on; inside it a
frame takes its temporal id ``trunc(frame * seconds_per_grid * 4)`` from the clip's start, a sound
token one position a token (a quarter second each), the sound's tokens coming before the frames
they precede in time; the text after a clip goes on past its largest position."""

from __future__ import annotations

import math
from typing import Any

from mmrope_core import ExampleCase, RopeBinding, hookimpl

PROCESSOR_CLASSES = ("AVClipProcessor",)
TOKENS = {"clip_token": "<|clip|>", "clip_end_token": "<|/clip|>", "frame_token": "<|frame|>",
          "sound_token": "<|sound|>"}
MERGE, PATCH, FRAMES_PER_PATCH = 2, 14, 2  # a merged patch: 2 x 2 patches of 14 pixels, over 2 frames
MEL_HOP, MELS_PER_TOKEN = 160, 25  # 16 kHz samples a mel frame, mel frames a sound token: 0.25 s
PER_SECOND = 4.0  # temporal positions a second: one a sound token
KEYS = {"video": ("video_grid_thw", "second_per_grids"), "sound": "audio_seqlens"}


def layout(processor: Any) -> Any:
    """AV-Clip's rule as an :class:`~mmrope_core.items.ItemLayout`."""
    from mmrope_core.items import GridMedia, ItemKind, ItemLayout, SequenceMedia, TemporalRule

    start, end, frame, sound = processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
    clip = ItemKind("clip", key=(start,), media=("video", "sound"), placeholders=(frame, sound), closing=(end,),
                    interleave="time")
    return ItemLayout(media=(GridMedia("video", MERGE, timed=True), SequenceMedia("sound", steps=((1, MELS_PER_TOKEN),))),
                      kinds=(clip,), temporal=TemporalRule(PER_SECOND, "scale_first", "float64"))


@hookimpl
def bind_rope_index(processor: Any) -> RopeBinding | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from mmrope_core.items import ItemKernel

    return RopeBinding("mrope", ItemKernel(layout(processor), KEYS), "fast", "AV-Clip, media-item kernel")


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any) -> dict[str, Any] | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    return {key: multi_modal_inputs[key] for key in ("video_grid_thw", "second_per_grids", "audio_seqlens")
            if multi_modal_inputs.get(key) is not None}


@hookimpl
def batch_layout(processor: Any) -> Any:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from mmrope_core.batching import VIDEO_GRID, BatchLayout, MediaKey

    # what each key holds: the engine reads and checks them before the hooks and the kernel see them
    return BatchLayout(media={"video_grid_thw": VIDEO_GRID,
                              "second_per_grids": MediaKey(role="seconds", grid="video_grid_thw"),
                              "audio_seqlens": MediaKey(role="audio_lengths")})


@hookimpl
def varlen_keys(processor: Any) -> set[str] | None:
    return set() if type(processor).__name__ in PROCESSOR_CLASSES else None


@hookimpl
def example_cases() -> list[ExampleCase]:
    return [ExampleCase("AV-Clip", build, clip_samples)]


# -- the family's processor, and a tiny one built offline for `mmrope check` and the tests --------

def clip_tokens(grid: tuple[int, int, int], seconds: float, mels: int, frame: int, sound: int) -> list[int]:
    """A clip's placeholders in time order: before each frame, the sound tokens heard before it."""
    per_frame, heard, tokens = grid[1] * grid[2] // MERGE**2, 0, []
    sounds = (mels - 1) // MELS_PER_TOKEN + 1
    for index in range(grid[0]):
        until = max(heard, min(sounds, int(index * (seconds * PER_SECOND))))
        tokens += [sound] * (until - heard) + [frame] * per_frame
        heard = until
    return tokens + [sound] * (sounds - heard)


class AVClipProcessor:
    """Text with a ``<|clip|>`` where each clip goes; a clip is a video (``(T, H, W, 3)`` frames
    at ``fps``) and its sound (16 kHz samples), laid out as the model reads it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: list[str], clips: list[tuple[Any, Any]] | None = None, fps: float = 2.0,
                 return_tensors: str = "pt") -> Any:
        import numpy as np
        import torch
        from transformers import BatchFeature

        from mmrope_core.tiny import padded_batch

        start, end, frame, sound = self.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))
        seconds = float(np.float32(FRAMES_PER_PATCH / fps))  # per grid, as the model is given it
        grids, mels, rows = [], [], []
        media = iter(clips or ())
        for line in text:
            pieces = line.split(TOKENS["clip_token"])
            row = self.tokenizer(pieces[0], add_special_tokens=False)["input_ids"]
            for piece in pieces[1:]:
                video, waveform = next(media)
                side = PATCH * MERGE
                grid = (math.ceil(len(video) / FRAMES_PER_PATCH), video.shape[1] // side * MERGE,
                        video.shape[2] // side * MERGE)
                grids.append(grid)
                mels.append(len(waveform) // MEL_HOP)
                row += [start, *clip_tokens(grid, seconds, mels[-1], frame, sound), end]
                row += self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            rows.append(row)
        ids, mask = padded_batch(rows, self.tokenizer.pad_token_id, left=False)
        data: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if grids:
            data.update(video_grid_thw=torch.tensor(grids), audio_seqlens=torch.tensor(mels),
                        second_per_grids=torch.full((len(grids),), seconds, dtype=torch.float32))
        return BatchFeature(data, tensor_type=return_tensors)


def build() -> tuple[Any, Any]:
    """A processor with a word-level vocabulary; the family takes no config."""
    from mmrope_core.tiny import word_level_tokenizer

    return AVClipProcessor(word_level_tokenizer(TOKENS)), None


def clip_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Two samples of text and clips of random size, frame rate and sound."""
    import numpy as np

    from mmrope_core.tiny import filler_text

    samples = []
    for count in (2, 1):
        clips = [(np.zeros((rng.randint(1, 6), 28 * rng.randint(1, 3), 28 * rng.randint(1, 3), 3), np.uint8),
                  np.zeros(rng.randint(MEL_HOP, 3 * 16000), np.float32)) for _ in range(count)]
        text = " ".join([filler_text(rng, 3)] + [f"{TOKENS['clip_token']} {filler_text(rng, 2)}" for _ in clips])
        samples.append({"text": [text], "clips": clips, "fps": rng.choice((1.0, 2.0, 3.0)), "return_tensors": "pt"})
    return samples
