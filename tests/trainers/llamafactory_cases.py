"""LLaMA-Factory's own collators on tiny real processors: features as its dataset processors
make them (placeholders expanded by its own multimodal plugins), and the transformers reference
for the batches its collators build."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image

from mmrope_core.reference import config_only_model
from mmrope_core.tiny import FILLER_WORDS

#: family -> LLaMA-Factory's template for it
TEMPLATES = {
    "Qwen2-VL": "qwen2_vl", "Qwen2.5-VL": "qwen2_vl", "Qwen3-VL": "qwen3_vl", "Qwen3-VL-MoE": "qwen3_vl",
    "Qwen3.5": "qwen3_5", "GLM-4V": "glm4v", "GLM-4.5V": "glm4_5v", "Qwen2.5-Omni": "qwen2_omni",
    "Qwen3-Omni": "qwen3_omni",
}
FAMILIES = list(TEMPLATES)
OMNI = ("Qwen2.5-Omni", "Qwen3-Omni")
#: families whose layers carry state along a packed row (Qwen3.5's linear attention)
STATEFUL = ("Qwen3.5",)
#: families whose LLaMA-Factory plugin writes the first video's frame count for every video of a sample
ONE_FRAME_COUNT = ("Qwen3-VL", "Qwen3-VL-MoE", "Qwen3.5", "GLM-4V", "GLM-4.5V")
MODEL_CLASSES = {
    "qwen2_vl": "qwen2_vl.Qwen2VLModel",
    "qwen2_5_vl": "qwen2_5_vl.Qwen2_5_VLModel",
    "qwen3_vl": "qwen3_vl.Qwen3VLModel",
    "qwen3_vl_moe": "qwen3_vl_moe.Qwen3VLMoeModel",
    "qwen3_5": "qwen3_5.Qwen3_5Model",
    "glm4v": "glm4v.Glm4vModel",
    "glm4v_moe": "glm4v_moe.Glm4vMoeModel",
    "qwen2_5_omni_thinker": "qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniPreTrainedModelForConditionalGeneration",
    "qwen3_omni_moe_thinker":
        "qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoePreTrainedModelForConditionalGeneration",
}


_CONFIG_TOKENS = {
    "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>", "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>", "image_start_token_id": "<|begin_of_image|>",
    "image_end_token_id": "<|end_of_image|>", "video_start_token_id": "<|begin_of_video|>",
    "video_end_token_id": "<|end_of_video|>",
}
_GLM_TOKENS = {"image_token_id": "<|image|>", "video_token_id": "<|video|>"}


def import_llamafactory() -> Any:
    """LLaMA-Factory's collator module. Its multimodal plugins import torchaudio only to read
    and resample audio files; the registry's torchaudio build needs CUDA torch, so where it does
    not import, an empty module stands in (the tests pass audio as arrays at 16 kHz)."""
    import peft  # noqa: F401  (transformers and peft look for torchaudio when imported: not the stand-in)

    try:
        import torchaudio  # noqa: F401
    except (ImportError, OSError):
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    return importlib.import_module("llamafactory.data.collator")


@contextlib.contextmanager
def drop_in_installed() -> Iterator[None]:
    """The drop-in installed, LLaMA-Factory's own ``__call__`` given back after."""
    from mmrope_core.integrations import llamafactory as drop_in

    module = import_llamafactory()
    classes = (module.MultiModalDataCollatorForSeq2Seq, module.SFTDataCollatorWith4DAttentionMask)
    originals = [cls.__dict__["__call__"] for cls in classes]
    drop_in.install()
    try:
        yield
    finally:
        for cls, original in zip(classes, originals):
            cls.__call__ = original
        drop_in._settings.update(config=None, mm_processor_kwargs={}, convention=None)


@functools.cache
def family(name: str) -> tuple[Any, Any, Any]:
    """``(processor, config, template)``: the tiny processor with a video processor that needs
    no torchvision, the config LLaMA-Factory's model carries (the thinker's for Omni), and
    LLaMA-Factory's template."""
    from llamafactory.data.template import TEMPLATES as LF_TEMPLATES

    if name in OMNI:
        from mmrope_qwen3_omni.examples import build
    else:
        from mmrope_qwen_vl.examples import build
    processor, config = build({"GLM-4.5V": "GLM-4V-MoE"}.get(name, name))
    config = getattr(config, "thinker_config", config)
    if name not in OMNI:  # the config names the tiny vocabulary's ids, as a checkpoint's names its own
        token_id = processor.tokenizer.convert_tokens_to_ids
        for attribute, token in {**_CONFIG_TOKENS, **(_GLM_TOKENS if name.startswith("GLM") else {})}.items():
            if token in processor.tokenizer.get_vocab():
                setattr(config, attribute, token_id(token))
    processor.video_processor = FrameVideoProcessor(processor.image_processor)
    return processor, config, LF_TEMPLATES[TEMPLATES[name]]


