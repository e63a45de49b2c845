"""Samples the benchmarks share: token rows laid out as each family's processor lays them out,
with the keyword arguments of the family's ``get_rope_index``."""

from __future__ import annotations

import random
from typing import Any

import torch

from mmrope_qwen_vl.families import family_of as vl_family_of



def batch_with_media(processor, rows, length, grids, right_pad=0, seconds=1.25):
    """``rows`` equal rows of ``length`` tokens: text, then each of ``grids`` (t == 1: an image,
    else a video of t frames ``seconds`` apart) laid out as the family's processor writes it, text
    after each, and ``right_pad`` padding."""
    ids = vl_token_ids(processor)
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    row, images, videos = [word] * 16, [], []
    for grid in grids:
        per_frame = grid[1] * grid[2] // 4
        if grid[0] == 1:
            images.append(grid)
            row += [ids["start"]] + [ids["image"]] * per_frame + [ids["end"]]
        else:
            videos.append(grid)
            row += vl_video(processor, grid[0], per_frame, [word, word])
        row += [word] * 32
    valid = length - right_pad
    if len(row) > valid:
        raise ValueError(f"the media need {len(row)} tokens, more than the {valid} valid ones")
    row += [word] * (valid - len(row))
    input_ids = torch.full((rows, length), processor.tokenizer.pad_token_id, dtype=torch.long)
    input_ids[:, :valid] = torch.tensor(row)
    mask = torch.zeros(rows, length, dtype=torch.long)
    mask[:, :valid] = 1
    kwargs = {}
    if images:
        kwargs["image_grid_thw"] = torch.tensor(images * rows)
    if videos:
        kwargs["video_grid_thw"] = torch.tensor(videos * rows)
        if vl_family_of(processor).timed_video:
            kwargs["second_per_grid_ts"] = torch.full((rows * len(videos),), seconds)
    return input_ids, mask, kwargs


def vl_timing_batches(name: str, processor) -> list[tuple[str, dict[str, Any]]]:
    """The side-by-side scripts' timed Qwen-VL batches: ``(case, get_rope_index keyword arguments
    with input_ids and attention_mask)``."""
    cases = [(f"{name} 1 x 4096, 2 images (1,28,28)", (1, 4096, [(1, 28, 28)] * 2, 100)),
             (f"{name} 1 x 16384, 1 video (32,36,36)", (1, 16384, [(32, 36, 36)], 0)),
             (f"{name} 32 x 8192, 4 images + 1 video (8,28,28)",
              (32, 8192, [(1, 28, 28)] * 2 + [(8, 28, 28)] + [(1, 28, 28)] * 2, 512))]
    built = []
    for case, (rows, length, grids, pad) in cases:
        ids, mask, kwargs = batch_with_media(processor, rows, length, grids, pad)
        built.append((case, {"input_ids": ids, "attention_mask": mask, **kwargs}))
    return built


def vl_video(processor, frames, per_frame, timestamp):
    """A video's tokens: one run (Qwen2/2.5-VL), per-frame runs after ``timestamp`` text
    (Qwen3-VL), or per-frame image runs between video markers, ``timestamp`` after each (GLM)."""
    family = vl_family_of(processor)
    ids = vl_token_ids(processor)
    if family.video_inside_markers:
        frame = [ids["start"]] + [ids["image"]] * per_frame + [ids["end"]] + timestamp
        return [ids["video_start"]] + frame * frames + [ids["video_end"]]
    if family.per_frame_video:
        return (timestamp + [ids["start"]] + [ids["video"]] * per_frame + [ids["end"]]) * frames
    return [ids["start"]] + [ids["video"]] * (frames * per_frame) + [ids["end"]]


def built_family(name: str) -> tuple[Any, Any, Any]:
    """``(processor, config, tokens)`` of the family's example build, ``tokens`` its placeholder
    and marker ids as the anchors take them (``vllm_anchor.Tokens``)."""
    from vllm_anchor import Tokens

    if name in ("Qwen2.5-Omni", "Qwen3-Omni"):
        built = Omni(name)
        t = built.tokens
        return built.processor, built.config, Tokens(
            image=t.image, video=t.video, vision_start=t.vision_start, vision_end=t.vision_end, audio=t.audio,
            audio_start=t.audio_start, audio_end=t.audio_end)
    from mmrope_qwen_vl.examples import build

    processor, config = build(name)
    ids = vl_token_ids(processor)
    return processor, config, Tokens(image=ids["image"], video=ids["video"], vision_start=ids["start"],
                                     vision_end=ids["end"], video_start=ids.get("video_start"),
                                     video_end=ids.get("video_end"))


def vl_token_ids(processor) -> dict[str, int]:
    tokenizer = processor.tokenizer
    names = {"image": tokenizer.image_token, "video": tokenizer.video_token}
    if hasattr(tokenizer, "vision_start_token"):
        names |= {"start": tokenizer.vision_start_token, "end": tokenizer.vision_end_token}
    else:
        names |= {"start": tokenizer.begin_of_image_token, "end": tokenizer.end_of_image_token,
                  "video_start": tokenizer.begin_of_video_token, "video_end": tokenizer.end_of_video_token}
    return {name: tokenizer.convert_tokens_to_ids(token) for name, token in names.items()}


def vl_random_sample(processor, rng: random.Random) -> dict[str, Any]:
    """One generated sample (``mmrope_qwen_vl.samples``): up to 8 images and 2 videos of up to 16 frames."""
    from mmrope_qwen_vl.samples import random_batch

    return random_batch(processor, rng, max_batch=1)


