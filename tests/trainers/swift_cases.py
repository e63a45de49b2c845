"""ms-swift's own templates on tiny real processors: rows from its own ``encode`` (images, audio
clips), rows with videos laid out as ``encode`` lays them out, its data collator, and the
transformers reference for what it builds."""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import random
import types
from typing import Any

import cases
import numpy as np
import torch

from mmrope_core.reference import config_only_model
from mmrope_core.tiny import filler_text, random_image

#: family -> (ms-swift model type, ms-swift template)
FAMILIES = {
    "Qwen2-VL": ("qwen2_vl", "qwen2_vl"),
    "Qwen2.5-VL": ("qwen2_5_vl", "qwen2_5_vl"),
    "Qwen3-VL": ("qwen3_vl", "qwen3_vl"),
    "Qwen3.5": ("qwen3_5", "qwen3_5"),
    "GLM-4V": ("glm4v", "glm4v"),
    "GLM-4.5V": ("glm4v_moe", "glm4_5v"),
    "Qwen2.5-Omni": ("qwen2_5_omni", "qwen2_5_omni"),
    "Qwen3-Omni": ("qwen3_omni_moe", "qwen3_omni"),
}
OMNI = ("Qwen2.5-Omni", "Qwen3-Omni")
GLM = ("GLM-4V", "GLM-4.5V")
MODEL_CLASSES = {**cases.MODEL_CLASSES, "glm4v_moe": "glm4v_moe.Glm4vMoeModel"}
#: the token ids ms-swift's templates hard-code for the real checkpoints' vocabularies
TEMPLATE_TOKENS = {
    "image_token_id": "image_token", "video_token_id": "video_token",
    "begin_of_image_token": "<|begin_of_image|>", "end_of_image_token": "<|end_of_image|>",
    "begin_of_video_token": "<|begin_of_video|>", "end_of_video_token": "<|end_of_video|>",
}


@functools.cache
def family(name: str) -> tuple[Any, Any]:
    """``(processor, config)``: a tiny processor of this module's own, carrying what ms-swift's
    model loading attaches."""
    from swift.model.model_meta import ModelInfo
    from swift.model.register import MODEL_MAPPING

    if name in OMNI:
        from mmrope_qwen3_omni.examples import build
    else:
        from mmrope_qwen_vl.examples import build
    processor, config = build("GLM-4V-MoE" if name == "GLM-4.5V" else name)
    if name == "GLM-4.5V":  # its template splits the processor's placeholder expansions at newlines
        processor.tokenizer.add_tokens(["\n"], special_tokens=True)
    model_type, _ = FAMILIES[name]
    processor.model_info = ModelInfo(model_type=model_type, model_dir=f"/tiny/{model_type}", torch_dtype=torch.float32,
                                     max_model_len=4096, quant_method=None, quant_bits=0, is_multimodal=True,
                                     config=config, task_type="causal_lm")
    processor.model_meta = MODEL_MAPPING[model_type]
    return processor, config


def template(name: str, *, padding_free: bool = False, model: bool = True) -> Any:
    """ms-swift's template for family ``name`` in training mode. ``model``: give it a stand-in
    model carrying the model class's own ``get_rope_index`` (what ms-swift alone calls);
    without one ms-swift builds a model from the checkpoint."""
    from swift.template import get_template

    import_media_utils()
    processor, _ = family(name)
    _, template_type = FAMILIES[name]
    out = get_template(processor, template_type=template_type, padding_free=padding_free)
    out.set_mode("train")
    for attribute, token in TEMPLATE_TOKENS.items():  # the tiny vocabulary's ids, as a checkpoint's agree
        if hasattr(type(out), attribute):
            setattr(out, attribute, processor.tokenizer.convert_tokens_to_ids(getattr(processor, token, token)))
    if model:
        out.model = reference_model(name)
    return out


def import_media_utils() -> None:
    """The Qwen helpers ms-swift's Qwen templates load images (and videos) with. Both import
    torchvision at the top, which the CPU torch here cannot import; their image path uses only
    Pillow, their video path torchvision's resize."""
    for module in ("qwen_vl_utils", "qwen_omni_utils"):
        cases.import_without_torchvision(module, ("torchvision", "torchvision.transforms"))


def reference_model(name: str) -> Any:
    _, config = family(name)
    if name in OMNI:
        thinker = config.thinker_config
        model = _config_only(thinker.model_type, thinker, spatial_merge_size=thinker.vision_config.spatial_merge_size)
        return types.SimpleNamespace(thinker=model, config=config)
    if name in GLM:  # ms-swift reads GLM's get_rope_index from the inner model
        return types.SimpleNamespace(model=_config_only(config.model_type, config), config=config)
    return _config_only(config.model_type, config)


def _config_only(model_type: str, config: Any, **attributes: Any) -> Any:
    model_type = {"qwen2_5_omni_thinker": "qwen2_5_omni", "qwen3_omni_moe_thinker": "qwen3_omni_moe"}.get(
        model_type, model_type)
    path, attribute = MODEL_CLASSES[model_type].rsplit(".", 1)
    model_class = getattr(importlib.import_module(f"transformers.models.{path}"), attribute)
    return config_only_model(model_class, config, **attributes)


# -- rows -----------------------------------------------------------------------------------------


