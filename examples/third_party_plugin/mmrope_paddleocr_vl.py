"""mmrope plugin for PaddleOCR-VL. Its model places images as Qwen2-VL does, so the core's
batched kernel computes its positions (packed rows and the model's four-row layout included),
checked at bind time against PaddleOCR-VL's own ``get_rope_index``."""

from __future__ import annotations

from typing import Any

from mmrope_core import ExampleCase, RopeBinding, hookimpl

PROCESSOR_CLASSES = ("PaddleOCRVLProcessor",)


@hookimpl
def bind_rope_index(processor: Any, config: Any, options: Any) -> RopeBinding | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from transformers import AutoConfig
    from transformers.models.paddleocr_vl.modeling_paddleocr_vl import PaddleOCRVLModel

    from mmrope_core.mrope import MropeFamily, MropeKernel, bind_mrope
    from mmrope_core.reference import ReferenceKernel

    config = config if config is not None else AutoConfig.for_model("paddleocr_vl")
    family = MropeFamily("PaddleOCR-VL", spatial_merge_size=config.vision_config.spatial_merge_size,
                         image_token_id=processor.image_token_id, image_token=processor.image_token,
                         image_key="image_grid_thw")
    reference = ReferenceKernel(PaddleOCRVLModel, config, token_types=family.token_types(),
                                check=MropeKernel(family).check)
    return bind_mrope(family, reference, options)


@hookimpl
def get_rope_index_kwargs(processor: Any, multi_modal_inputs: Any) -> dict[str, Any] | None:
    if type(processor).__name__ not in PROCESSOR_CLASSES or "image_grid_thw" not in multi_modal_inputs:
        return None
    return {"image_grid_thw": multi_modal_inputs["image_grid_thw"]}


@hookimpl
def batch_layout(processor: Any) -> Any:
    if type(processor).__name__ not in PROCESSOR_CLASSES:
        return None
    from mmrope_core.batching import IMAGE_GRID, BatchLayout

    # read and checked by the engine as (N, 3) grids, one per image
    return BatchLayout(media={"image_grid_thw": IMAGE_GRID})


@hookimpl
def varlen_keys(processor: Any) -> set[str] | None:
    return {"mm_token_type_ids"} if type(processor).__name__ in PROCESSOR_CLASSES else None


@hookimpl
def example_cases() -> list[ExampleCase]:
    return [ExampleCase("PaddleOCR-VL", build, image_samples)]


# -- a tiny real processor, built offline, for `mmrope demo`, `mmrope check` and the tests --------

TOKENS = {"image_token": "<|IMAGE_PLACEHOLDER|>", "image_start_token": "<|IMAGE_START|>",
          "image_end_token": "<|IMAGE_END|>"}


def build() -> tuple[Any, Any]:
    """A real ``PaddleOCRVLProcessor`` with a word-level vocabulary, and the default config."""
    import transformers
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    processor = transformers.PaddleOCRVLProcessor(
        image_processor=PaddleOCRVLImageProcessorPil(min_pixels=56 * 56), tokenizer=word_level_tokenizer(TOKENS)
    )
    return processor, transformers.AutoConfig.for_model("paddleocr_vl")


def image_samples(processor: Any, rng: Any) -> list[dict[str, Any]]:
    """Two samples: two images and one, with text around them."""
    from mmrope_core.tiny import filler_text, random_image

    image = f"{TOKENS['image_start_token']}{processor.image_token}{TOKENS['image_end_token']}"
    samples = []
    for count in (2, 1):
        parts = [filler_text(rng, 3)] + [f"{image} {filler_text(rng, 2)}" for _ in range(count)]
        images = [random_image(rng, 28 * rng.randint(2, 4), 28 * rng.randint(2, 4)) for _ in range(count)]
        samples.append({"text": [" ".join(parts)], "images": images, "return_tensors": "pt"})
    return samples
