"""Random batches laid out as each model type's processor lays out its placeholders, videos
included (no video processor runs offline): for the differential tests and the benchmarks.

Each layout follows the processor's code: which markers surround an item, how many placeholder
tokens a grid takes, how videos are split into frames.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from mmrope_core.tiny import padded_batch

from .specs import spec_of

Row = list[int]
Grid = tuple[int, ...]
#: tokens, media kind ("image" or "video"), its grid (t, h, w) in patches, or the (h, w) of each of
#: its crops in order where a model takes one grid per crop
Item = tuple[Row, str, Grid | list[Grid]]


class Tokens:
    """The ids of a processor's special tokens by their text, and a few words."""

    def __init__(self, processor: Any, model_type: str) -> None:
        tokenizer = processor.tokenizer
        self.ids = {name: tokenizer.convert_tokens_to_ids(text) for name, text in spec_of(model_type).tokens.items()}
        self.words = [tokenizer.convert_tokens_to_ids(word) for word in ("the", "cat", "sat", "on", "a", "mat")]
        self.pad = tokenizer.pad_token_id
        self.tokenizer = tokenizer

    def __getitem__(self, name: str) -> int:
        return self.ids[name]

    def text(self, rng: random.Random, low: int = 1, high: int = 8) -> Row:
        return [rng.choice(self.words) for _ in range(rng.randint(low, high))]

    def encode(self, text: str) -> Row:
        """``text`` as the processor's tokenizer reads it inside a prompt."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _side(rng: random.Random, limit: int) -> int:
    return rng.randint(1, max(1, limit))


def _marked_image(start: str, end: str) -> Callable[..., Item]:
    """The layout of an image as one run of ``h' * w'`` placeholders between the tokens named
    ``start`` and ``end``."""

    def image(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
        a, b = _side(rng, side), _side(rng, side)
        return [tokens[start], *[tokens["image_token"]] * (a * b), tokens[end]], "image", (1, merge * a, merge * b)

    return image


qwen_image = _marked_image("vision_start_token", "vision_end_token")
glm_image = _marked_image("begin_of_image_token", "end_of_image_token")
paddle_image = _marked_image("image_start_token", "image_end_token")


def qwen3_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """Qwen3-VL's processor: each frame is ``<t seconds>`` text, then its own marked run."""
    frames, a, b = rng.randint(1, side + 1), _side(rng, side // 2 + 1), _side(rng, side // 2 + 1)
    row: Row = []
    for _ in range(frames):
        row += tokens.text(rng, 1, 3) + [tokens["vision_start_token"], *[tokens["video_token"]] * (a * b),
                                         tokens["vision_end_token"]]
    return row, "video", (frames, merge * a, merge * b)


def qwen2_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """Qwen2-VL's processor: a video is one marked run of all its frames."""
    frames, a, b = rng.randint(1, side + 1), _side(rng, side // 2 + 1), _side(rng, side // 2 + 1)
    run = [tokens["video_token"]] * (frames * a * b)
    return [tokens["vision_start_token"], *run, tokens["vision_end_token"]], "video", (frames, merge * a, merge * b)


def glm_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """GLM's processor: frames are image runs between video markers, a timestamp after each."""
    frames, a, b = rng.randint(1, side + 1), _side(rng, side // 2 + 1), _side(rng, side // 2 + 1)
    row = [tokens["begin_of_video_token"]]
    for _ in range(frames):
        row += [tokens["begin_of_image_token"], *[tokens["image_token"]] * (a * b), tokens["end_of_image_token"],
                *tokens.text(rng, 1, 2)]
    return row + [tokens["end_of_video_token"]], "video", (frames, merge * a, merge * b)


def ernie_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """ERNIE-4.5-VL's processor: one run of ``t // 2`` merged frames (an odd last frame dropped)."""
    frames, a, b = rng.randint(2, side + 4), _side(rng, side // 2 + 1), _side(rng, side // 2 + 1)
    run = [tokens["video_token"]] * ((frames // 2) * a * b)
    return [tokens["video_start_token"], *run, tokens["video_end_token"]], "video", (frames, merge * a, merge * b)


def hy_v4_image(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """HY-V4-VL's processor: every row of merged patches ends with a newline placeholder."""
    a, b = _side(rng, side), _side(rng, side)
    run = [tokens["image_token"]] * (a * (b + 1))
    return [tokens["vision_start_token"], *run, tokens["vision_end_token"]], "image", (1, merge * a, merge * b)


def hy_v4_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    frames, a, b = rng.randint(1, side), _side(rng, side // 2 + 1), _side(rng, side // 2 + 1)
    run = [tokens["video_token"]] * (frames * a * (b + 1))
    return [tokens["vision_start_token"], *run, tokens["vision_end_token"]], "video", (frames, merge * a, merge * b)


def hunyuan_image(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """HunYuan-VL's processor: ``h' * (w' + 1) + 2`` placeholders between the image markers (the
    model also takes the run without the two extra tokens)."""
    a, b = _side(rng, side), _side(rng, side)
    run = [tokens["image_token"]] * (a * (b + 1) + (2 if rng.random() < 0.8 else 0))
    return [tokens["image_start_token"], *run, tokens["image_end_token"]], "image", (1, merge * a, merge * b)


def glm_image_source(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """GLM-Image: ``h * w`` placeholders (no merging) between the image start and end markers."""
    h, w = _side(rng, side + 1), _side(rng, side + 1)
    return [tokens["bos_token"], *[tokens["image_token"]] * (h * w), tokens["image_end_token"]], "image", (1, h, w)


def _minicpm_frame(tokens: Tokens, merge: int, pad: str, thumbnail: tuple[int, int], tiles: tuple[int, int],
                   tile: tuple[int, int]) -> tuple[Row, list[Grid]]:
    """MiniCPM-V's processor: a thumbnail of ``thumbnail`` placeholders a side between ``<image>``
    markers, then ``tiles`` (lines, columns) of slices of ``tile`` placeholders a side, each between
    ``<slice>`` markers, the lines joined by newlines. Grids: each crop's ``(h, w)`` in patches."""
    (a, b), (lines, columns), (c, d) = thumbnail, tiles, tile
    row = [tokens["image_start_token"], *[tokens[pad]] * (a * b), tokens["image_end_token"]]
    grids: list[Grid] = [(merge * a, merge * b)]
    for line in range(lines):
        row += tokens.encode("\n") if line else []
        for _ in range(columns):
            row += [tokens["slice_start_token"], *[tokens[pad]] * (c * d), tokens["slice_end_token"]]
            grids.append((merge * c, merge * d))
    return row, grids


def _minicpm_sizes(rng: random.Random, side: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """A thumbnail's sides, the slicing (none for 0 lines), a slice's sides."""
    tiles = (rng.randint(1, 3), rng.randint(1, 3)) if rng.random() < 0.6 else (0, 0)
    return (_side(rng, side), _side(rng, side)), tiles, (_side(rng, side), _side(rng, side))


def minicpm_image(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """MiniCPM-V's processor: a picture's frame after its ``<image_id>N</image_id>`` tag."""
    run, grids = _minicpm_frame(tokens, merge, "image_token", *_minicpm_sizes(rng, side))
    tag = [tokens["image_id_start_token"], *tokens.encode(str(rng.randint(0, 9))), tokens["image_id_end_token"]]
    return tag + run, "image", grids


def minicpm_video(tokens: Tokens, rng: random.Random, merge: int, side: int = 5) -> Item:
    """MiniCPM-V's processor: a video's frames back to back, untagged, all of one size and slicing."""
    sizes = _minicpm_sizes(rng, side // 2 + 1)
    row: Row = []
    grids: list[Grid] = []
    for _ in range(rng.randint(1, side)):
        run, crops = _minicpm_frame(tokens, merge, "video_token", *sizes)
        row, grids = row + run, grids + crops
    return row, "video", grids


#: model type -> (image layout, video layout or None)
LAYOUTS: dict[str, tuple[Callable[..., Item], Callable[..., Item] | None]] = {
    "qwen4_exp": (qwen_image, qwen3_video),
    "cosmos3_omni": (qwen_image, qwen3_video),
    "cosmos3_edge": (qwen_image, qwen3_video),
    "cohere_compass": (qwen_image, qwen3_video),
    "glm_ocr": (glm_image, glm_video),
    "glmga": (glm_image, glm_video),
    "paddleocr_vl": (paddle_image, None),
    "ernie4_5_vl_moe": (paddle_image, ernie_video),
    "hy_v4_vl": (hy_v4_image, hy_v4_video),
    "hunyuan_vl": (hunyuan_image, None),
    "glm_image": (glm_image_source, None),
    "minicpmv4_7": (minicpm_image, minicpm_video),
    # model types whose family plugins answer first
    "qwen2_vl": (qwen_image, qwen2_video),
    "qwen2_5_vl": (qwen_image, qwen2_video),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"), (qwen_image, qwen3_video)),
    **dict.fromkeys(("glm4v", "glm4v_moe", "glm46v"), (glm_image, glm_video)),
}
#: model types whose videos carry their seconds per grid (fractional: the rule changed in transformers 5.11)
TIMED = frozenset({"qwen2_5_vl"})
SECONDS = (0.5, 1.0, 2.0, 1 / 3, 0.77, 1.25)
#: model types whose grids go by other names than ``image_grid_thw`` / ``video_grid_thw``
GRID_KEYS = {"minicpmv4_7": {"image": "target_sizes", "video": "target_sizes_videos"}}


def _merge(model_type: str, config: Any) -> int:
    """Patches a placeholder takes a side, as the model reads it from its config."""
    if model_type in GRID_KEYS:  # MiniCPM-V: 2 in its "4x" downsampling mode, 4 otherwise
        return 2 if getattr(config, "downsample_mode", None) == "4x" else 4
    return int(getattr(getattr(config, "vision_config", None), "spatial_merge_size", 2) or 2)


def random_batch(model_type: str, processor: Any, config: Any, rng: random.Random, *, max_batch: int = 6,
                 max_items: int = 4, side: int = 5, samples: int | None = None) -> dict[str, Any]:
    """``input_ids``, ``attention_mask`` and the grids of a random batch for ``model_type``, padded
    on a random side: up to ``max_batch`` samples (exactly ``samples``, if given) of up to
    ``max_items`` images and videos, of up to ``side`` merged patches a side. GLM-Image's samples
    end as its processor ends them, with an open image start marker and the target grid the
    model generates."""
    image, video = LAYOUTS[model_type]
    tokens = Tokens(processor, model_type)
    merge = _merge(model_type, config)
    rows: list[Row] = []
    grids: dict[str, list[Grid]] = {"image": [], "video": []}
    per_sample: list[int] = []
    for _ in range(samples or rng.randint(1, max_batch)):
        row = tokens.text(rng)
        count = rng.randint(0, max_items)
        for _ in range(count):
            layout = video if video is not None and rng.random() < 0.35 else image
            run, key, grid = layout(tokens, rng, merge, side)
            row += run + tokens.text(rng, 0 if rng.random() < 0.2 else 1, 6)
            grids[key] += grid if isinstance(grid, list) else [grid]
        if model_type == "glm_image":
            row += [tokens["bos_token"]]
            grids["image"].append((1, _side(rng, side + 1), _side(rng, side + 1)))
            per_sample.append(count + 1)
        rows.append(row or tokens.text(rng))
    input_ids, attention_mask = padded_batch(rows, tokens.pad, left=rng.random() < 0.5)
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
    names = GRID_KEYS.get(model_type, {"image": "image_grid_thw", "video": "video_grid_thw"})
    if grids["image"]:
        batch[names["image"]] = torch.tensor(grids["image"])
    if grids["video"]:
        batch[names["video"]] = torch.tensor(grids["video"])
        if model_type in TIMED:
            batch["second_per_grid_ts"] = torch.tensor([rng.choice(SECONDS) for _ in grids["video"]])
    if per_sample:
        batch["images_per_sample"] = torch.tensor(per_sample)
    return batch


def processor_batch(model_type: str, processor: Any, rng: random.Random, *, max_batch: int = 4,
                    max_images: int = 3) -> list[Any]:
    """One processor call per sample, each with 0 to ``max_images`` random images of random sizes:
    the processor's own layouts, next to the hand-written ones (MiniCPM-V's slices)."""
    from mmrope_core.tiny import filler_text, random_image

    spec = spec_of(model_type)
    image_text = spec.image_text.format(image=getattr(processor, "image_token", ""))
    low, high, step = spec.sizes
    outputs = []
    for _ in range(rng.randint(1, max_batch)):
        count = rng.randint(0, max_images)
        parts = [filler_text(rng, rng.randint(1, 6))]
        for _ in range(count):
            parts += [image_text, filler_text(rng, rng.randint(0, 4))]
        call: dict[str, Any] = {"text": [" ".join(part for part in parts if part)], "return_tensors": "pt",
                                **spec.call_kwargs}
        if count:
            images = [random_image(rng, step * rng.randint(low, high), step * rng.randint(low, high))
                      for _ in range(count)]
            call["images"] = [images] if spec.images_in_a_list else images
        outputs.append(processor(**call))
    return outputs
