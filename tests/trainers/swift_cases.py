"""ms-swift's own templates on tiny real processors: encoded rows as its ``encode`` leaves them
(token ids, labels, the processor's media outputs, its own token types), its data collator, and
the transformers reference for what it builds."""

from __future__ import annotations

import functools
import importlib
import random
import types
from typing import Any

import cases
import torch

from mmrope_core.reference import config_only_model

#: family -> (ms-swift model type, ms-swift template, the mmrope test builder's name)
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


@functools.cache
def family(name: str) -> tuple[Any, Any]:
    """``(processor, config)``, the processor carrying what ms-swift's model loading attaches."""
    from swift.model.model_meta import ModelInfo
    from swift.model.register import MODEL_MAPPING

    if name == "GLM-4.5V":
        from mmrope_qwen_vl.examples import build

        processor, config = build("GLM-4V-MoE")
    else:
        processor, config = cases.build(name)
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

    processor, _ = family(name)
    _, template_type = FAMILIES[name]
    out = get_template(processor, template_type=template_type, padding_free=padding_free)
    out.set_mode("train")
    if model:
        out.model = reference_model(name)
    return out


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


def rows(name: str, rng: random.Random, count: int, *,
         use_audio_in_video: bool = False) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``count`` encoded rows and, for each, the keyword arguments of the model's own
    ``get_rope_index`` (besides ids and mask): real processor calls on images (and audio), and
    every other one a generated sample with videos (fractional timing, GLM's frames between
    video markers, audio in video when asked)."""
    builder = "GLM-4V" if name == "GLM-4.5V" else name
    out = []
    for trajectory in cases.trajectories(builder, rng, count, use_audio_in_video=use_audio_in_video):
        ids = trajectory.prompt + trajectory.response
        row: dict[str, Any] = {key: value for key, value in trajectory.multi_modal_inputs.items()
                               if key != "mm_token_type_ids"}
        row.update(input_ids=ids, labels=[-100] * len(trajectory.prompt) + trajectory.response, length=len(ids))
        if "feature_attention_mask" in row and "input_features" not in row:  # a generated sample's audio
            row.update(_audio_features(name, row["feature_attention_mask"]))
        for key in ("second_per_grid_ts", "video_second_per_grid"):  # ms-swift keeps video timings as lists
            if row.get(key) is not None:
                row[key] = torch.as_tensor(row[key]).tolist()
        out.append((row, trajectory.reference_kwargs))
    return out


def _audio_features(name: str, mask: torch.Tensor) -> dict[str, Any]:
    """What the processor returns for audio clips of these lengths: Qwen2.5-Omni's pads every
    clip to 30 s of frames, Qwen3-Omni's to the longest; the features' values place nothing."""
    frames = 3000 if name == "Qwen2.5-Omni" else mask.shape[-1]
    mask = torch.nn.functional.pad(mask, (0, frames - mask.shape[-1]))
    return {"feature_attention_mask": mask, "input_features": torch.zeros(mask.shape[0], 80, frames)}


def with_token_types(template: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The token types ms-swift's ``encode`` adds where the model's ``get_rope_index`` takes them."""
    if getattr(template, "requires_mm_token_type_ids", False):
        return {**row, "mm_token_type_ids": template.create_mm_token_type_ids(row["input_ids"])}
    return dict(row)


# -- the reference --------------------------------------------------------------------------------


def reference_positions(name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        kwargs: dict[str, Any]) -> torch.Tensor:
    """``(3, B, L)``: the model class's own ``get_rope_index``."""
    builder = "GLM-4V" if name == "GLM-4.5V" else name
    if name == "GLM-4.5V":  # the same rule as GLM-4.1V's, on the MoE model class
        processor, _ = family(name)
        model = reference_model(name).model
        kwargs = {key: kwargs.get(key) for key in ("image_grid_thw", "video_grid_thw")}
        import inspect

        if "mm_token_type_ids" in inspect.signature(model.get_rope_index).parameters:
            kwargs["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
        return model.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
    return cases.reference_rope_index(builder, input_ids, attention_mask, kwargs)[0]


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
