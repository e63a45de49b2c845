"""Tiny random models of the families trainers pack, their engines, and samples as processor
outputs: real processor calls on images (and audio), generated samples with videos (fractional
seconds per grid; Omni's audio inside its videos), and text alone."""

from __future__ import annotations

import functools
import random
from typing import Any

import torch
import transformers

from mmrope_core import RopeEngine

FAMILIES = ["Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen2.5-Omni"]
PATCH = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch: what the processors' pixel rows hold
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "max_position_embeddings": 4096}
# mrope_section halves the rotary dimensions (16 for head size 16) among t, h, w
ROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
MM_PROCESSOR_KWARGS = {"Qwen2.5-Omni": {"use_audio_in_video": True}}


@functools.cache
def processor_of(name: str) -> Any:
    if name == "Qwen2.5-Omni":
        from mmrope_qwen3_omni.examples import build as omni

        return omni(name)[0]
    from mmrope_qwen_vl.examples import build

    return build(name)[0]


def tiny_model(name: str) -> Any:
    """A two-layer random model, the same weights at every call."""
    processor = processor_of(name)
    tokenizer = processor.tokenizer
    ids = tokenizer.convert_tokens_to_ids
    text = {**TEXT, "vocab_size": len(tokenizer)}
    torch.manual_seed(0)
    if name == "Qwen2.5-Omni":
        config = transformers.Qwen2_5OmniThinkerConfig(
            text_config={**text, "rope_parameters": ROPE},
            vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                           "out_hidden_size": 32, "fullatt_block_indexes": [0]},
            audio_config={"num_mel_bins": 80, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                          "d_model": 32, "output_dim": 32},
            audio_token_index=ids(processor.audio_token), image_token_index=ids(processor.image_token),
            video_token_index=ids(processor.video_token), audio_start_token_id=ids(tokenizer.audio_bos_token),
            audio_end_token_id=ids(tokenizer.audio_eos_token),
        )
        config.vision_start_token_id = ids(tokenizer.vision_bos_token)
        return transformers.Qwen2_5OmniThinkerForConditionalGeneration(config)
    tokens = {"image_token_id": processor.image_token_id, "video_token_id": processor.video_token_id,
              "vision_start_token_id": ids(tokenizer.vision_start_token),
              "vision_end_token_id": ids(tokenizer.vision_end_token)}
    if name == "Qwen2-VL":
        config = transformers.Qwen2VLConfig(
            text_config={**text, "rope_parameters": ROPE},
            vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}, **tokens)
        return transformers.Qwen2VLForConditionalGeneration(config)
    if name == "Qwen2.5-VL":
        config = transformers.Qwen2_5_VLConfig(
            text_config={**text, "rope_parameters": ROPE},
            vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                           "out_hidden_size": 32, "fullatt_block_indexes": [0]}, **tokens)
        return transformers.Qwen2_5_VLForConditionalGeneration(config)
    config = transformers.Qwen3VLConfig(
        text_config={**text, "head_dim": 16, "rope_parameters": {**ROPE, "mrope_interleaved": True}},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
                       "patch_size": 14, "deepstack_visual_indexes": [0]}, **tokens)
    return transformers.Qwen3VLForConditionalGeneration(config)


def engine_of(name: str, model: Any) -> RopeEngine:
    """The engine of the model's processor and config, as a trainer builds it."""
    processor = processor_of(name)
    if name == "Qwen2.5-Omni":  # the processor's plugin reads the composite config's thinker_config
        from mmrope_qwen3_omni.examples import build as omni

        config = omni(name)[1]
        config.thinker_config = model.config
        return RopeEngine.from_processor(processor, config)
    return RopeEngine.from_processor(processor, model.config)


def samples(name: str, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` processor outputs, one per sample, ``(1, L)`` ids each: media of every kind the
    family takes, and text alone."""
    rng = random.Random(f"padding-free {name} {seed}")
    generator = torch.Generator().manual_seed(seed)
    out = []
    for index in range(count):
        kind = ("processed", "generated", "generated", "text")[index % 4]
        if kind == "text":
            out.append(dict(processor_of(name)(text=["the cat sat on a mat"] * 1, return_tensors="pt")))
        elif kind == "processed":
            out.append(_processed(name, rng))
        elif name == "Qwen2.5-Omni":
            out.append(_audio_in_video(rng, generator))
        else:
            out.append(_video(name, rng, generator))
    return out


def _processed(name: str, rng: random.Random) -> dict[str, Any]:
    processor = processor_of(name)
    if name == "Qwen2.5-Omni":
        from mmrope_qwen3_omni.examples import audio_and_image_samples

        return dict(processor(**audio_and_image_samples(processor, rng)[0]))
    from mmrope_qwen_vl.examples import image_samples

    return dict(processor(**rng.choice(image_samples(processor, rng))))


def _video(name: str, rng: random.Random, generator: torch.Generator) -> dict[str, Any]:
    """A generated sample with one or two videos (and maybe an image): ids as the processor
    lays them out, random pixels of the grids' sizes."""
    from mmrope_qwen_vl.samples import random_batch

    processor = processor_of(name)
    batch: dict[str, Any] = {}
    while "video_grid_thw" not in batch:
        batch = random_batch(processor, rng, max_batch=1, max_images=1, max_videos=2, max_frames=3)
    valid = batch.pop("attention_mask")[0].bool()
    ids = batch.pop("input_ids")[0][valid][None]
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **batch,
              "mm_token_type_ids": torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))}
    for key, pixels in (("image_grid_thw", "pixel_values"), ("video_grid_thw", "pixel_values_videos")):
        if key in batch:
            sample[pixels] = torch.randn(int(batch[key].prod(-1).sum()), PATCH, generator=generator)
    return sample


def _audio_in_video(rng: random.Random, generator: torch.Generator) -> dict[str, Any]:
    """A generated Qwen2.5-Omni sample whose videos carry their audio (``use_audio_in_video``),
    with random mel features and pixels of the grids' sizes."""
    from mmrope_qwen3_omni.binding import token_ids
    from mmrope_qwen3_omni.families import family_of
    from mmrope_qwen3_omni.layout import tokens_of
    from mmrope_qwen3_omni.probe import random_batch

    processor = processor_of("Qwen2.5-Omni")
    thinker = tiny_model_config_for_positions()
    ids = token_ids(processor)
    tokens = tokens_of(thinker, {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]})
    words = processor.tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "on"])
    batch: dict[str, Any] = {"video_grid_thw": None}
    while batch["video_grid_thw"] is None:
        batch = random_batch(family_of(processor), tokens, 2, thinker, rng, use_audio_in_video=True, max_batch=1,
                             max_items=2, max_frames=3, text_ids=words, pad_id=processor.tokenizer.pad_token_id,
                             kinds=("video",))
    valid = batch["attention_mask"][0].bool()
    ids_row = batch["input_ids"][0][valid][None]
    frames = batch["audio_seqlens"]
    grids = batch["video_grid_thw"]
    return {
        "input_ids": ids_row,
        "attention_mask": torch.ones_like(ids_row),
        "video_grid_thw": grids,
        "video_second_per_grid": batch["second_per_grids"],
        "pixel_values_videos": torch.randn(int(grids.prod(-1).sum()), PATCH, generator=generator),
        "input_features": torch.randn(len(frames), 80, int(frames.max()), generator=generator),
        "feature_attention_mask": (torch.arange(int(frames.max()))[None] < frames[:, None]).long(),
    }


@functools.cache
def tiny_model_config_for_positions() -> Any:
    """The tiny thinker's config: its token ids and timing, which the generated samples follow."""
    return tiny_model("Qwen2.5-Omni").config
