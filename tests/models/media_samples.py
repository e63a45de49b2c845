"""Generated samples with the media the tiny processors cannot process without torchvision:
videos (with fractional seconds per grid where the family times them), and Omni videos carrying
their audio. Token ids are laid out as each family's processor lays them out; pixels and mel
features are random, of the sizes the grids and audio lengths say."""

from __future__ import annotations

import random
from typing import Any

import torch


def video_sample(processor: Any, rng: random.Random, generator: torch.Generator, images: int = 1) -> dict[str, Any]:
    """A sample of a Qwen-VL-family processor with one or two videos and up to ``images`` images."""
    from mmrope_qwen_vl.samples import random_batch

    batch: dict[str, Any] = {}
    while "video_grid_thw" not in batch:
        batch = random_batch(processor, rng, max_batch=1, max_images=images, max_videos=2, max_frames=3)
    valid = batch.pop("attention_mask")[0].bool()
    ids = batch.pop("input_ids")[0][valid][None]
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **batch,
              "mm_token_type_ids": torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))}
    patch = _patch(processor)
    for key, pixels in (("image_grid_thw", "pixel_values"), ("video_grid_thw", "pixel_values_videos")):
        if key in batch:
            sample[pixels] = torch.randn(int(batch[key].prod(-1).sum()), patch, generator=generator)
    return sample


def audio_in_video_sample(processor: Any, thinker: Any, rng: random.Random, generator: torch.Generator) -> dict[str, Any]:
    """A Qwen-Omni sample whose videos carry their audio (``use_audio_in_video``), for the thinker
    config ``thinker``: its token ids and timing."""
    from mmrope_qwen3_omni.binding import token_ids
    from mmrope_qwen3_omni.families import family_of
    from mmrope_qwen3_omni.layout import tokens_of
    from mmrope_qwen3_omni.probe import random_batch

    ids = token_ids(processor)
    tokens = tokens_of(thinker, {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]})
    words = processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "on"])
    merge = thinker.vision_config.spatial_merge_size
    batch: dict[str, Any] = {"video_grid_thw": None}
    while batch["video_grid_thw"] is None:
        batch = random_batch(family_of(processor), tokens, merge, thinker, rng, use_audio_in_video=True, max_batch=1,
                             max_items=2, max_frames=3, text_ids=words, pad_id=processor.tokenizer.pad_token_id,
                             kinds=("video",))
    valid = batch["attention_mask"][0].bool()
    row = batch["input_ids"][0][valid][None]
    frames, grids = batch["audio_seqlens"], batch["video_grid_thw"]
    mel_bins = processor.feature_extractor.feature_size
    return {
        "input_ids": row,
        "attention_mask": torch.ones_like(row),
        "video_grid_thw": grids,
        "video_second_per_grid": batch["second_per_grids"],
        "pixel_values_videos": torch.randn(int(grids.prod(-1).sum()), _patch(processor), generator=generator),
        "input_features": torch.randn(len(frames), mel_bins, int(frames.max()), generator=generator),
        "feature_attention_mask": (torch.arange(int(frames.max()))[None] < frames[:, None]).long(),
    }


def _patch(processor: Any) -> int:
    """Values per pixel row: channels x temporal patch x patch x patch of the image processor."""
    image = processor.image_processor
    return 3 * getattr(image, "temporal_patch_size", 2) * image.patch_size**2
