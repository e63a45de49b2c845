"""mmrope plugin for PaddleOCR-VL (images only; Qwen2-VL's position rule), built from mmrope's
public building blocks: the batched kernel, the placeholder checks and the reference binder."""

from __future__ import annotations

import functools
from typing import Any

from mmrope_core import ExampleCase, InvalidInputError, RopeBinding, hookimpl
from mmrope_core.recognition import class_name_in

PROCESSOR_CLASSES = ("PaddleOCRVLProcessor",)


def _handles(processor: Any) -> bool:
    return class_name_in(processor, PROCESSOR_CLASSES) is not None


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any):
    if not _handles(processor):
        return None
    from mmrope_core.mrope import TokenTypeMap

    config = config if config is not None else _default_config(processor)
    impl = options.get("impl", "fast")
    rope = {"fast": FastRopeIndex, "reference": ReferenceRopeIndex}.get(impl)
    if rope is None:
        raise InvalidInputError(f"impl={impl!r} is not an implementation of PaddleOCR-VL; use 'fast' or 'reference'")
    return RopeBinding("mrope", rope(config, processor.image_token), TokenTypeMap({processor.image_token_id: 1}),
                       impl, description="PaddleOCR-VL")


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any):
    if not _handles(processor):
        return None
    grids = multi_modal_inputs.get("image_grid_thw")
    return {} if grids is None else {"image_grid_thw": grids}


@hookimpl
def varlen_keys(processor: Any):
    return {"mm_token_type_ids"} if _handles(processor) else None


@hookimpl
def example_cases():
    return [ExampleCase("PaddleOCR-VL", build, image_samples)]


class FastRopeIndex:
    def __init__(self, config: Any, image_token: str) -> None:
        from mmrope_core.mrope import MediaKind

        self.merge = config.vision_config.spatial_merge_size
        self.kinds = (MediaKind(1, "image", image_token, "image_grid_thw"),)

    def __call__(self, input_ids, attention_mask=None, *, mm_token_type_ids, image_grid_thw=None, **ignored):
        from mmrope_core.mrope import MediaGrids, mrope_positions

        grids = {1: MediaGrids(image_grid_thw) if image_grid_thw is not None else None}
        mask = attention_mask.bool() if attention_mask is not None else None
        return mrope_positions(mm_token_type_ids, mask, self.kinds, grids, spatial_merge_size=self.merge,
                               out_dtype=input_ids.dtype)


class ReferenceRopeIndex(FastRopeIndex):
    def __init__(self, config: Any, image_token: str) -> None:
        from transformers.models.paddleocr_vl.modeling_paddleocr_vl import PaddleOCRVLModel

        from mmrope_core.reference import config_only_model

        super().__init__(config, image_token)
        self.model = config_only_model(PaddleOCRVLModel, config)

    def __call__(self, input_ids, attention_mask=None, *, mm_token_type_ids, image_grid_thw=None, **ignored):
        from mmrope_core.mrope import MediaGrids, check_placeholders

        mask = attention_mask.bool() if attention_mask is not None else None
        grids = {1: MediaGrids(image_grid_thw) if image_grid_thw is not None else None}
        check_placeholders(mm_token_type_ids, mask, self.kinds, grids, spatial_merge_size=self.merge)
        return self.model.get_rope_index(input_ids=input_ids, mm_token_type_ids=mm_token_type_ids,
                                         image_grid_thw=image_grid_thw, attention_mask=mask)


def _default_config(processor: Any) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model("paddleocr_vl")
    config.vision_config.spatial_merge_size = processor.image_processor.merge_size
    return config


@functools.cache
def _tokens() -> dict[str, str]:
    return {"image_token": "<|IMAGE_PLACEHOLDER|>", "image_start_token": "<|IMAGE_START|>",
            "image_end_token": "<|IMAGE_END|>"}


def build() -> tuple[Any, Any]:
    """A real ``PaddleOCRVLProcessor`` with a word-level vocabulary, and the default config."""
    import transformers
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    processor = transformers.PaddleOCRVLProcessor(
        image_processor=PaddleOCRVLImageProcessorPil(min_pixels=56 * 56), tokenizer=word_level_tokenizer(_tokens())
    )
    return processor, transformers.AutoConfig.for_model("paddleocr_vl")


def image_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Two samples: two images and one, with text around them."""
    from mmrope_core.tiny import filler_text, random_image

    tokens = _tokens()
    image = f"{tokens['image_start_token']}{processor.image_token}{tokens['image_end_token']}"
    samples = []
    for count in (2, 1):
        parts = [filler_text(rng, 3)] + [f"{image} {filler_text(rng, 2)}" for _ in range(count)]
        images = [random_image(rng, 28 * rng.randint(2, 4), 28 * rng.randint(2, 4)) for _ in range(count)]
        samples.append({"text": [" ".join(parts)], "images": images, "return_tensors": "pt"})
    return samples