class Omni:
    """A built Omni processor and config with what the generators need."""

    def __init__(self, name: str) -> None:
        from mmrope_qwen3_omni.binding import token_ids
        from mmrope_qwen3_omni.examples import build
        from mmrope_qwen3_omni.families import family_of
        from mmrope_qwen3_omni.layout import tokens_of

        self.processor, self.config = build(name)
        self.family = family_of(self.processor)
        self.thinker = self.config.thinker_config
        self.ids = token_ids(self.processor)
        self.tokens = tokens_of(self.thinker, {"vision_end": self.ids["vision_eos"],
                                               "audio_end": self.ids["audio_eos"]})
        self.words = self.processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "mat"])
        self.pad = self.processor.tokenizer.pad_token_id

    def audio_tokens(self, frames: int) -> int:
        from mmrope_qwen3_omni.probe import audio_tokens

        return audio_tokens(self.family, frames, self.thinker, None)

    def random_sample(self, rng: random.Random, use_audio_in_video: bool) -> tuple[dict[str, Any], int]:
        """One generated sample (``mmrope_qwen3_omni.probe.random_batch``) that vLLM accepts, and how
        many were drawn again: with audio in video, vLLM takes no audio outside the videos."""
        from mmrope_qwen3_omni.probe import random_batch

        for redrawn in range(1000):
            batch = random_batch(self.family, self.tokens, 2, self.thinker, rng, max_batch=1,
                                 use_audio_in_video=use_audio_in_video, text_ids=self.words, pad_id=self.pad)
            if not use_audio_in_video or not _audio_outside_videos(batch["input_ids"][0], self.tokens):
                return batch, redrawn
        raise RuntimeError("no sample without a separate audio in 1000 draws")

    def row(self, rng: random.Random, length: int, use_audio_in_video: bool) -> dict[str, Any]:
        """Items until ``length`` tokens are nearly filled: images, videos (fractional seconds per
        grid) and audios, or, with audio in video, images and videos with their audio."""
        t = self.tokens
        row = [self.words[1]] * 8
        images, videos, seconds, frames_of_audio = [], [], [], []
        while True:
            kind = rng.choice(["image", "video"] if use_audio_in_video else ["image", "audio", "video"])
            item, words = [], [rng.choice(self.words) for _ in range(rng.randint(4, 24))]
            if kind == "image":
                grid = (1, 2 * rng.randint(4, 14), 2 * rng.randint(4, 14))
                item = [t.vision_start] + [t.image] * (grid[1] * grid[2] // 4) + [t.vision_end]
            elif kind == "audio":
                frames = rng.randint(200, 3000)
                item = [t.audio_start] + [t.audio] * self.audio_tokens(frames) + [t.audio_end]
            else:
                grid = (rng.randint(2, 8), 2 * rng.randint(4, 8), 2 * rng.randint(4, 8))
                video = [t.video] * (grid[0] * grid[1] * grid[2] // 4)
                if use_audio_in_video:
                    frames = rng.randint(200, 3000)
                    item = [t.vision_start, t.audio_start] + video + [t.audio] * self.audio_tokens(frames)
                    item += [t.audio_end, t.vision_end]
                else:
                    item = [t.vision_start] + video + [t.vision_end]
            if len(row) + len(item) + len(words) > length:
                break
            row += item + words
            if kind == "image":
                images.append(grid)
            if kind == "video":
                videos.append(grid)
                seconds.append(rng.choice([0.5, 1.0, 2.0, 1 / 3, 0.04, rng.uniform(0.05, 2.5)]))
            if kind == "audio" or (kind == "video" and use_audio_in_video):
                frames_of_audio.append(frames)
        row += [self.words[0]] * (length - len(row))
        return {"row": row, "image_grid_thw": images, "video_grid_thw": videos, "second_per_grids": seconds,
                "audio_seqlens": frames_of_audio, "use_audio_in_video": use_audio_in_video}


def omni_batch(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of :meth:`Omni.row` as one batch of ``get_rope_index`` keyword arguments."""
    cat = [grid for r in rows for grid in r["image_grid_thw"]], [grid for r in rows for grid in r["video_grid_thw"]]
    seconds = [s for r in rows for s in r["second_per_grids"]]
    frames = [f for r in rows for f in r["audio_seqlens"]]
    return {
        "input_ids": torch.tensor([r["row"] for r in rows]),
        "attention_mask": torch.ones(len(rows), len(rows[0]["row"]), dtype=torch.long),
        "image_grid_thw": torch.tensor(cat[0]) if cat[0] else None,
        "video_grid_thw": torch.tensor(cat[1]) if cat[1] else None,
        "second_per_grids": torch.tensor(seconds, dtype=torch.float32) if seconds else None,
        "audio_seqlens": torch.tensor(frames) if frames else None,
        "use_audio_in_video": rows[0]["use_audio_in_video"],
    }


def omni_processor_outputs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(multi_modal_inputs, mm_processor_kwargs)`` a processor call would give for these
    ``get_rope_index`` keyword arguments, for ``engine.compute_position_ids``."""
    inputs = {k: kwargs[k] for k in ("image_grid_thw", "video_grid_thw") if kwargs.get(k) is not None}
    if kwargs.get("second_per_grids") is not None:
        inputs["video_second_per_grid"] = kwargs["second_per_grids"].tolist()
    frames = kwargs.get("audio_seqlens")
    if frames is not None:
        inputs["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).int()
    return inputs, {"use_audio_in_video": kwargs["use_audio_in_video"]}


def _audio_outside_videos(ids: torch.Tensor, tokens) -> bool:
    starts = torch.nonzero(ids == tokens.audio_start).flatten()
    return bool(((starts == 0) | (ids[(starts - 1).clamp(min=0)] != tokens.vision_start)).any())