class FrameVideoProcessor:
    """The family's video processor for videos given as frames, without torchvision: grids by
    the image processor's own resizing rule, one temporal patch per two frames, zero pixels, and
    the metadata and timestamps LLaMA-Factory's plugins read."""

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor
        self.patch_size = image_processor.patch_size
        self.temporal_patch_size = getattr(image_processor, "temporal_patch_size", 2)
        self.merge_size = image_processor.merge_size
        self.size = image_processor.size
        self.model_input_names = ["pixel_values_videos", "video_grid_thw"]  # the processor lists them

    def __call__(self, images: Any = None, videos: Any = None, video_metadata: Any = None,
                 return_metadata: bool = False, **kwargs: Any) -> Any:
        from transformers import BatchFeature
        from transformers.video_utils import VideoMetadata

        grids, timestamps = [], []
        for index, frames in enumerate(videos):
            count = len(frames) + len(frames) % self.temporal_patch_size
            spatial = self.image_processor(images=[frames[0]], return_tensors="pt")["image_grid_thw"][0, 1:]
            grids.append([count // self.temporal_patch_size, *spatial.tolist()])
            fps = (video_metadata[index].get("fps") if video_metadata else None) or 2.0
            timestamps.append([frame / fps for frame in range(0, count, self.temporal_patch_size)])
        grid = torch.tensor(grids)
        patch = 3 * self.temporal_patch_size * self.patch_size ** 2
        out: dict[str, Any] = {"pixel_values_videos": torch.zeros(int(grid.prod(-1).sum()), patch),
                               "video_grid_thw": grid, "timestamps": timestamps}
        if return_metadata:
            out["video_metadata"] = [VideoMetadata(total_num_frames=len(frames), fps=(meta or {}).get("fps", 2.0),
                                                   frames_indices=list(range(len(frames))))
                                     for frames, meta in zip(videos, video_metadata or [None] * len(videos))]
        return BatchFeature(out)


# -- features -----------------------------------------------------------------------------------


def features(name: str, rng: random.Random, count: int, *, videos: bool = True, audio_in_video: bool = False,
             text_only: bool = False, long: bool = False) -> list[dict[str, Any]]:
    """``count`` samples as LLaMA-Factory's supervised dataset processor leaves them: token ids
    with every placeholder expanded by LLaMA-Factory's own plugin, labels, and the media."""
    processor, _, template = family(name)
    out = []
    for _ in range(count):
        parts, images, clips, audios = [], [], [], []
        frames = rng.randint(1, 5)  # Qwen3-VL's and GLM-4V's plugins expand every video as the first
        for _ in range(0 if text_only else rng.randint(0, 3)):
            kind = rng.choice(["image", "video", "audio"] if name in OMNI and not audio_in_video else
                              ["image", "video"] if videos else ["image"])
            if audio_in_video:
                kind = "video"
            parts.append(_filler(rng, rng.randint(0, 4)))
            if kind == "image":
                images.append(_image(rng))
                parts.append("<image>")
            elif kind == "video":
                clips.append([_image(rng, rng.randint(1, 2))] * (frames if name in ONE_FRAME_COUNT else rng.randint(1, 5)))
                parts.append("<video><audio>" if audio_in_video else "<video>")
                if audio_in_video:
                    audios.append(_audio(rng))
            else:
                audios.append(_audio(rng))
                parts.append("<audio>")
        parts.append(_filler(rng, rng.randint(1, 60 if long else 6)))
        if long:
            parts.insert(0, _filler(rng, 300))  # past 256: what a bf16 position cannot hold
        messages = [{"role": "user", "content": " ".join(parts)}]
        messages = template.mm_plugin.process_messages(messages, images, clips, audios, processor)
        ids = processor.tokenizer.encode(messages[0]["content"], add_special_tokens=False)
        ids, _ = template.mm_plugin.process_token_ids(ids, None, images, clips, audios, processor.tokenizer, processor)
        out.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids), "images": images,
                    "videos": clips, "audios": audios})
    return out


def packed(rows: list[list[dict[str, Any]]], cutoff_len: int) -> list[dict[str, Any]]:
    """Samples packed as LLaMA-Factory's packed supervised processor packs them with
    ``neat_packing``: one row per group, the attention mask numbering each sample from 1, padded
    to ``cutoff_len + 1`` with a last sub-sequence of padding, and the packing parameters."""
    out = []
    for group in rows:
        ids, mask, labels, images, videos, audios = [], [], [], [], [], []
        bounds, image_ids, video_ids, audio_ids = [0], [], [], []
        for index, sample in enumerate(group):
            ids += sample["input_ids"]
            mask += [index + 1] * len(sample["input_ids"])
            labels += sample["labels"]
            images += sample["images"]
            videos += sample["videos"]
            audios += sample["audios"]
            image_ids += [index] * len(sample["images"])
            video_ids += [index] * len(sample["videos"])
            audio_ids += [index] * len(sample["audios"])
            bounds.append(len(ids))
        pad = cutoff_len + 1 - len(ids)
        assert pad >= 0, "cutoff_len too small for the group"
        ids += [0] * pad
        mask += [0] * pad
        labels += [-100] * pad
        bounds.append(len(ids))
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels, "images": images, "videos": videos,
                    "audios": audios, "packing_params": {
                        "sequence_boundaries": bounds, "image_subseq_ids": image_ids or [2 ** 31 - 1],
                        "video_subseq_ids": video_ids or [2 ** 31 - 1], "audio_subseq_ids": audio_ids or [2 ** 31 - 1]}})
    return out


