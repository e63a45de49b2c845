"""Every family mmrope handles, as tiny real processors, and single-sample trajectories laid out as
verl lays them out, each with the arguments of the model's own ``get_rope_index``."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import random
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import transformers

from mmrope_core.reference import config_only_model
from mmrope_core.tiny import FILLER_WORDS, processors_without_torchvision, word_level_tokenizer

QWEN_VL = ["Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3.5", "GLM-4V", "GLM-4.6V"]
OMNI = ["Qwen3-Omni", "Qwen2.5-Omni"]
FAMILIES = [*QWEN_VL, "PaddleOCR-VL", *OMNI, "Gemma4"]
GLM = ("GLM-4V", "GLM-4.6V")

# config model_type -> the model class whose get_rope_index is the reference
MODEL_CLASSES = {
    "qwen2_vl": "qwen2_vl.Qwen2VLModel",
    "qwen2_5_vl": "qwen2_5_vl.Qwen2_5_VLModel",
    "qwen3_vl": "qwen3_vl.Qwen3VLModel",
    "qwen3_5": "qwen3_5.Qwen3_5Model",
    "glm4v": "glm4v.Glm4vModel",
    "glm46v": "glm46v.Glm46VModel",
    "paddleocr_vl": "paddleocr_vl.PaddleOCRVLModel",
    "qwen3_omni_moe": "qwen3_omni_moe.modeling_qwen3_omni_moe.Qwen3OmniMoePreTrainedModelForConditionalGeneration",
    "qwen2_5_omni": "qwen2_5_omni.modeling_qwen2_5_omni.Qwen2_5OmniPreTrainedModelForConditionalGeneration",
}


@functools.cache
def build(name: str) -> tuple[Any, Any]:
    """``(processor, config)`` of family ``name``, built offline (the config names one architecture,
    as verl's model config asserts)."""
    if name in OMNI:
        from mmrope_qwen3_omni.examples import build as omni

        processor, config = omni(name)
    elif name == "GLM-4.6V":
        from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil

        from mmrope_qwen_vl.examples import GLM_TOKENS

        with processors_without_torchvision() as video_processor:
            processor = transformers.Glm46VProcessor(image_processor=Glm46VImageProcessorPil(),
                                                     tokenizer=word_level_tokenizer(GLM_TOKENS),
                                                     video_processor=video_processor)
        config = transformers.AutoConfig.for_model("glm46v")
    elif name == "PaddleOCR-VL":
        from mmrope_paddleocr_vl import build as paddle

        processor, config = paddle()
    elif name == "Gemma4":
        from mmrope_gemma4.examples import build as gemma4

        import_gemma4_processor()
        processor, config = gemma4()
    else:
        from mmrope_qwen_vl.examples import build as qwen_vl

        processor, config = qwen_vl(name)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForConditionalGeneration"]
    return processor, config


def save(name: str, directory: Any) -> str:
    processor, config = build(name)
    processor.save_pretrained(directory)
    config.save_pretrained(directory)
    return str(directory)


@contextlib.contextmanager
def loading_without_torchvision() -> Iterator[None]:
    """Let ``AutoProcessor.from_pretrained`` load these processors on a machine without
    torchvision: transformers 5.10 resolves the base video processor class and
    ``AutoImageProcessor`` to placeholders that require it."""
    import transformers.processing_utils as processing_utils
    from transformers.models.auto.image_processing_auto import AutoImageProcessor

    module = processing_utils.transformers_module
    placeholder = module.AutoImageProcessor
    with processors_without_torchvision():
        module.AutoImageProcessor = AutoImageProcessor
        try:
            yield
        finally:
            module.AutoImageProcessor = placeholder


def import_gemma4_processor() -> None:
    """transformers 5.10's Gemma4 processor module imports its torchvision image processor at the
    top, for two functions that do not use torchvision (only the Pillow image processor is used
    here)."""
    import_without_torchvision("transformers.models.gemma4.processing_gemma4", (
        "torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional"))


def import_without_torchvision(module: str, stand_ins: tuple[str, ...]) -> None:
    """Import ``module``, which imports torchvision at the top for code these tests never run,
    once against empty stand-ins for the modules ``stand_ins`` names, then take them away. Every
    name read from a stand-in is an empty class: code that does use torchvision fails on it."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available() or module in sys.modules:
        importlib.import_module(module)
        return

    def missing(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})  # also serves annotations in class bodies

    modules = {name: types.ModuleType(name) for name in stand_ins}
    for name, stand_in in modules.items():
        stand_in.__getattr__ = missing  # type: ignore[method-assign]
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, stand_in)
    sys.modules.update(modules)
    try:
        importlib.import_module(module)
    finally:
        for name in stand_ins:
            del sys.modules[name]


# -- trajectories ------------------------------------------------------------------------------


@dataclasses.dataclass
class Trajectory:
    """One sample: prompt and response token ids, the processor outputs verl keeps for it, and
    the keyword arguments of the model's own get_rope_index (besides ids and mask)."""

    kind: str
    prompt: list[int]
    response: list[int]
    multi_modal_inputs: dict[str, Any]
    reference_kwargs: dict[str, Any]

    @property
    def has_video(self) -> bool:
        return self.reference_kwargs.get("video_grid_thw") is not None

    def verl_layout(self, rng: random.Random, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, P + R)`` ids and mask: the prompt left-padded, the response right-padded."""
        left, right = rng.randint(0, 8), rng.randint(0, 8)
        ids = [pad_token_id] * left + self.prompt + self.response + [pad_token_id] * right
        mask = [0] * left + [1] * (len(self.prompt) + len(self.response)) + [0] * right
        return torch.tensor([ids]), torch.tensor([mask])

    def inputs(self) -> dict[str, Any]:
        """A fresh copy of the processor outputs: verl pops keys from the dict it is given."""
        return dict(self.multi_modal_inputs)


def trajectories(name: str, rng: random.Random, count: int, *, use_audio_in_video: bool = False) -> list[Trajectory]:
    """``count`` trajectories of family ``name``: real processor calls on images (and audio), and
    for the Qwen-VL and Omni families generated samples with videos (fractional timing, GLM's
    frames between video markers, audio in video when asked)."""
    processor, _ = build(name)
    out = []
    for index in range(count):
        if use_audio_in_video or (index % 2 and name in [*QWEN_VL, *OMNI]):
            prompt, inputs, kwargs = (_generated_omni(name, rng, use_audio_in_video) if name in OMNI
                                      else _generated_vl(name, rng))
            kind = "generated"
        else:
            prompt, inputs, kwargs = _processed(name, rng)
            kind = "processed"
        out.append(Trajectory(kind, prompt, _response(processor, rng), inputs, kwargs))
    return out


def _response(processor: Any, rng: random.Random) -> list[int]:
    words = processor.tokenizer.convert_tokens_to_ids(list(FILLER_WORDS))
    return [rng.choice(words) for _ in range(rng.randint(1, 12))]


def _processed(name: str, rng: random.Random) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    processor, _ = build(name)
    sample = rng.choice(_samples(name)(processor, rng))
    output = dict(processor(**sample))
    prompt = output.pop("input_ids")[0].tolist()
    output.pop("attention_mask")
    kwargs = {key: output.get(key) for key in ("image_grid_thw", "video_grid_thw")}
    if name in OMNI:
        mask = output.get("feature_attention_mask")
        kwargs["audio_seqlens"] = None if mask is None else mask.sum(-1)
    return prompt, output, kwargs


def _samples(name: str) -> Any:
    if name in OMNI:
        from mmrope_qwen3_omni.examples import audio_and_image_samples

        return audio_and_image_samples
    if name == "PaddleOCR-VL":
        from mmrope_paddleocr_vl import image_samples

        return image_samples
    if name == "Gemma4":
        from mmrope_gemma4.examples import image_samples

        return image_samples
    from mmrope_qwen_vl.examples import image_samples

    return image_samples


def _generated_vl(name: str, rng: random.Random) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    from mmrope_qwen_vl.samples import random_batch

    processor, _ = build(name)
    batch = random_batch(processor, rng, max_batch=1, max_images=3, max_videos=2, max_frames=4)
    while "video_grid_thw" not in batch:  # these samples are the ones with videos
        batch = random_batch(processor, rng, max_batch=1, max_images=3, max_videos=2, max_frames=4)
    prompt = batch.pop("input_ids")[0].tolist()
    del batch["attention_mask"]
    inputs = {**batch, "mm_token_type_ids": torch.tensor(processor.create_mm_token_type_ids([prompt]))}
    kwargs = {key: batch.get(key) for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")}
    return prompt, inputs, kwargs


def _generated_omni(name: str, rng: random.Random, use_audio_in_video: bool) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    from mmrope_qwen3_omni.binding import token_ids
    from mmrope_qwen3_omni.families import family_of
    from mmrope_qwen3_omni.layout import tokens_of
    from mmrope_qwen3_omni.probe import random_batch

    processor, config = build(name)
    thinker = config.thinker_config
    ids = token_ids(processor)
    tokens = tokens_of(thinker, {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]})
    words = processor.tokenizer.convert_tokens_to_ids(list(FILLER_WORDS))
    kinds = ("video",) if use_audio_in_video else ("image", "audio", "video", "video")
    batch: dict[str, Any] = {"video_grid_thw": None}
    while batch["video_grid_thw"] is None:  # these samples are the ones with videos
        batch = random_batch(family_of(processor), tokens, thinker.vision_config.spatial_merge_size, thinker, rng,
                             use_audio_in_video=use_audio_in_video, max_batch=1, max_items=3, max_frames=4,
                             text_ids=words, pad_id=processor.tokenizer.pad_token_id, kinds=kinds)
    prompt = batch.pop("input_ids")[0][batch.pop("attention_mask")[0].bool()].tolist()
    inputs = {key: batch[key] for key in ("image_grid_thw", "video_grid_thw") if batch[key] is not None}
    if batch["second_per_grids"] is not None:
        inputs["video_second_per_grid"] = batch["second_per_grids"]
    frames = batch["audio_seqlens"]
    if frames is not None:  # what the processor returns for these audio lengths
        inputs["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).long()
    return prompt, inputs, batch


# -- the reference -----------------------------------------------------------------------------


def reference_rope_index(name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The model class's own get_rope_index on a config-only stand-in; token types are the
    processor's own (``create_mm_token_type_ids``)."""
    processor, config = build(name)
    if name in OMNI:
        thinker = config.thinker_config
        model = config_only_model(reference_model_class(config.model_type), thinker,
                                  spatial_merge_size=thinker.vision_config.spatial_merge_size)
    else:
        model = config_only_model(reference_model_class(config.model_type), config)
    accepted = inspect.signature(model.get_rope_index).parameters
    arguments = {key: value for key, value in kwargs.items() if key in accepted}
    if "mm_token_type_ids" in accepted:
        arguments["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(input_ids.tolist()))
    return model.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **arguments)


def reference_verl_positions(name: str, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             kwargs: dict[str, Any]) -> torch.Tensor:
    """What verl's ``_compute_position_ids`` must return: ``(1, 4, L)``, a text row over the valid
    tokens (1 at padding) above the model's own ``(t, h, w)``; ``(1, L)`` for 1-D families."""
    valid = attention_mask[0].bool()
    if name == "Gemma4":
        return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    positions, _ = reference_rope_index(name, input_ids, attention_mask, kwargs)
    text = torch.ones(1, 1, input_ids.shape[1], dtype=torch.long)
    text[0, 0, valid] = torch.arange(int(valid.sum()))
    return torch.cat([text, positions.transpose(0, 1)], dim=1)


def reference_model_class(model_type: str) -> type:
    """The transformers model class whose get_rope_index is the reference for ``model_type``."""
    path, name = MODEL_CLASSES[model_type].rsplit(".", 1)
    return getattr(importlib.import_module(f"transformers.models.{path}"), name)


@functools.cache
def tiny_model(name: str = "Qwen2.5-VL") -> Any:
    """A randomly initialised two-layer Qwen2.5-VL model whose token ids are the tiny processor's."""
    processor, _ = build(name)
    tokenizer = processor.tokenizer
    config = transformers.Qwen2_5_VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": len(tokenizer), "max_position_embeddings": 512,
                     "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
                       "fullatt_block_indexes": [0]},
        image_token_id=processor.image_token_id, video_token_id=processor.video_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    )
    torch.manual_seed(0)
    return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
