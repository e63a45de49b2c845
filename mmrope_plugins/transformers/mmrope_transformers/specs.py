"""The model types this plugin builds tiny processors for, and how: one :class:`Spec` each,
read by the example cases (:mod:`.examples`) and the generated batches (:mod:`.layouts`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

QWEN_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
               "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}
GLM_TOKENS = {"image_token": "<|image|>", "video_token": "<|video|>",
              "begin_of_image_token": "<|begin_of_image|>", "end_of_image_token": "<|end_of_image|>",
              "begin_of_video_token": "<|begin_of_video|>", "end_of_video_token": "<|end_of_video|>"}
QWEN_IDS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
GLM_IDS = {"image_token_id": "<|image|>", "video_token_id": "<|video|>",
           "image_start_token_id": "<|begin_of_image|>", "image_end_token_id": "<|end_of_image|>",
           "video_start_token_id": "<|begin_of_video|>", "video_end_token_id": "<|end_of_video|>"}
DIGITS = tuple(str(number) for number in range(64))


@dataclasses.dataclass(frozen=True)
class Spec:
    """How to build one model type's tiny processor and what one image looks like in its text.

    Attributes:
        name: the case's name (the model's name and its ``model_type``).
        model_type: the config's ``model_type``.
        processor: the processor class's name in ``transformers``.
        image_processor: ``(model module, class name, keyword arguments)`` of a Pillow image processor.
        tokens: the tokenizer's special tokens (attribute -> text).
        config_ids: config attribute -> the token whose id it holds.
        image_text: one image as the text writes it (``{image}`` is the processor's image token).
        words: the ordinary vocabulary besides the filler words.
        video_processor: the processor takes a (placeholder) video processor.
        processor_kwargs, config_kwargs, call_kwargs: further arguments of the processor's
            constructor, ``AutoConfig.for_model`` and each processor call.
        images_in_a_list: the processor takes each sample's images as a nested list.
        newline_token: ``"\n"`` is a token of its own (MiniCPM-V joins slices with it).
        video_processor_attributes: set on the placeholder video processor, which the processor
            reads them from.
        counts: images per sample, one sample each.
        sizes: ``(low, high, step)``: image sides are ``step * randint(low, high)`` pixels.
    """

    name: str
    model_type: str
    processor: str
    image_processor: tuple[str, str, Mapping[str, Any]]
    tokens: Mapping[str, str]
    config_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)
    image_text: str = "{image}"
    words: tuple[str, ...] = ()
    video_processor: bool = False
    processor_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    config_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    call_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    images_in_a_list: bool = False
    newline_token: bool = False
    video_processor_attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    counts: tuple[int, ...] = (2, 1)
    sizes: tuple[int, int, int] = (2, 4, 28)


_QWEN_IMAGE = "<|vision_start|>{image}<|vision_end|>"
_GLM_IMAGE = "<|begin_of_image|>{image}<|end_of_image|>"
_LLAVA_IMAGE_PROCESSOR = {"size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}}
_PINPOINTS = [[56, 56], [56, 112], [112, 56], [112, 112]]
_IDEFICS_TOKENS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                   "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"}
_IDEFICS_WORDS = tuple(f"<row_{row}_col_{column}>" for row in range(1, 7) for column in range(1, 7))

MROPE_SPECS = (
    Spec("Qwen4-exp (qwen4_exp)", "qwen4_exp", "Qwen3VLProcessor", ("qwen2_vl", "Qwen2VLImageProcessorPil", {}),
         QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE, video_processor=True),
    Spec("Cosmos3-Omni (cosmos3_omni)", "cosmos3_omni", "Qwen3VLProcessor",
         ("qwen2_vl", "Qwen2VLImageProcessorPil", {}), QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE, video_processor=True),
    Spec("Cosmos3-Edge (cosmos3_edge)", "cosmos3_edge", "Cosmos3EdgeProcessor",
         ("cosmos3_edge", "Cosmos3EdgeImageProcessorPil", {}), QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE,
         video_processor=True, call_kwargs={"return_mm_token_type_ids": True}, sizes=(2, 4, 32)),
    Spec("Cohere-Compass (cohere_compass)", "cohere_compass", "CohereCompassProcessor",
         ("cohere_compass", "CohereCompassImageProcessorPil", {}),
         {"image_token": "<|IMAGE_PAD|>", "video_token": "<|VIDEO_PAD|>",
          "vision_start_token": "<|VISION_START|>", "vision_end_token": "<|VISION_END|>"},
         {"image_token_id": "<|IMAGE_PAD|>", "video_token_id": "<|VIDEO_PAD|>",
          "vision_start_token_id": "<|VISION_START|>", "vision_end_token_id": "<|VISION_END|>"},
         "<|VISION_START|>{image}<|VISION_END|>", video_processor=True),
    Spec("GLM-OCR (glm_ocr)", "glm_ocr", "Glm46VProcessor", ("glm46v", "Glm46VImageProcessorPil", {}),
         GLM_TOKENS, GLM_IDS, _GLM_IMAGE, video_processor=True),
    Spec("GLM-GA (glmga)", "glmga", "Glm46VProcessor", ("glmga", "GlmgaImageProcessorPil", {}),
         GLM_TOKENS, GLM_IDS, _GLM_IMAGE, video_processor=True),
    Spec("PaddleOCR-VL (paddleocr_vl)", "paddleocr_vl", "PaddleOCRVLProcessor",
         ("paddleocr_vl", "PaddleOCRVLImageProcessorPil", {"min_pixels": 56 * 56}),
         {"image_token": "<|IMAGE_PLACEHOLDER|>", "image_start_token": "<|IMAGE_START|>",
          "image_end_token": "<|IMAGE_END|>"},
         {"image_token_id": "<|IMAGE_PLACEHOLDER|>"}, "<|IMAGE_START|>{image}<|IMAGE_END|>"),
    Spec("ERNIE-4.5-VL (ernie4_5_vl_moe)", "ernie4_5_vl_moe", "Ernie4_5_VLMoeProcessor",
         ("ernie4_5_vl_moe", "Ernie4_5_VLMoeImageProcessorPil", {}),
         {"image_token": "<|IMAGE_PLACEHOLDER|>", "image_start_token": "<|IMAGE_START|>",
          "image_end_token": "<|IMAGE_END|>", "video_token": "<|VIDEO_PLACEHOLDER|>",
          "video_start_token": "<|VIDEO_START|>", "video_end_token": "<|VIDEO_END|>"},
         {"image_token_id": "<|IMAGE_PLACEHOLDER|>", "video_token_id": "<|VIDEO_PLACEHOLDER|>",
          "image_start_token_id": "<|IMAGE_START|>", "image_end_token_id": "<|IMAGE_END|>",
          "video_start_token_id": "<|VIDEO_START|>", "video_end_token_id": "<|VIDEO_END|>"},
         "<|IMAGE_START|>{image}<|IMAGE_END|>", video_processor=True),
    Spec("HY-V4-VL (hy_v4_vl)", "hy_v4_vl", "HYV4VLProcessor",
         ("hy_v4_vl", "HYV4VLImageProcessorPil", {"min_pixels": 32 * 32, "max_pixels": 256 * 256}),
         QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE, video_processor=True, sizes=(2, 6, 16)),
    # the released checkpoint's text config: four xD-RoPE sections (the default config has none)
    Spec("HunYuan-VL (hunyuan_vl)", "hunyuan_vl", "HunYuanVLProcessor",
         ("hunyuan_vl", "HunYuanVLImageProcessorPil", {"min_pixels": 32 * 32, "max_pixels": 256 * 256}),
         {"image_token": "<image>", "image_start_token": "<image_start>", "image_end_token": "<image_end>"},
         {"image_token_id": "<image>", "image_start_token_id": "<image_start>", "image_end_token_id": "<image_end>"},
         "<image_start>{image}<image_end>", counts=(1, 0),
         config_kwargs={"text_config": {"head_dim": 128, "rope_parameters": {
             "rope_type": "default", "rope_theta": 10000.0, "xdrope_section": [16, 16, 16, 16]}}},
         sizes=(2, 6, 16)),
    Spec("MiniCPM-V 4.7 (minicpmv4_7)", "minicpmv4_7", "MiniCPMV4_7Processor",
         ("minicpmv4_6", "MiniCPMV4_6ImageProcessorPil", {"scale_resolution": 112}),
         {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
          "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
          "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"},
         {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>", "image_start_id": "<image>",
          "image_end_id": "</image>", "slice_start_id": "<slice>", "slice_end_id": "</slice>", "newline_id": "\n"},
         words=DIGITS[:10], video_processor=True, sizes=(2, 8, 28), newline_token=True,
         video_processor_attributes={"slice_mode": True, "downsample_mode": "16x"}),
    Spec("GLM-Image (glm_image)", "glm_image", "GlmImageProcessor",
         ("glm_image", "GlmImageImageProcessorPil", {"patch_size": 16, "temporal_patch_size": 1, "merge_size": 1}),
         {"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>",
          "bos_token": "<|dit_token_16384|>", "image_end_token": "<|dit_token_16385|>"},
         {"image_token_id": "<|image|>", "image_start_token_id": "<|dit_token_16384|>",
          "image_end_token_id": "<|dit_token_16385|>"},
         "<|dit_token_16384|>{image}<|dit_token_16385|>", words=DIGITS, counts=(1, 1), sizes=(2, 5, 16)),
)

ONE_D_SPECS = (
    # a get_rope_index in transformers 5.10 that its forward never calls; none in later releases
    Spec("EXAONE-4.5 (exaone4_5)", "exaone4_5", "Exaone4_5_Processor", ("qwen2_vl", "Qwen2VLImageProcessorPil", {}),
         QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE, video_processor=True),
    Spec("LLaVA (llava)", "llava", "LlavaProcessor", ("llava", "LlavaImageProcessorPil", _LLAVA_IMAGE_PROCESSOR),
         {"image_token": "<image>"}, {"image_token_id": "<image>"},
         processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "default",
                           "num_additional_image_tokens": 1}),
    Spec("LLaVA-NeXT (llava_next)", "llava_next", "LlavaNextProcessor",
         ("llava_next", "LlavaNextImageProcessorPil", {**_LLAVA_IMAGE_PROCESSOR, "image_grid_pinpoints": _PINPOINTS}),
         {"image_token": "<image>"}, {"image_token_id": "<image>"},
         processor_kwargs={"patch_size": 14, "vision_feature_select_strategy": "default",
                           "num_additional_image_tokens": 1}),
    Spec("LLaVA-OneVision (llava_onevision)", "llava_onevision", "LlavaOnevisionProcessor",
         ("llava_onevision", "LlavaOnevisionImageProcessorPil",
          {"size": {"height": 56, "width": 56}, "image_grid_pinpoints": _PINPOINTS}),
         {"image_token": "<image>", "video_token": "<video>"}, {"image_token_id": "<image>", "video_token_id": "<video>"},
         video_processor=True, processor_kwargs={"num_image_tokens": 16, "vision_feature_select_strategy": "full"}),
    Spec("Gemma3 (gemma3)", "gemma3", "Gemma3Processor",
         ("gemma3", "Gemma3ImageProcessorPil", {"size": {"height": 56, "width": 56}}),
         {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
         {"image_token_id": "<image_soft_token>", "boi_token_id": "<start_of_image>",
          "eoi_token_id": "<end_of_image>"},
         "<start_of_image>", processor_kwargs={"image_seq_length": 4}, images_in_a_list=True),
    Spec("InternVL (internvl)", "internvl", "InternVLProcessor",
         ("got_ocr2", "GotOcr2ImageProcessorPil",
          {"size": {"height": 56, "width": 56}, "crop_to_patches": True, "max_patches": 4}),
         {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
          "video_token": "<video>"}, {"image_token_id": "<IMG_CONTEXT>"}, "<IMG_CONTEXT>",
         video_processor=True, processor_kwargs={"image_seq_length": 4}),
    Spec("Idefics3 (idefics3)", "idefics3", "Idefics3Processor",
         ("idefics3", "Idefics3ImageProcessorPil", {"size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56}}),
         _IDEFICS_TOKENS, {"image_token_id": "<image>"}, "<image>", words=_IDEFICS_WORDS,
         processor_kwargs={"image_seq_len": 4}, images_in_a_list=True),
    Spec("Mllama (mllama)", "mllama", "MllamaProcessor",
         ("mllama", "MllamaImageProcessorPil", {"size": {"height": 56, "width": 56}}),
         {"image_token": "<|image|>", "bos_token": "<|begin_of_text|>"}, {"image_token_index": "<|image|>"},
         "<|image|>", words=("<|python_tag|>",), images_in_a_list=True),
    Spec("Aria (aria)", "aria", "AriaProcessor",
         ("aria", "AriaImageProcessorPil", {"max_image_size": 490, "min_image_size": 336}),
         {"image_token": "<|img|>"}, {"image_token_id": "<|img|>"}, "<|img|>", counts=(1, 1), sizes=(4, 8, 28)),
)


#: Model types whose family plugins answer first; this plugin binds them when it is alone (the
#: tests check that it then reproduces them too). Not example cases: their plugins show them.
_QWEN_PIL: tuple[str, str, Mapping[str, Any]] = ("qwen2_vl", "Qwen2VLImageProcessorPil", {})
_GLM_PIL: tuple[str, str, Mapping[str, Any]] = ("glm4v", "Glm4vImageProcessorPil", {})
FAMILY_PLUGIN_SPECS = (
    *(Spec(f"{model_type} (without its family plugin)", model_type, processor, _QWEN_PIL, QWEN_TOKENS, QWEN_IDS,
           _QWEN_IMAGE, video_processor=True)
      for model_type, processor in (("qwen2_vl", "Qwen2VLProcessor"), ("qwen2_5_vl", "Qwen2_5_VLProcessor"),
                                    ("qwen3_vl", "Qwen3VLProcessor"), ("qwen3_vl_moe", "Qwen3VLProcessor"),
                                    ("qwen3_5", "Qwen3VLProcessor"), ("qwen3_5_moe", "Qwen3VLProcessor"))),
    *(Spec(f"{model_type} (without its family plugin)", model_type, processor, _GLM_PIL, GLM_TOKENS, GLM_IDS,
           _GLM_IMAGE, video_processor=True)
      for model_type, processor in (("glm4v", "Glm4vProcessor"), ("glm4v_moe", "Glm4vProcessor"),
                                    ("glm46v", "Glm46VProcessor"))),
)


def available(spec: Spec) -> bool:
    """Whether the installed transformers has the model type and its processor class."""
    import transformers
    from transformers import CONFIG_MAPPING

    return spec.model_type in CONFIG_MAPPING and hasattr(transformers, spec.processor)


def spec_of(model_type: str) -> Spec:
    return next(spec for spec in (*MROPE_SPECS, *ONE_D_SPECS, *FAMILY_PLUGIN_SPECS) if spec.model_type == model_type)
