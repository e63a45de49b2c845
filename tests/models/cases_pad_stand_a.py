"""More model types for the model-level collator tests (see test_padded_batches.py), built with
their real processor classes and tokenizers, and a stand-in image processor where the real one
needs torchvision, which the tests run without.

Each stand-in below (a Pillow/numpy ``PilBackend``, or Molmo2's own class with its torchvision
steps done in torch) keeps the real one's output contract: the same keys, shapes and dtypes, and, for the images the cases give, the same
number of tiles or patches per image and the same size keys that the processor's text expansion
reads, so that the real processor writes the same placeholder tokens for them as with the real
image processor. Only the pixel values can differ (Pillow's resampling instead of torchvision's),
which changes no position and no batching. They stand in for:

- Cohere2-Vision's ``Cohere2VisionImageProcessor``: tiles on the grid of at most ``max_patches``
  that needs the least upscaling, plus a thumbnail where there is more than one tile, and
  ``num_patches`` per image.
- Inkling 2's ``Inkling2ImageProcessor`` (also Inkling 2 Loop's): each image padded to whole
  40-pixel squares and cut into them, one image token each, ``(tokens, 40, 40, 3)`` pixel values
  and ``image_grid_thw`` ``(1, rows, columns)`` per image (its checkerboard under transparent
  pixels is left out: the cases' images are opaque).
- Inkling's ``InklingImageProcessor``: each image cut into squares as wide as the vision tower's
  patches (rows rounded up, one column more than whole ones fit, as the real one cuts), each
  padded with -1 and doubled on a time axis, ``(tokens, 2, side, side, 3)`` pixel values and ``num_patches`` per image.
- Kimi-K2.5's ``Kimi_K25ImageProcessor``: each image (never upscaled, as the real one; images over
  its patch limits, which it would shrink, are refused) padded on the bottom and right to whole merged patches and cut into patches,
  ``(patches, 3, 14, 14)`` pixel values and ``image_grid_thw`` ``(1, rows, columns)`` per image.
- MiniCPM-OCR's ``MiniCPMOcrImageProcessor``: MiniCPM-V 4.6's Pillow image processor, which slices
  and resizes by the same rules, with MiniCPM-OCR's defaults (``downsample_mode="4x"``, images no
  larger than ``scale_resolution`` upscaled to it: its default ``small_image_upsize="always"``; the
  ``"adaptive"`` mode, which needs OpenCV, is refused).
- Gemma4-Unified's ``Gemma4UnifiedImageProcessor``: Gemma4's Pillow image processor resizes the
  same way (the same size rule); its pixels are then cut into the merged model patches
  (``pooling_kernel_size`` patches a side) row by row, each padded to ``max_soft_tokens``, with
  ``image_position_ids`` (column, row; -1 past the image) and ``num_soft_tokens_per_image``.
- LFM2-VL's ``Lfm2VlImageProcessor``, for images that it does not split into tiles (not over
  ``max_image_tokens`` by its tolerance; larger ones are refused): resized by the same rule to
  whole downsampled patches, cut into patches, padded to its most patches, with
  ``pixel_attention_mask``, ``spatial_shapes`` and the one-tile rows, columns and sizes the
  processor's text expansion reads.
- Apertus 1.5's ``Apertus1p5ImageProcessor``: each image resized by the same rule to whole
  ``spatial_factor`` blocks (one image code each) within its pixel budget, the images of a call
  padded to the largest (zeros after normalizing), with ``image_sizes`` (height, width).
- Molmo2's ``Molmo2ImageProcessor`` is itself the stand-in: its class builds, crops and pools
  without torchvision; only the two steps it takes from torchvision, resizing (bilinear, no
  antialias) and normalizing, are done in torch.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np


def extra_cases() -> dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]]:
    """``name -> (build() -> (processor, config), calls(processor, rng), config overrides)``."""
    import transformers

    found: dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]] = {}

    def present(model_type: str, processor: str) -> bool:
        """The model type and its processor class, importable without torchvision (transformers
        5.10's Gemma4-Unified processor imports its video processor, which needs it)."""
        try:
            return model_type in transformers.CONFIG_MAPPING and hasattr(transformers, processor)
        except ImportError:
            return False

    if present("cohere2_vision", "Cohere2VisionProcessor"):
        # 32-pixel tiles of 4-pixel patches, shuffled 2 x 2: 4 x 4 tokens a tile, the
        # image processor's patch_size (the released 512 / 16 / 2 = 16)
        found["Cohere2-Vision (cohere2_vision)"] = (
            cohere2_vision, functools.partial(image_calls, sides=((32, 32), (32, 64), (64, 32))),
            ())
    for model_type in ("inkling2", "inkling2_loop"):
        if present(model_type, "Inkling2Processor"):
            # 40-pixel squares, one token each (20-pixel patches merged 2 x 2): 1 x 2, 2 x 1 and 2 x 2 grids
            found[f"Inkling 2{' Loop' if model_type.endswith('loop') else ''} ({model_type})"] = (
                functools.partial(inkling2, model_type),
                functools.partial(image_calls, sides=((40, 80), (60, 40), (80, 70))), ())
    if present("inkling_mm_model", "InklingProcessor"):
        # squares of 4 pixels (the released 40 make a vision tower of 600k channels), a tower
        # with no fewer layers than its scales (else it needs scipy): 1, 2 and 4 squares an image
        found["Inkling (inkling_mm_model)"] = (inkling, functools.partial(
            image_calls, sides=((4, 3), (3, 6), (8, 7)), image_text="<|content_image|><|unused_200054|>"),
            (("vision_config.patch_size", 4), ("vision_config.n_layers", 4)))
    if present("kimi_k25", "Kimi_K25Processor"):
        # 14-pixel patches merged 2 x 2: 1, 2 and 4 tokens an image (the last padded to 56 x 56)
        # its projector's norm is as wide as the vision tower (projection_hidden_size follows it);
        # DeepSeek-V3's latent attention expands its keys to every query head (no fewer kv heads)
        found["Kimi-K2.5 (kimi_k25)"] = (kimi_k25, functools.partial(image_calls, sides=((28, 28), (28, 56), (40, 30))),
                                        (("projection_hidden_size", 32), ("text_config.num_key_value_heads", 2)))
    if present("minicpm_ocr", "MiniCPMOcrProcessor"):
        # slices of 112 pixels at most, 14-pixel patches (the released 16: patches of the processor's size)
        found["MiniCPM-OCR (minicpm_ocr)"] = (minicpm_ocr, functools.partial(
            image_calls, sides=((56, 84), (168, 112), (112, 56))), (("vision_config.patch_size", 14),))
    if present("gemma4_unified", "Gemma4UnifiedProcessor"):
        # 2-pixel patches merged 3 x 3 (the released 16), at most 70 soft tokens an image; the
        # default config has no vision tower, and its embedder is as wide as the text model
        found["Gemma4-Unified (gemma4_unified)"] = (gemma4_unified, functools.partial(
            image_calls, sides=((24, 30), (40, 20), (30, 30)), nested=True),
            (("vision_config", {"model_type": "gemma4_unified_vision"}), ("vision_config.patch_size", 2),
             ("vision_config.mm_embed_dim", 32), ("vision_config.output_proj_dims", 32)))
    if present("lfm2_vl", "Lfm2VlProcessor"):
        # 4-pixel patches downsampled 2 x 2 (the released 16), 4 to 16 tokens an image: 6, 15, 16
        found["LFM2-VL (lfm2_vl)"] = (lfm2_vl, functools.partial(image_calls, sides=((16, 24), (24, 40), (32, 32)), nested=True),
                                      (("vision_config.patch_size", 4),))
    if present("apertus1p5", "Apertus1p5Processor"):
        # images of 16-pixel blocks, 2 to 6 codes each; 8 image and 8 audio codes in the vocabulary
        # (their ids follow each other, as the released 131072 and 4096 do); the vision tokenizer's
        # group norms take 32 channels a group
        found["Apertus 1.5 (apertus1p5)"] = (apertus1p5, functools.partial(
            image_calls, sides=((16, 32), (32, 48), (48, 32))),
            (("vision_config.codebook_size", 8), ("audio_config.codebook_size", 8), ("audio_config.codebook_dim", 32),
             ("vision_config.base_channels", 32), ("vision_config.num_res_blocks", 1)))
    if present("molmo2", "Molmo2Processor"):
        # 20-pixel crops of 2-pixel patches (the released 378 and 14) overlapping by 2 patches a
        # side, pooled 2 x 2: 60 to 76 tokens an image; a vision tower of 2 layers, read at its last
        found["Molmo2 (molmo2)"] = (molmo2, functools.partial(image_calls, sides=((20, 20), (20, 30), (30, 20))), (
            ("vision_config.image_size", [20, 20]), ("vision_config.num_position_embeddings", 100),
            ("adapter_config.vision_feature_layer", [-1])))
    return found


def image_calls(processor: Any, rng: Any, sides: tuple[tuple[int, int], ...], counts: tuple[int, ...] = (2, 1),
                image_text: str | None = None, nested: bool = False) -> list[dict[str, Any]]:
    """One processor call per sample, ``counts`` images each, of the (height, width) ``sides``
    in turn, random text around them; an image is written ``image_text`` (else the processor's
    image token); ``nested``: the processor takes each sample's images as a list of their own."""
    image_text = image_text or processor.image_token
    from mmrope_core.tiny import filler_text, random_image

    calls, turn = [], 0
    for count in counts:
        parts, images = [filler_text(rng, rng.randint(1, 4))], []
        for _ in range(count):
            height, width = sides[turn % len(sides)]
            turn += 1
            images.append(random_image(rng, height, width))
            parts += [image_text, filler_text(rng, rng.randint(1, 3))]
        calls.append({"text": [" ".join(parts)], "images": [images] if nested else images, "return_tensors": "pt"})
    return calls


def config_with_ids(model_type: str, tokenizer: Any, ids: dict[str, str], **kwargs: Any) -> Any:
    """The model type's default config holding the tokenizer's ids of ``ids`` (key -> token)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    for key, token in ids.items():
        setattr(config, key, tokenizer.convert_tokens_to_ids(token))
    return config


# -- Cohere2-Vision --------------------------------------------------------------------------------


def cohere2_vision() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<|IMG_PATCH|>", "boi_token": "<|START_OF_IMG|>",
                                      "eoi_token": "<|END_OF_IMG|>", "img_line_break_token": "<|IMG_LINE_BREAK|>"})
    image_processor = cohere2_vision_image_processor()(size={"height": 32, "width": 32}, patch_size=4, max_patches=4)
    processor = transformers.Cohere2VisionProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return processor, config_with_ids("cohere2_vision", tokenizer, {"image_token_id": "<|IMG_PATCH|>"})


def cohere2_grid(height: int, width: int, tile: int, max_patches: int) -> tuple[int, int]:
    """(columns, rows) of Cohere2-Vision's tiling: of the grids of at most ``max_patches`` tiles
    (fewest tiles first), the one needing the least upscaling, else the least downscaling."""
    grids = sorted(((columns, rows) for columns in range(1, max_patches + 1) for rows in range(1, max_patches + 1)
                    if columns * rows <= max_patches), key=lambda grid: grid[0] * grid[1])
    scales = [min(columns * tile / width, rows * tile / height) for columns, rows in grids]
    if all(scale < 1 for scale in scales):
        return grids[int(np.argmax(scales))]
    return grids[int(np.argmin([scale if scale >= 1 else np.inf for scale in scales]))]


@functools.cache
def cohere2_vision_image_processor() -> type:
    """Stand-in for ``Cohere2VisionImageProcessor`` (torchvision only): the same tiles per image."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling, SizeDict
    from transformers.processing_utils import ImagesKwargs

    class Cohere2VisionImageProcessorKwargs(ImagesKwargs, total=False):
        crop_to_patches: bool
        min_patches: int
        max_patches: int

    class Cohere2VisionImageProcessorStandIn(PilBackend):
        valid_kwargs = Cohere2VisionImageProcessorKwargs
        resample = PILImageResampling.BICUBIC
        image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
        size: ClassVar[dict[str, Any]] = {"height": 512, "width": 512}
        do_resize = do_rescale = do_normalize = do_convert_rgb = crop_to_patches = True
        min_patches, max_patches, patch_size = 1, 12, 16

        def _preprocess(self, images: list[np.ndarray], size: SizeDict, resample: Any, do_rescale: bool,
                        rescale_factor: float, do_normalize: bool, image_mean: Any, image_std: Any,
                        return_tensors: Any, crop_to_patches: bool = False, max_patches: int = 12,
                        **kwargs: Any) -> BatchFeature:
            tiles, counts = [], []
            for image in images:
                parts = self.tiles(image, size, resample, max_patches) if crop_to_patches else [image]
                for part in parts:
                    part = self.resize(part, size, resample=resample)
                    if do_rescale:
                        part = self.rescale(part, rescale_factor)
                    if do_normalize:
                        part = self.normalize(part, image_mean, image_std)
                    tiles.append(part)
                counts.append(len(parts))
            return BatchFeature({"pixel_values": tiles, "num_patches": counts}, tensor_type=return_tensors)

        def tiles(self, image: np.ndarray, size: SizeDict, resample: Any, max_patches: int) -> list[np.ndarray]:
            """The image resized to its grid and cut row by row, a thumbnail last if more than one."""
            columns, rows = cohere2_grid(*image.shape[-2:], size.height, max_patches)
            canvas = self.resize(image, SizeDict(height=size.height * rows, width=size.width * columns),
                                 resample=resample)
            parts = [canvas[:, row * size.height:(row + 1) * size.height, column * size.width:(column + 1) * size.width]
                     for row in range(rows) for column in range(columns)]
            return parts if len(parts) == 1 else [*parts, self.resize(image, size, resample=resample)]

    return Cohere2VisionImageProcessorStandIn


# -- Inkling 2 -------------------------------------------------------------------------------------


def inkling2(model_type: str) -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<|unused_200054|>"})
    processor = transformers.Inkling2Processor(image_processor=inkling2_image_processor()(), tokenizer=tokenizer)
    return processor, config_with_ids(model_type, tokenizer, {"image_token_id": "<|unused_200054|>"})


@functools.cache
def inkling2_image_processor() -> type:
    """Stand-in for ``Inkling2ImageProcessor`` (torchvision only): the same squares per image."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import SizeDict

    class Inkling2ImageProcessorStandIn(PilBackend):
        image_mean: ClassVar[list[float]] = [0.5, 0.5, 0.5]
        image_std: ClassVar[list[float]] = [0.5, 0.5, 0.5]
        do_convert_rgb = do_rescale = do_normalize = True
        do_resize = False
        size: ClassVar[dict[str, Any]] = {"height": 40, "width": 40}
        model_input_names: ClassVar[list[str]] = ["pixel_values", "image_grid_thw"]

        def _preprocess(self, images: list[np.ndarray], size: SizeDict, do_rescale: bool, rescale_factor: float,
                        do_normalize: bool, image_mean: Any, image_std: Any, return_tensors: Any,
                        **kwargs: Any) -> BatchFeature:
            squares, grids = [], []
            for image in images:
                channels, height, width = image.shape
                rows, columns = -(-height // size.height), -(-width // size.width)
                # padded with -1 on the 0-255 scale, as the real one pads
                image = self.pad([image.astype(np.float32)], SizeDict(height=rows * size.height,
                                                                      width=columns * size.width), fill_value=-1.0)[0]
                if do_rescale:
                    image = self.rescale(image, rescale_factor)
                if do_normalize:
                    image = self.normalize(image, image_mean, image_std)
                image = image.reshape(channels, rows, size.height, columns, size.width).transpose(1, 3, 2, 4, 0)
                squares.append(image.reshape(rows * columns, size.height, size.width, channels))
                grids.append([1, rows, columns])
            return BatchFeature({"pixel_values": np.concatenate(squares), "image_grid_thw": np.array(grids)},
                                tensor_type=return_tensors)

    return Inkling2ImageProcessorStandIn


# -- Inkling ---------------------------------------------------------------------------------------

INKLING_TOKENS = {"image_token": "<|unused_200054|>", "audio_token": "<|unused_200053|>",
                  "image_bos_token": "<|content_image|>", "audio_bos_token": "<|content_audio_input|>"}


def inkling() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(INKLING_TOKENS)
    processor = transformers.InklingProcessor(feature_extractor=transformers.InklingFeatureExtractor(),
                                              image_processor=inkling_image_processor()(size={"height": 4, "width": 4}),
                                              tokenizer=tokenizer)
    return processor, config_with_ids("inkling_mm_model", tokenizer, {
        f"{key}_id": token for key, token in INKLING_TOKENS.items()})


@functools.cache
def inkling_image_processor() -> type:
    """Stand-in for ``InklingImageProcessor`` (torchvision only): the same squares per image."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, SizeDict

    class InklingImageProcessorStandIn(PilBackend):
        image_mean, image_std = OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
        do_convert_rgb = do_rescale = do_normalize = True
        do_resize = False
        size: ClassVar[dict[str, Any]] = {"height": 40, "width": 40}

        def _preprocess(self, images: list[np.ndarray], size: SizeDict, do_rescale: bool, rescale_factor: float,
                        do_normalize: bool, image_mean: Any, image_std: Any, return_tensors: Any,
                        **kwargs: Any) -> BatchFeature:
            squares, counts = [], []
            side = size.height
            for image in images:
                height, width = image.shape[-2:]
                # as the real one cuts: rows rounded up, one column more than whole ones fit
                cut = [image[:, row:row + side, column:column + side].astype(np.float32)
                       for row in range(0, -(-height // side) * side, side)
                       for column in range(0, (width // side + 1) * side, side)]
                for square in self.pad(cut, SizeDict(height=side, width=side), fill_value=-1.0):
                    if do_rescale:
                        square = self.rescale(square, rescale_factor)
                    if do_normalize:
                        square = self.normalize(square, image_mean, image_std)
                    squares.append(np.stack([square.transpose(1, 2, 0)] * 2))  # (2, height, width, channels)
                counts.append(len(cut))
            return BatchFeature({"pixel_values": np.stack(squares), "num_patches": np.array(counts)},
                                tensor_type=return_tensors)

    return InklingImageProcessorStandIn


# -- Kimi-K2.5 -------------------------------------------------------------------------------------

KIMI_TOKENS = {"image_token": "<|media_pad|>", "video_token": "<|kimi_k25_video_placeholder|>",
               "vision_start_token": "<|media_begin|>", "vision_end_token": "<|media_end|>"}


def kimi_k25() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(KIMI_TOKENS)
    with processors_without_torchvision() as video_processor:
        processor = transformers.Kimi_K25Processor(image_processor=kimi_k25_image_processor()(), tokenizer=tokenizer,
                                                   video_processor=video_processor)
    return processor, config_with_ids("kimi_k25", tokenizer, {
        f"{key}_id": token for key, token in KIMI_TOKENS.items()})


@functools.cache
def kimi_k25_image_processor() -> type:
    """Stand-in for ``Kimi_K25ImageProcessor`` (torchvision only): the same patches per image."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
    from transformers.processing_utils import ImagesKwargs

    class Kimi_K25ImageProcessorKwargs(ImagesKwargs, total=False):
        max_patches: int
        patch_size: int
        merge_size: int

    class Kimi_K25ImageProcessorStandIn(PilBackend):
        resample = PILImageResampling.BICUBIC
        size: ClassVar[dict[str, Any]] = {"max_height": 512, "max_width": 512}
        max_patches, patch_size, merge_size = 16384, 14, 2
        do_resize = do_rescale = do_normalize = do_convert_rgb = True
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        valid_kwargs = Kimi_K25ImageProcessorKwargs
        model_input_names: ClassVar[list[str]] = ["pixel_values", "image_grid_thw"]

        def _preprocess(self, images: list[np.ndarray], size: SizeDict, do_rescale: bool, rescale_factor: float,
                        do_normalize: bool, image_mean: Any, image_std: Any, return_tensors: Any, patch_size: int,
                        merge_size: int, max_patches: int, **kwargs: Any) -> BatchFeature:
            patches, grids = [], []
            factor = patch_size * merge_size
            for image in images:
                channels, height, width = image.shape
                if (height // patch_size) * (width // patch_size) > max_patches or max(height, width) > size.max_height * patch_size:
                    raise NotImplementedError("the stand-in does not downscale: give images under the limits")
                image = self.pad([image], SizeDict(height=-(-height // factor) * factor,
                                                   width=-(-width // factor) * factor))[0]
                if do_rescale:
                    image = self.rescale(image, rescale_factor)
                if do_normalize:
                    image = self.normalize(image, image_mean, image_std)
                rows, columns = image.shape[1] // patch_size, image.shape[2] // patch_size
                image = image.reshape(channels, rows, patch_size, columns, patch_size).transpose(1, 3, 0, 2, 4)
                patches.append(image.reshape(rows * columns, channels, patch_size, patch_size))
                grids.append([1, rows, columns])
            return BatchFeature({"pixel_values": np.concatenate(patches), "image_grid_thw": np.array(grids)},
                                tensor_type=return_tensors)

    return Kimi_K25ImageProcessorStandIn


# -- MiniCPM-OCR -----------------------------------------------------------------------------------

MINICPM_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
                  "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
                  "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}


def minicpm_ocr() -> tuple[Any, Any]:
    import transformers
    from tokenizers import AddedToken

    from mmrope_core.tiny import FILLER_WORDS, processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(MINICPM_TOKENS, words=(*FILLER_WORDS, *"0123456789"))
    tokenizer.add_tokens([AddedToken("\n", normalized=False, special=True)])  # it joins slices' rows with it
    image_processor = minicpm_ocr_image_processor()(scale_resolution=112, patch_size=14)
    with processors_without_torchvision() as video_processor:
        video_processor.slice_mode, video_processor.downsample_mode = True, "4x"
        processor = transformers.MiniCPMOcrProcessor(image_processor=image_processor, video_processor=video_processor,
                                                     tokenizer=tokenizer)
    return processor, config_with_ids("minicpm_ocr", tokenizer, {"image_token_id": "<|image_pad|>",
                                                                 "video_token_id": "<|video_pad|>"})


@functools.cache
def minicpm_ocr_image_processor() -> type:
    """Stand-in for ``MiniCPMOcrImageProcessor`` (torchvision only): MiniCPM-V 4.6's Pillow one,
    whose slicing and resizing rules it shares, with MiniCPM-OCR's defaults."""
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import (
        MiniCPMV4_6ImageProcessorPil,
        MiniCPMV4_6ImageProcessorPilKwargs,
    )

    class MiniCPMOcrImageProcessorKwargs(MiniCPMV4_6ImageProcessorPilKwargs, total=False):
        small_image_upsize: str

    class MiniCPMOcrImageProcessorStandIn(MiniCPMV4_6ImageProcessorPil):
        downsample_mode = "4x"
        small_image_upsize = "always"
        valid_kwargs = MiniCPMOcrImageProcessorKwargs

        def _preprocess(self, images: list[np.ndarray], *args: Any, small_image_upsize: str = "always",
                        **kwargs: Any) -> Any:
            if small_image_upsize != "always":
                raise NotImplementedError(f"small_image_upsize={small_image_upsize!r}: the stand-in upscales always")
            return super()._preprocess(images, *args, **kwargs)

    return MiniCPMOcrImageProcessorStandIn


# -- Gemma4-Unified --------------------------------------------------------------------------------

GEMMA4_TOKENS = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                 "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}


def gemma4_unified() -> tuple[Any, Any]:
    import transformers
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(GEMMA4_TOKENS)
    image_processor = gemma4_unified_image_processor()(patch_size=2, max_soft_tokens=70)
    with processors_without_torchvision() as video_processor:
        processor = transformers.Gemma4UnifiedProcessor(
            feature_extractor=Gemma4UnifiedAudioFeatureExtractor(), image_processor=image_processor,
            tokenizer=tokenizer, video_processor=video_processor, image_seq_length=70)
    return processor, config_with_ids("gemma4_unified", tokenizer, {
        "image_token_id": "<|image|>", "boi_token_id": "<|image>", "eoi_token_id": "<image|>",
        "audio_token_id": "<|audio|>", "boa_token_id": "<|audio>", "eoa_token_id": "<audio|>"})


@functools.cache
def gemma4_unified_image_processor() -> type:
    """Stand-in for ``Gemma4UnifiedImageProcessor`` (torchvision only): Gemma4's Pillow image
    processor's resizing, its pixels cut into the merged patches the unified model takes."""
    from transformers.image_processing_utils import BatchFeature
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    class Gemma4UnifiedImageProcessorStandIn(Gemma4ImageProcessorPil):
        def _preprocess(self, images: list[np.ndarray], do_resize: bool, resample: Any, do_rescale: bool,
                        rescale_factor: float, do_normalize: bool, image_mean: Any, image_std: Any,
                        return_tensors: Any, max_soft_tokens: int = 280, patch_size: int = 16,
                        pooling_kernel_size: int = 3, **kwargs: Any) -> BatchFeature:
            side = patch_size * pooling_kernel_size
            patches, positions, counts = [], [], []
            for image in images:
                if do_resize:
                    image = self.aspect_ratio_preserving_resize(image, patch_size, max_soft_tokens * pooling_kernel_size**2,
                                                                pooling_kernel_size, resample)
                if do_rescale:
                    image = self.rescale(image, rescale_factor)
                if do_normalize:
                    image = self.normalize(image, image_mean, image_std)
                channels, height, width = image.shape
                rows, columns = height // side, width // side
                blocks = image.reshape(channels, rows, side, columns, side).transpose(1, 3, 2, 4, 0)
                padded = np.zeros((max_soft_tokens, side * side * channels), dtype=image.dtype)
                padded[:rows * columns] = blocks.reshape(rows * columns, -1)
                where = np.full((max_soft_tokens, 2), -1, dtype=np.int64)
                where[:rows * columns] = np.stack(np.meshgrid(np.arange(columns), np.arange(rows)), -1).reshape(-1, 2)
                patches.append(padded)
                positions.append(where)
                counts.append(rows * columns)
            return BatchFeature({"pixel_values": np.stack(patches), "image_position_ids": np.stack(positions),
                                 "num_soft_tokens_per_image": counts}, tensor_type=return_tensors)

    return Gemma4UnifiedImageProcessorStandIn


# -- LFM2-VL ---------------------------------------------------------------------------------------

LFM2_TOKENS = {"image_token": "<image>", "image_start_token": "<|image_start|>", "image_end_token": "<|image_end|>",
               "image_thumbnail_token": "<|img_thumbnail|>"}


def lfm2_vl() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(LFM2_TOKENS)
    image_processor = lfm2_vl_image_processor()(encoder_patch_size=4, min_image_tokens=4, max_image_tokens=16,
                                                tile_size=16)
    processor = transformers.Lfm2VlProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return processor, config_with_ids("lfm2_vl", tokenizer, {"image_token_id": "<image>"})


@functools.cache
def lfm2_vl_image_processor() -> type:
    """Stand-in for ``Lfm2VlImageProcessor`` (torchvision only): the same patches per image, for
    images it does not split into tiles."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
    from transformers.processing_utils import ImagesKwargs

    class Lfm2VlImageProcessorKwargs(ImagesKwargs, total=False):
        downsample_factor: int
        do_image_splitting: bool
        min_tiles: int
        max_tiles: int
        use_thumbnail: bool
        min_image_tokens: int
        max_image_tokens: int
        encoder_patch_size: int
        tile_size: int
        max_pixels_tolerance: float
        return_row_col_info: bool

    class Lfm2VlImageProcessorStandIn(PilBackend):
        downsample_factor, min_tiles, max_tiles, min_image_tokens, max_image_tokens = 2, 2, 10, 64, 256
        encoder_patch_size, tile_size, max_pixels_tolerance = 16, 512, 2.0
        do_image_splitting = use_thumbnail = do_resize = do_rescale = do_normalize = do_pad = True
        return_row_col_info = False
        size: ClassVar[dict[str, Any]] = {"height": 512, "width": 512}
        resample = PILImageResampling.BILINEAR
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        valid_kwargs = Lfm2VlImageProcessorKwargs
        model_input_names: ClassVar[list[str]] = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]

        def _preprocess(self, images: list[np.ndarray], resample: Any, do_rescale: bool, rescale_factor: float,
                        do_normalize: bool, image_mean: Any, image_std: Any, return_tensors: Any,
                        downsample_factor: int, do_image_splitting: bool, min_tiles: int, max_tiles: int,
                        min_image_tokens: int, max_image_tokens: int, encoder_patch_size: int, tile_size: int,
                        max_pixels_tolerance: float, return_row_col_info: bool = False,
                        **kwargs: Any) -> BatchFeature:
            patch, factor = encoder_patch_size, encoder_patch_size * downsample_factor
            most = max(max_image_tokens * downsample_factor**2, (tile_size // patch) ** 2 if do_image_splitting else 0)
            pixel_values, masks, shapes, sizes = [], [], [], []
            for image in images:
                height, width = image.shape[-2:]
                rounded = max(patch, round(height / factor) * factor) * max(patch, round(width / factor) * factor)
                if do_image_splitting and not min_tiles == max_tiles == 1 and (
                        rounded > max_image_tokens * factor**2 * max_pixels_tolerance):
                    raise NotImplementedError("the stand-in does not split images into tiles: give smaller images")
                new_height, new_width = self.target_size(height, width, factor, min_image_tokens * factor**2,
                                                         max_image_tokens * factor**2)
                image = self.resize(image, SizeDict(height=new_height, width=new_width), resample=resample)
                if do_rescale:
                    image = self.rescale(image, rescale_factor)
                if do_normalize:
                    image = self.normalize(image, image_mean, image_std)
                channels, rows, columns = image.shape[0], new_height // patch, new_width // patch
                patches = image.reshape(channels, rows, patch, columns, patch).transpose(1, 3, 2, 4, 0)
                padded = np.zeros((most, patch * patch * channels), dtype=image.dtype)
                padded[:rows * columns] = patches.reshape(rows * columns, -1)
                mask = np.zeros(most, dtype=np.int32)
                mask[:rows * columns] = 1
                pixel_values.append(padded)
                masks.append(mask)
                shapes.append([rows, columns])
                sizes.append([new_height, new_width])
            data: dict[str, Any] = {"pixel_values": np.stack(pixel_values), "pixel_attention_mask": np.stack(masks),
                                    "spatial_shapes": np.array(shapes)}
            if return_row_col_info:  # one tile each
                data.update(image_rows=[1] * len(images), image_cols=[1] * len(images), image_sizes=sizes)
            return BatchFeature(data, tensor_type=return_tensors)

        @staticmethod
        def target_size(height: int, width: int, factor: int, least: int, most: int) -> tuple[int, int]:
            """Sides in whole ``factor``s, the area kept within [least, most] pixels, the aspect ratio near."""
            new_height, new_width = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
            if new_height * new_width > most:
                scale = (height * width / most) ** 0.5
                return (max(factor, int(height / scale // factor) * factor),
                        max(factor, int(width / scale // factor) * factor))
            if new_height * new_width < least:
                scale = (least / (height * width)) ** 0.5
                return -(-int(np.ceil(height * scale)) // factor) * factor, -(-int(np.ceil(width * scale)) // factor) * factor
            return new_height, new_width

    return Lfm2VlImageProcessorStandIn


# -- Apertus 1.5 -----------------------------------------------------------------------------------

APERTUS_TOKENS = {"image_token": "<|image|>", "audio_token": "<|audio|>", "boi_token": "<|image_start|>",
                  "eoi_token": "<|image_end|>", "image_wrapper_token": "<|image_wrapper|>", "eol_token": "<|eol|>",
                  "boa_token": "<|audio_start|>", "eoa_token": "<|audio_end|>"}
#: Words the processor writes or the model's codes are: each image's grid ("rows*columns"), then
#: the image codes' and the audio codes' tokens, in a row at the end of the vocabulary.
APERTUS_WORDS = (*(f"{rows}*{columns}" for rows in range(1, 4) for columns in range(1, 4)),
                 *(f"<|visual token {code}|>" for code in range(8)), *(f"<|audio token {code}|>" for code in range(8)))


def apertus1p5() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import FILLER_WORDS, word_level_tokenizer

    tokenizer = word_level_tokenizer(APERTUS_TOKENS, words=(*FILLER_WORDS, *APERTUS_WORDS))
    image_processor = apertus1p5_image_processor()(size={"min_pixels": 16 * 16, "max_pixels": 64 * 64})
    processor = transformers.Apertus1p5Processor(image_processor=image_processor,
                                                 feature_extractor=transformers.WavTokenizerFeatureExtractor(),
                                                 tokenizer=tokenizer)
    config = config_with_ids("apertus1p5", tokenizer, {"image_token_id": "<|image|>", "audio_token_id": "<|audio|>"})
    config.image_token_offset = tokenizer.convert_tokens_to_ids("<|visual token 0|>")
    config.audio_token_offset = tokenizer.convert_tokens_to_ids("<|audio token 0|>")
    return processor, config


@functools.cache
def apertus1p5_image_processor() -> type:
    """Stand-in for ``Apertus1p5ImageProcessor`` (torchvision only): the same sizes per image."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_processing_utils import BatchFeature
    from transformers.image_utils import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD, PILImageResampling, SizeDict
    from transformers.processing_utils import ImagesKwargs

    class Apertus1p5ImageProcessorKwargs(ImagesKwargs, total=False):
        spatial_factor: int

    class Apertus1p5ImageProcessorStandIn(PilBackend):
        do_resize = do_rescale = do_normalize = do_convert_rgb = do_pad = True
        resample = PILImageResampling.BICUBIC
        image_mean, image_std = IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
        size: ClassVar[dict[str, Any]] = {"min_pixels": 128 * 128, "max_pixels": 1400 * 1400}
        spatial_factor = 16
        valid_kwargs = Apertus1p5ImageProcessorKwargs
        model_input_names: ClassVar[list[str]] = ["pixel_values", "image_sizes"]

        def _validate_preprocess_kwargs(self, **kwargs: Any) -> None:
            super()._validate_preprocess_kwargs(**{**kwargs, "do_resize": False})  # a pixel budget, not a size

        def _preprocess(self, images: list[np.ndarray], do_resize: bool, size: SizeDict, resample: Any,
                        do_rescale: bool, rescale_factor: float, do_normalize: bool, image_mean: Any, image_std: Any,
                        return_tensors: Any, spatial_factor: int, do_pad: bool = True, **kwargs: Any) -> BatchFeature:
            processed = []
            for image in images:
                if do_resize:
                    height, width = self.budgeted(*image.shape[-2:], spatial_factor, size.min_pixels, size.max_pixels)
                    image = self.resize(image, SizeDict(height=height, width=width), resample=resample)
                if do_rescale:
                    image = self.rescale(image, rescale_factor)
                if do_normalize:
                    image = self.normalize(image, image_mean, image_std)
                processed.append(image)
            sizes = [list(image.shape[-2:]) for image in processed]
            if do_pad:
                processed = self.pad(processed)
            return BatchFeature({"pixel_values": np.stack(processed) if do_pad else processed, "image_sizes": sizes},
                                tensor_type=return_tensors)

        @staticmethod
        def budgeted(height: int, width: int, factor: int, least: int, most: int) -> tuple[int, int]:
            """Sides in whole ``factor``s, the area kept within [least, most] pixels, the aspect ratio near."""
            new_height, new_width = round(height / factor) * factor, round(width / factor) * factor
            if new_height * new_width > most:
                scale = (height * width / most) ** 0.5
                return (max(factor, int(height / scale // factor) * factor),
                        max(factor, int(width / scale // factor) * factor))
            if new_height * new_width < least:
                scale = (least / (height * width)) ** 0.5
                return -(-int(np.ceil(height * scale)) // factor) * factor, -(-int(np.ceil(width * scale)) // factor) * factor
            return new_height, new_width

    return Apertus1p5ImageProcessorStandIn


# -- Molmo2 ----------------------------------------------------------------------------------------

MOLMO2_TOKENS = {"image_token": "<|image|>", "video_token": "<|video|>", "bos_token": "<|endoftext|>",
                 **{f"t{index}": token for index, token in enumerate((
                     "<im_patch>", "<im_col>", "<im_start>", "<low_res_im_start>", "<frame_start>", "<im_end>",
                     "<frame_end>", "<im_low>"))}}


def molmo2() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(MOLMO2_TOKENS)
    image_processor = molmo2_image_processor()(size={"height": 20, "width": 20}, patch_size=2, overlap_margins=[2, 2],
                                               max_crops=4)
    with processors_without_torchvision() as video_processor:
        processor = transformers.Molmo2Processor(image_processor=image_processor, video_processor=video_processor,
                                                 tokenizer=tokenizer)
    return processor, config_with_ids("molmo2", tokenizer, {
        "image_start_token_id": "<im_start>", "low_res_image_start_token_id": "<low_res_im_start>",
        "image_end_token_id": "<im_end>", "image_patch_id": "<im_patch>", "frame_start_token_id": "<frame_start>",
        "frame_end_token_id": "<frame_end>"})


@functools.cache
def molmo2_image_processor() -> type:
    """``Molmo2ImageProcessor`` with the two steps it takes from torchvision done in torch."""
    import torch
    from transformers.models.molmo2.image_processing_molmo2 import Molmo2ImageProcessor

    class Molmo2ImageProcessorStandIn(Molmo2ImageProcessor):
        def resize(self, image: Any, size: Any, resample: Any = None, antialias: bool = True, **kwargs: Any) -> Any:
            if antialias:
                raise NotImplementedError("Molmo2 resizes without antialiasing; the stand-in does only that")
            return torch.nn.functional.interpolate(image, size=(size.height, size.width), mode="bilinear",
                                                   align_corners=False)

        def normalize(self, image: Any, mean: Any, std: Any, **kwargs: Any) -> Any:
            mean, std = (torch.as_tensor(value, dtype=image.dtype)[:, None, None] for value in (mean, std))
            return (image - mean) / std

    return Molmo2ImageProcessorStandIn