def rows(name: str, template: Any, rng: random.Random, count: int, *,
         use_audio_in_video: bool = False) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` rows as ms-swift's dataset hands them to ``template``'s collator and, for each,
    the keyword arguments of the model's own ``get_rope_index`` (besides ids and mask): every
    other one from ms-swift's own ``encode`` of a conversation with images (and audio clips),
    the rest with videos (audio in video when asked)."""
    return [_video_row(name, template, rng, use_audio_in_video) if use_audio_in_video or index % 2
            else _encoded_row(name, template, rng) for index in range(count)]


def _encoded_row(name: str, template: Any, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    parts, images, audios = [], [], []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["image", "audio"]) if name in OMNI else "image"
        parts += [filler_text(rng, rng.randint(0, 4)), f"<{kind}>"]
        if kind == "image":
            images.append(random_image(rng, 28 * rng.randint(2, 4), 28 * rng.randint(2, 4)))
        else:
            audios.append(_wav(rng))
    parts.append(filler_text(rng, rng.randint(1, 6)))
    messages = [{"role": "user", "content": " ".join(parts)},
                {"role": "assistant", "content": filler_text(rng, rng.randint(1, 12))}]
    row = template.encode({"messages": messages, "images": images, "audios": audios}, return_length=True)
    kwargs = {"image_grid_thw": row.get("image_grid_thw")}
    if "feature_attention_mask" in row:
        kwargs["audio_seqlens"] = row["feature_attention_mask"].sum(-1)
    return row, kwargs


def _wav(rng: random.Random) -> io.BytesIO:
    """A 16 kHz WAV file of 0.3 to 3 seconds, as a dataset's audio column holds one."""
    import soundfile

    out = io.BytesIO()
    samples = np.arange(int(16000 * rng.uniform(0.3, 3)))
    soundfile.write(out, np.sin(samples / rng.uniform(5, 40)).astype(np.float32), 16000, format="WAV")
    out.seek(0)
    return out


def _video_row(name: str, template: Any, rng: random.Random,
               use_audio_in_video: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A row with videos as ``encode`` lays it out, built from grids: ms-swift's own video path
    cannot run here (its Qwen templates resize frames with torchvision, and transformers 5.10's
    video processors need it; its GLM-4.1V template refuses videos when it encodes)."""
    builder = "GLM-4V" if name == "GLM-4.5V" else name  # the same vocabulary
    processor, _ = cases.build(builder)
    if name in OMNI:
        prompt, inputs, kwargs = cases._generated_omni(name, rng, use_audio_in_video)
    else:
        prompt, inputs, kwargs = cases._generated_vl(builder, rng)
    response = cases._response(processor, rng)
    row: dict[str, Any] = {key: value for key, value in inputs.items() if key != "mm_token_type_ids"}
    row.update(input_ids=prompt + response, labels=[-100] * len(prompt) + response, length=len(prompt + response))
    if "feature_attention_mask" in row:
        row.update(_audio_features(name, row["feature_attention_mask"]))
    for key in ("second_per_grid_ts", "video_second_per_grid"):  # ms-swift keeps video timings as lists
        if row.get(key) is not None:
            row[key] = torch.as_tensor(row[key]).tolist()
    if getattr(template, "requires_mm_token_type_ids", False):  # what encode adds for these models
        row["mm_token_type_ids"] = template.create_mm_token_type_ids(row["input_ids"])
    if name == "GLM-4.5V":
        row["mm_token_type_ids"] = _glm_video_token_types(prompt)
    return row, kwargs


def _glm_video_token_types(ids: list[int]) -> torch.Tensor:
    """``(1, N)``: what GLM-4.5V's ``encode`` keeps as ``mm_token_type_ids``, its processor's
    token types for the videos' placeholder expansions alone, joined by newlines (the processor
    call it makes for the videos, which replaces the one it makes for the images)."""
    processor, _ = family("GLM-4.5V")
    start, end, newline = processor.tokenizer.convert_tokens_to_ids(["<|begin_of_video|>", "<|end_of_video|>", "\n"])
    starts = [index for index, token in enumerate(ids) if token == start]
    ends = [index for index, token in enumerate(ids) if token == end]
    joined = [token for first, last in zip(starts, ends) for token in [newline, *ids[first:last + 1]]][1:]
    return torch.tensor(processor.create_mm_token_type_ids([joined]))


def _audio_features(name: str, mask: torch.Tensor) -> dict[str, Any]:
    """What the processor returns for audio clips of these lengths: Qwen2.5-Omni's pads every
    clip to 30 s of frames, Qwen3-Omni's to the longest; the features' values place nothing."""
    frames = 3000 if name == "Qwen2.5-Omni" else mask.shape[-1]
    mask = torch.nn.functional.pad(mask, (0, frames - mask.shape[-1]))
    return {"feature_attention_mask": mask, "input_features": torch.zeros(mask.shape[0], 80, frames)}


# -- the reference --------------------------------------------------------------------------------


def reference_positions(name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        kwargs: dict[str, Any]) -> torch.Tensor:
    """``(3, B, L)``: the model class's own ``get_rope_index``, token types the processor's own."""
    processor, _ = family(name)
    model = reference_model(name)
    model = model.thinker if name in OMNI else model.model if name in GLM else model
    accepted = inspect.signature(model.get_rope_index).parameters
    arguments = {key: value for key, value in kwargs.items() if key in accepted}
    if "mm_token_type_ids" in accepted:
        arguments["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
    return model.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **arguments)[0]


def stacked_kwargs(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference keyword arguments of several samples, for one batch."""
    out: dict[str, Any] = {}
    for key in {key for sample in samples for key in sample}:
        values = [sample[key] for sample in samples if sample.get(key) is not None]
        if key == "use_audio_in_video":
            out[key] = any(values)
        elif values:
            out[key] = torch.cat([torch.as_tensor(value) for value in values])
    return out