def _filler(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


def _image(rng: random.Random, scale: int = 2) -> Any:
    size = (28 * rng.randint(1, 3) * scale, 28 * rng.randint(1, 3) * scale)
    return Image.fromarray(np.full((*size[::-1], 3), rng.randint(0, 255), dtype=np.uint8))


def _audio(rng: random.Random) -> Any:
    return np.sin(np.arange(int(16000 * rng.uniform(0.3, 3))) / rng.uniform(5, 40)).astype(np.float32)


# -- the collators ------------------------------------------------------------------------------


def collator(name: str, *, model: str = "reference", **kwargs: Any) -> Any:
    """LLaMA-Factory's SFT collator for family ``name``. ``model``: ``"reference"`` a stand-in
    model carrying the config and the model class's own ``get_rope_index`` (what LLaMA-Factory
    needs), ``"config"`` one carrying only the config, ``"none"`` no model."""
    module = import_llamafactory()
    processor, config, template = family(name)
    stand_in = {"reference": lambda: reference_model(name), "config": lambda: types.SimpleNamespace(config=config),
                "none": lambda: None}[model]()
    return module.SFTDataCollatorWith4DAttentionMask(
        template=template, processor=processor, tokenizer=processor.tokenizer, model=stand_in,
        label_pad_token_id=-100, **kwargs)


def collate(collator: Any, features: list[dict[str, Any]]) -> Any:
    return collator(copy.deepcopy(features))


def reference_model(name: str) -> Any:
    _, config, _ = family(name)
    path, attribute = MODEL_CLASSES[config.model_type].rsplit(".", 1)
    model_class = getattr(importlib.import_module(f"transformers.models.{path}"), attribute)
    extra = {"spatial_merge_size": config.vision_config.spatial_merge_size} if name in OMNI else {}
    return config_only_model(model_class, config, **extra)


# -- the reference ------------------------------------------------------------------------------


def reference_positions(name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, media: dict[str, Any],
                        *, use_audio_in_video: bool = False) -> torch.Tensor:
    """``(4, B, L)``: the model class's own ``get_rope_index`` on one batch, under the text row
    counting valid tokens (1 at padding)."""
    processor, _, _ = family(name)
    model = reference_model(name)
    mask = (attention_mask != 0).long()
    kwargs: dict[str, Any] = {key: media.get(key) for key in ("image_grid_thw", "video_grid_thw")}
    if media.get("second_per_grid_ts") is not None:
        kwargs["second_per_grid_ts"] = torch.as_tensor(media["second_per_grid_ts"])
    if name in OMNI:
        audio_mask = media.get("feature_attention_mask")
        kwargs.update(audio_seqlens=None if audio_mask is None else audio_mask.sum(-1),
                      second_per_grids=media.get("video_second_per_grid"), use_audio_in_video=use_audio_in_video)
    import inspect

    if "mm_token_type_ids" in inspect.signature(model.get_rope_index).parameters:
        kwargs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
    positions, _ = model.get_rope_index(input_ids=input_ids, attention_mask=mask, **kwargs)
    text = torch.ones_like(mask)
    text[mask.bool()] = (torch.cumsum(mask, -1) - 1)[mask.bool()]
    return torch.cat([text.to(positions.dtype)[None], positions])


def media_of(batch: Any, features: list[dict[str, Any]]) -> dict[str, Any]:
    """The media inputs of a collated batch, less the fake image or audio LLaMA-Factory adds to
    batches without any."""
    media = {key: batch.get(key) for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts",
                                             "feature_attention_mask", "video_second_per_grid")}
    if not any(f["images"] for f in features) and not any(f["videos"] for f in features):
        media["image_grid_thw"] = None
    if not any(f["audios"] for f in features):
        media["feature_attention_mask"] = None
    return media


def segment_media(media: dict[str, Any], group: list[dict[str, Any]], index: int) -> dict[str, Any]:
    """Sample ``index`` of a packed group's share of the media inputs."""
    out = {}
    for key, counts in (("image_grid_thw", "images"), ("video_grid_thw", "videos"), ("second_per_grid_ts", "videos"),
                        ("video_second_per_grid", "videos"), ("feature_attention_mask", "audios")):
        if media.get(key) is None:
            out[key] = None
            continue
        start = sum(len(sample[counts]) for sample in group[:index])
        value = media[key][start:start + len(group[index][counts])]
        out[key] = value if len(value) else None
    return out
