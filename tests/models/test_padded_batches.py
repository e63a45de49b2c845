"""A padded batch trains each sample as the sample alone, or is refused: for every example case,
tiny random models of the real model classes run ``PaddedCollator`` batches padded on either side,
and each sample's logits at its tokens, the loss and its gradients are compared with the sample run
alone, the model computing its own positions. The batch's media equal the processor's own batched
call: the reference for keys, shapes and order. Where the model's own padding changes a sample
(Mllama's empty image slots take part in its cross-attention), the processor's batch through the
model is the reference instead of the samples alone.

Besides the example cases, the model types the plugins bind that have none are built here the
same way (:func:`extra_cases`), with their real processors: Idefics2, PaliGemma, Qwen2-Audio,
GLM-ASR, Qwen3-ASR, VipLLaVA, LLaVA-NeXT-Video, LightOnOCR, GOT-OCR2, Qianfan-OCR, Ovis2, Janus,
DeepSeek-VL, DeepSeek-VL-Hybrid, Granite-Docling, VideoLLaMA3, Aya Vision, MiniCPM-V 4.6,
HyperCLOVAX-Vision-V2, LFM3-VL and Video-LLaVA; in cases_pad_more_b.py: ShieldGemma 2,
PP-Chart2Table, InstructBLIP, MOSS-Transcribe-Diarize, OmniASR, VibeVoice-ASR and
Nemotron-3.5-Transcribe (nemo_speechlm); in cases_pad_odd.py: GLM-5-Next, Granite-4-Vision,
Kosmos-2, Kosmos-2.5, Mistral4 (a text config, run as Mistral3's text model), and Granite Speech
and Granite Speech Plus, on clips of one length (see test_one_shape_media.py), with a stand-in for
torchaudio's mel spectrogram that computes the same power spectrogram in torch. Three with stand-ins, where the real processor needs a
package the tests run without: InstructBLIP-Video (cases_pad_more_b.py: its video processor needs
torchvision; the stand-in rescales and normalizes the frames as it does), Mistral3, with
Mistral-Large-4 and Mistral4 (``PixtralProcessor`` needs torchvision; LightOnOCR's processor
places Pixtral's tokens by the same rule) and SmolVLM (its processor needs ``num2words``, for
videos only: the real one is built with a stand-in that no image call reaches). Muse Glimmer, Muse
Spark, Nemotron-H Omni, Phi-4-multimodal, Step-3.7 and Unlimited-OCR (cases_pad_stand_b.py) have only
torchvision image processors: each runs as its real class with torch kernels in place of the
torchvision ones it calls (torchvision_stand_in.py), so its keys, shapes, dtypes, tokens per image
and batching are its own; only pixel values differ. PI0, a vision-language-action model (a chunk
of action velocities, not token logits), has a test of its own (test_action_models.py). GIT, Llama 4,
MiniMax-M3-VL and T5Gemma2 have tests of their own below (the last three on text samples: their
image processors need torchvision). Cohere2-Vision, Inkling 2, Inkling 2 Loop, Inkling,
Kimi-K2.5, MiniCPM-OCR, Gemma4-Unified, LFM2-VL, Apertus 1.5 and Molmo2 are built in
cases_pad_stand_a.py with their real processors and a stand-in for their image processors,
which need torchvision (each keeps the real one's keys, shapes and tokens per image; that
module says how). UDOP has one in test_udop_batches.py (padding refused on
both sides: its own padded batch changes a sample). The Omni thinkers (``qwen2_5_omni_thinker``,
``qwen3_omni_moe_thinker``) run inside the Omni cases. ``cases_pad_more_a.py`` builds Chameleon,
Emu3, BLIP, BLIP-2, IDEFICS, DeepSeek-OCR-2, dots3.note (images) and, with stand-ins, Fuyu (its
Pillow image processor patchifies arrays, where transformers 5.24's processor hands it tensors) and
Fun-ASR-Nano (its filterbank is computed with torchaudio). Florence-2, an encoder-decoder, has a
test of its own (test_encoder_decoder_batches.py), and so has Evolla (test_evolla_batches.py: its
processor takes proteins, tokenized by an ESM tokenizer, and chat messages, no text, and its text
decoder cross-attends each row to its protein, with no placeholder tokens). ``cases_voxtral.py``
builds Voxtral with its real processor and feature extractor and a stand-in for its tokenizer
backend, ``MistralCommonBackend``, which needs mistral-common: it writes each clip's
placeholders as mistral-common does (``[BEGIN_AUDIO]``, then 375 ``[AUDIO]`` a 30 s chunk).

Bound model types of transformers 5.24 without a model-level test here, and why:

- a processor built (torchvision_stand_in.py) but no model to run: perception_lm (its vision tower
  is a timm model, and timm needs torchvision);
- no text in the processor: pp_formulanet (an image-to-formula encoder-decoder: its processor
  takes images alone and returns no input_ids);
- fast_vlm: its vision tower is a timm model (``fastvit_mci3``), and timm needs torchvision, which
  the tests run without;
- vision-encoder-decoder: its processors (TrOCR's, Donut's...) give ``pixel_values`` and ``labels``,
  no ``input_ids``; its decoder counts its own positions from the labels it shifts, and the
  collators, which batch token ids to place their positions, refuse such a sample (no input_ids);
- a vision tower from timm, which needs torchvision: gemma3n;
- no sample to batch: diffusion_gemma (a block-diffusion model: its forward denoises a canvas of
  ``decoder_input_ids`` against an encoded prefix in its cache, which neither collator builds);
- its processor needs mistral-common beyond its tokenizer backend, and the tests run without it:
  voxtral_realtime (transformers gives a placeholder class for the processor without
  mistral-common; its ``__init__`` refuses any tokenizer but a ``MistralCommonBackend`` and reads
  its window, hop and delay tokens from mistral-common's audio config, and its ``__call__`` builds
  mistral-common's ``Audio`` and ``TranscriptionRequest`` itself. Its model has no placeholders
  either: it adds the audio's embeddings to every token's, one audio step per token);
- no training sample a collator batches: kyutai_speech_to_text (its forward takes the audio as
  codec codes stacked with the text on a last axis of ``input_ids``, ``(B, T, 1 + codebooks)``,
  which its codec computes inside ``generate``; the processor returns raw ``input_values``),
  pix2struct (its processor returns no ``input_ids``: the image's patches, with their own mask,
  are the encoder's whole input, the text its ``decoder_input_ids``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import assert_loss_and_gradients, cases, names, registered, tiny_model

from mmrope_core import CollateError, PackingUnsupportedError, RopeEngine
from mmrope_core.collators import PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential

SIDES = ("right", "left")
#: Model types whose own padded batch differs from its samples alone (an empty image slot takes
#: part in the cross-attention): the processor's batch through the model is the reference.
PROCESSOR_BATCH_IS_REFERENCE = {
    "mllama": "an empty image slot of a row takes part in its cross-attention",
    "dots3_note": "its indexer keeps a query's index_topk best-scored keys, and torch.topk tells keys scored alike "
                  "(a ReLU scores many 0) apart otherwise in a longer row: the model's own padded batch changes a "
                  "sample, on either side",
    "hy_v4_vl": "the model's own batch changes a sample: its processor's batch through the model gives a sample with "
                "an image other logits than alone (by 2.5e-5 in float64), the same as the collator's batch does",
}
#: Keys compared at the real tokens only, by model type: the processor fills them at padding tokens
#: too (Mllama's and IDEFICS's last image attends to the end of the padded row), which no real token reads.
AT_TOKENS_ONLY = {"mllama": {"cross_attention_mask"}, "idefics": {"image_attention_mask"}}
#: Keys a processor gives that the model takes and never reads: transformers 5.10's Fuyu processor
#: gives image_patches_indices, longer than the row and padded on the left whatever side is asked;
#: its model finds the image tokens by their id.
NEVER_READ = ("image_patches_indices",)
#: Keys a processor places from each row's start whatever side it pads (Kosmos-2.5's image places,
#: which its own left-padded batch puts on the padding): compared at the real tokens with its
#: right-padded batch's.
PLACED_FROM_THE_ROW_START = {"kosmos-2.5": {"image_embeds_position_mask"}}
#: Audio features compared at each clip's frames but its last: the processor's batch computes the
#: last frame of a shorter clip from a window reaching into its padding, which the clip alone never
#: has; the model reads only the frames the mask marks, and trains each sample as it comes alone.
FRAMES = {"input_features": ("feature_attention_mask", "input_features_mask")}
# float32 sums in another order (over padding, HY-V4-VL's eager attention): up to 2.5e-5 on small logits
LOGITS = {"rtol": 1e-4, "atol": 5e-5}
TEXT = "the cat sat on a mat"


def extra_cases():
    """Model types the plugins bind that have no example case, built here as the plugins build
    their cases: ``name -> (build() -> (processor, config), calls(processor, rng), overrides of
    the default config)``."""
    import transformers

    from mmrope_transformers.examples import build, samples
    from mmrope_transformers.specs import _IDEFICS_WORDS, Spec, available

    idefics2 = Spec("Idefics2 (idefics2)", "idefics2", "Idefics2Processor",
                    ("idefics2", "Idefics2ImageProcessorPil",
                     {"size": {"longest_edge": 56, "shortest_edge": 28}, "do_image_splitting": False}),
                    {"image_token": "<image>", "image_boundary_token": "<fake_token_around_image>",
                     "end_of_utterance_token": "<end_of_utterance>"},
                    {"image_token_id": "<image>"}, "<image>", words=_IDEFICS_WORDS,
                    processor_kwargs={"image_seq_len": 4}, images_in_a_list=True)
    found = {}
    if available(idefics2):  # the processor's tokens per image, patches that tile its images
        found[idefics2.name] = (functools.partial(build, idefics2), functools.partial(samples, idefics2),
                                (("perceiver_config.resampler_n_latents", 4), ("vision_config.patch_size", 14),
                                 ("vision_config.image_size", 56)))
    if "paligemma" in transformers.CONFIG_MAPPING:  # patches that tile its 28-pixel images
        found["PaliGemma (paligemma)"] = (paligemma, image_calls, (("vision_config.patch_size", 14),
                                                                   ("vision_config.image_size", 28)))
    if "qwen2_audio" in transformers.CONFIG_MAPPING:
        found["Qwen2-Audio (qwen2_audio)"] = (qwen2_audio, audio_calls, ())
    for model_type, processor_class, tokens, config_ids in AUDIO_MODELS:
        if model_type in transformers.CONFIG_MAPPING and hasattr(transformers, processor_class):
            found[f"{processor_class.removesuffix('Processor')} ({model_type})"] = (
                functools.partial(audio_model, model_type, processor_class, tokens, config_ids),
                functools.partial(audio_calls, audio_text=tokens["audio_token"]), ())
    for spec, overrides, attributes in more_specs():
        if available(spec):
            found[spec.name] = (functools.partial(build_setting, spec, attributes), functools.partial(samples, spec),
                                overrides)
    for module in CASE_MODULES:  # more model types, built in modules of their own
        found.update(importlib.import_module(module).extra_cases())
    return found


#: Modules beside this one whose ``extra_cases()`` returns more cases of the same shape.
CASE_MODULES: tuple[str, ...] = (
    "cases_pad_stand_a",
    "cases_pad_stand_b",
    "cases_pad_more_a",
    "cases_pad_more_b",
    "cases_pad_odd",
    "cases_voxtral",
)


@contextlib.contextmanager
def num2words_stand_in():
    """SmolVLM's processor refuses to be built without ``num2words``, which the tests run without
    and which it calls only to write a video's frame times: a stand-in that no image call reaches."""
    from transformers.models.smolvlm import processing_smolvlm

    def num2words(*args, **kwargs):
        raise AssertionError("num2words stand-in called: the tests give SmolVLM no videos")

    saved = processing_smolvlm.num2words
    processing_smolvlm.num2words = num2words
    try:
        yield
    finally:
        processing_smolvlm.num2words = saved


def video_llava_image_processor():
    import transformers

    from mmrope_transformers.specs import _LLAVA_IMAGE_PROCESSOR

    image_processor = getattr(transformers, "VideoLlavaImageProcessor", None)
    return None if image_processor is None else image_processor(**_LLAVA_IMAGE_PROCESSOR)


def build_setting(spec, attributes):
    """The spec's processor and config, ``attributes`` set on the processor (transformers 5.10's
    Janus processor takes its tokens per image from no argument)."""
    from mmrope_transformers.examples import build

    if spec.model_type == "smolvlm":  # its processor needs num2words at construction, for videos only
        with num2words_stand_in():
            processor, config = build(spec)
    else:
        processor, config = build(spec)
    for key, value in attributes.items():
        setattr(processor, key, value)
    return processor, config


def more_specs():
    """Specs of further model types the plugins bind, with the config values (dotted paths) that
    make their tiny models take what their real processors give."""
    from mmrope_transformers.specs import (
        _IDEFICS_TOKENS,
        _IDEFICS_WORDS,
        _LLAVA_IMAGE_PROCESSOR,
        _PINPOINTS,
        _QWEN_IMAGE,
        QWEN_IDS,
        QWEN_TOKENS,
        Spec,
    )

    llava = {"patch_size": 14, "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}
    pixtral = {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}
    return (
        (Spec("VipLLaVA (vipllava)", "vipllava", "LlavaProcessor", ("llava", "LlavaImageProcessorPil",
              _LLAVA_IMAGE_PROCESSOR), {"image_token": "<image>"}, {"image_token_index": "<image>"},
              processor_kwargs=llava), (("vision_feature_layers", [-2, -1]),), {}),  # of its two layers
        (Spec("LLaVA-NeXT-Video (llava_next_video)", "llava_next_video", "LlavaNextVideoProcessor",
              ("llava_next", "LlavaNextImageProcessorPil", {**_LLAVA_IMAGE_PROCESSOR, "image_grid_pinpoints": _PINPOINTS}),
              {"image_token": "<image>", "video_token": "<video>"},
              {"image_token_index": "<image>", "video_token_index": "<video>"}, video_processor=True,
              processor_kwargs=llava), (), {}),
        (Spec("LightOnOCR (lighton_ocr)", "lighton_ocr", "LightOnOcrProcessor",
              ("pixtral", "PixtralImageProcessorPil", {"size": {"longest_edge": 56}, "patch_size": 14}),
              pixtral, {"image_token_id": "[IMG]"},
              processor_kwargs={"patch_size": 14, "spatial_merge_size": 2}, sizes=(2, 4, 14)),
         (("vision_config.patch_size", 14), ("spatial_merge_size", 2)), {}),
        (Spec("GOT-OCR2 (got_ocr2)", "got_ocr2", "GotOcr2Processor",
              ("got_ocr2", "GotOcr2ImageProcessorPil", {"size": {"height": 56, "width": 56}}),
              {"image_token": "<imgpad>", "img_start": "<img>", "img_end": "</img>"}, {"image_token_index": "<imgpad>"},
              "<img>{image}</img>", call_kwargs={"num_image_tokens": 1}), (), {}),  # its tiny encoder's one feature
        (Spec("Qianfan-OCR (qianfan_ocr)", "qianfan_ocr", "QianfanOCRProcessor",
              ("got_ocr2", "GotOcr2ImageProcessorPil", {"size": {"height": 56, "width": 56}}),
              {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
               "image_placeholder": "<image>"}, {"image_token_id": "<IMG_CONTEXT>"}, "<image>",
              processor_kwargs={"image_seq_length": 4}), (), {}),
        (Spec("Ovis2 (ovis2)", "ovis2", "Ovis2Processor", ("ovis2", "Ovis2ImageProcessorPil",
              {"size": {"height": 56, "width": 56}}),
              {"image_token": "<image>", **{f"t{index}": token for index, token in enumerate(
                  ("<IMG_START>", "<IMG_ATOM>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"))}},
              {"image_token_id": "<IMG_ATOM>"}, "<image>", processor_kwargs={"image_seq_length": 16}), (), {}),
        (Spec("Janus (janus)", "janus", "JanusProcessor", ("janus", "JanusImageProcessorPil",
              {"size": {"height": 56, "width": 56}}),
              {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"},
              {"image_token_id": "<image_placeholder>"}, "<image_placeholder>",
              processor_kwargs={"num_image_tokens": 16}),
         (("vision_config.patch_size", 14), ("vision_config.num_image_tokens", 16)), {"num_image_tokens": 16}),
        (Spec("DeepSeek-VL (deepseek_vl)", "deepseek_vl", "DeepseekVLProcessor", ("deepseek_vl",
              "DeepseekVLImageProcessorPil", {"size": {"height": 56, "width": 56}}),
              {"image_token": "<image_placeholder>"}, {"image_token_id": "<image_placeholder>"}, "<image_placeholder>",
              processor_kwargs={"num_image_tokens": 16}), (("vision_config.patch_size", 14),), {}),
        (Spec("Granite-Docling (granite_docling)", "granite_docling", "GraniteDoclingProcessor",
              ("granite_docling", "GraniteDoclingImageProcessorPil",
               {"size": {"height": 56, "width": 56}}),
              {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
               "global_image_token": "<global-img>"}, {"image_token_id": "<image>"}, "<image>",
              words=("<row_1_col_1>", "<row_1_col_2>", "<row_2_col_1>", "<row_2_col_2>"),
              processor_kwargs={"image_seq_len": 4}, images_in_a_list=True),
         (("vision_config.patch_size", 14), ("vision_config.scale_factor", 2)), {}),  # 4 tokens a 56-pixel tile
        (Spec("VideoLLaMA3 (video_llama_3)", "video_llama_3", "VideoLlama3Processor",
              ("video_llama_3", "VideoLlama3ImageProcessorPil", {}),
              {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
              {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}, "<|image_pad|>",
              video_processor=True, sizes=(2, 4, 28)), (), {}),
        (Spec("DeepSeek-VL-Hybrid (deepseek_vl_hybrid)", "deepseek_vl_hybrid", "DeepseekVLHybridProcessor",
              ("deepseek_vl_hybrid", "DeepseekVLHybridImageProcessorPil",
               {"size": {"height": 56, "width": 56}, "high_res_size": {"height": 56, "width": 56}}),
              {"image_token": "<image_placeholder>"}, {"image_token_id": "<image_placeholder>"}, "<image_placeholder>",
              processor_kwargs={"num_image_tokens": 16}),
         (("vision_config.patch_size", 14), ("high_res_vision_config.global_attn_indexes", [0, 1])), {}),
        (Spec("Aya Vision (aya_vision)", "aya_vision", "AyaVisionProcessor",
              ("got_ocr2", "GotOcr2ImageProcessorPil", {"size": {"height": 56, "width": 56}}),
              {"image_token": "<image>", "start_of_img_token": "<|START_OF_IMG|>", "end_of_img_token": "<|END_OF_IMG|>",
               "img_patch_token": "<|IMG_PATCH|>", "img_line_break_token": "<|IMG_LINE_BREAK|>",
               "tile_token": "TILE", "tile_global_token": "TILE_GLOBAL"},
              {"image_token_index": "<|IMG_PATCH|>"}, "<image>",
              processor_kwargs={"patch_size": 14, "img_size": 56, "downsample_factor": 1}),
         (("downsample_factor", 1),), {}),
        (Spec("MiniCPM-V 4.6 (minicpmv4_6)", "minicpmv4_6", "MiniCPMV4_6Processor",
              ("minicpmv4_6", "MiniCPMV4_6ImageProcessorPil", {"scale_resolution": 112}),
              {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "image_start_token": "<image>",
               "image_end_token": "</image>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
               "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"},
              {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"},
              words=tuple("0123456789"), video_processor=True, sizes=(2, 8, 28), newline_token=True,
              video_processor_attributes={"slice_mode": True, "downsample_mode": "16x"}),
         (("vision_config.patch_size", 14),), {}),
        # stand-in for PixtralProcessor, which needs torchvision: LightOnOCR's processor places
        # Pixtral's tokens by the same rule (rows of [IMG] ending in [IMG_BREAK], the last [IMG_END])
        # over the same image processor (images whose sides are multiples of patch_size *
        # spatial_merge_size, to which PixtralProcessor has it resize)
        (Spec("Mistral3 (mistral3)", "mistral3", "LightOnOcrProcessor",
              ("pixtral", "PixtralImageProcessorPil", {"size": {"longest_edge": 56}, "patch_size": 14}),
              pixtral, {"image_token_index": "[IMG]"},
              processor_kwargs={"patch_size": 14, "spatial_merge_size": 2}, sizes=(1, 2, 28)),
         (("vision_config.patch_size", 14), ("spatial_merge_size", 2)), {}),
        (Spec("SmolVLM (smolvlm)", "smolvlm", "SmolVLMProcessor",
              ("smolvlm", "SmolVLMImageProcessorPil",
               {"size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56}}),
              _IDEFICS_TOKENS, {"image_token_id": "<image>"}, "<image>", words=_IDEFICS_WORDS, video_processor=True,
              processor_kwargs={"image_seq_len": 4}, images_in_a_list=True),
         (("vision_config.patch_size", 14),), {}),
        # its own image processor (no Pillow module of its own) set in place of the CLIP one built
        (Spec("Video-LLaVA (video_llava)", "video_llava", "VideoLlavaProcessor",
              ("llava", "LlavaImageProcessorPil", _LLAVA_IMAGE_PROCESSOR),
              {"image_token": "<image>", "video_token": "<video>"},
              {"image_token_index": "<image>", "video_token_index": "<video>"}, video_processor=True,
              processor_kwargs=llava), (("vision_config.image_size", 56),),
         {"image_processor": video_llava_image_processor()}),
        (Spec("HyperCLOVAX-Vision-V2 (hyperclovax_vision_v2)", "hyperclovax_vision_v2", "HyperCLOVAXVisionV2Processor",
              ("qwen2_vl", "Qwen2VLImageProcessorPil", {}), QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE,
              video_processor=True), (("vision_config.patch_size", 14),), {}),
        (Spec("LFM3-VL (lfm3_vl)", "lfm3_vl", "Lfm3VlProcessor", ("qwen2_vl", "Qwen2VLImageProcessorPil", {}),
              QWEN_TOKENS, QWEN_IDS, _QWEN_IMAGE, video_processor=True), (("vision_config.patch_size", 14),), {}),
    )


AUDIO_TOKENS = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}


def qwen2_audio():
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(AUDIO_TOKENS)
    processor = transformers.Qwen2AudioProcessor(feature_extractor=transformers.WhisperFeatureExtractor(),
                                                 tokenizer=tokenizer)
    config = transformers.AutoConfig.for_model("qwen2_audio")
    config.audio_token_id = tokenizer.convert_tokens_to_ids(AUDIO_TOKENS["audio_token"])
    return processor, config


#: Audio-language models built as Qwen2-Audio is, on Whisper's features:
#: ``(model type, processor class, tokenizer's tokens, config id -> token)``.
AUDIO_MODELS = (
    ("glmasr", "GlmAsrProcessor", {"audio_token": "<|pad|>"}, {"audio_token_id": "<|pad|>"}),
    ("qwen3_asr", "Qwen3ASRProcessor", {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                                         "audio_eos_token": "<|audio_end|>"}, {"audio_token_id": "<|audio_pad|>"}),
)


def audio_model(model_type, processor_class, tokens, config_ids):
    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(tokens)
    extractor = getattr(transformers, FEATURE_EXTRACTOR_MAPPING_NAMES[model_type])()
    processor = getattr(transformers, processor_class)(extractor, tokenizer)
    config = transformers.AutoConfig.for_model(model_type)
    for key, token in config_ids.items():
        setattr(config, key, tokenizer.convert_tokens_to_ids(token))
    return processor, config


def paligemma():
    import transformers
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>", "bos_token": "<bos>"})
    image_processor = SiglipImageProcessorPil(size={"height": 28, "width": 28})
    image_processor.image_seq_length = 4  # what the processor reads: tokens per image
    processor = transformers.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = transformers.AutoConfig.for_model("paligemma")
    config.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    return processor, config


def image_calls(processor, rng):
    """Two samples with an image each (PaliGemma's processor places its image tokens itself)."""
    from mmrope_core.tiny import filler_text, random_image

    return [{"text": [filler_text(rng, count)], "images": [random_image(rng, 28, 28)], "return_tensors": "pt"}
            for count in (4, 2)]


def audio_calls(processor, rng, audio_text=None):
    """Two samples with an audio clip each, of 1 and 2 seconds."""
    import numpy as np

    from mmrope_core.tiny import filler_text

    audio = audio_text or f"{AUDIO_TOKENS['audio_bos_token']}{AUDIO_TOKENS['audio_token']}{AUDIO_TOKENS['audio_eos_token']}"
    return [{"text": [f"{filler_text(rng, 2)} {audio} {filler_text(rng, 3)}"],
             "audio": [np.sin(np.arange(16000 * seconds) / rng.uniform(5, 40)).astype(np.float32)],
             "return_tensors": "pt"} for seconds in (1, 2)]


EXTRA = extra_cases()


@functools.cache
def case(name):
    tiny = tiny_model(name) if name not in EXTRA else tiny_of_spec(name)
    return tiny, RopeEngine.from_processor(tiny.processor, tiny.config)


#: 1-D models whose text model's rotary embedding holds M-RoPE sections by default, which it
#: applies to 1-D positions repeated on every row: stating them in the config would make it ask for
#: M-RoPE positions, which its forward never computes.
ONE_D_ROTARY_SECTIONS = {"minicpmv4_6", "minicpm_ocr"}
#: Models with a sub-model that transformers refuses sdpa for (Apertus 1.5's vision tokenizer).
EAGER = {"apertus1p5"}


def tiny_of_spec(name):
    from tiny_models import TinyModel, _enliven, _fit_rope_sections, _model_class, _tiny_config

    build, calls, overrides = EXTRA[name]
    processor, config = build()
    # PaliGemma's processor gives labels masking the whole prompt (no suffix): the ids are the
    # labels here, as for every other case
    samples = [{key: value for key, value in processor(**call).items() if key != "labels"}
               for call in calls(processor, random.Random(0))]
    tiny = _tiny_config(config, processor, samples, overrides)
    model_class = _model_class(tiny)
    tiny._attn_implementation = "eager" if tiny.model_type in EAGER else attention_of(model_class, tiny)
    if tiny.model_type not in ONE_D_ROTARY_SECTIONS:
        _fit_rope_sections(model_class, tiny)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(tiny).eval()
        _enliven(model)
    return TinyModel(name, processor, tiny, model, samples, (), {}, {})


def attention_of(model_class, config):
    """sdpa where the model and every part of it take it (transformers 5.10's BLIP-2 and
    InstructBLIP Q-Formers do not, their models do), else eager."""
    if not getattr(model_class, "_supports_sdpa", True):
        return "eager"
    config._attn_implementation = "sdpa"
    try:
        with torch.device("meta"):
            model_class(config)
    except ValueError as refused:
        if not any(said in str(refused) for said in ("does not support an attention implementation",
                                                      "scaled_dot_product_attention")):
            raise
        return "eager"
    return "sdpa"


def samples_calls(name, processor):
    if name in EXTRA:
        return EXTRA[name][1](processor, random.Random(0))
    return cases()[name].samples(processor, random.Random(0))


MEDIA = ("images", "videos", "audio")


def media_arguments(tiny):
    """The media arguments of the case's processor: transformers' :data:`MEDIA`; a model type a
    plugin registers names its own, the named arguments of its processor's call beside ``text``
    that default to None (Storyboard's ``boards``)."""
    if not registered(tiny.config):
        return MEDIA
    parameters = inspect.signature(type(tiny.processor).__call__).parameters
    return tuple(name for name, parameter in parameters.items() if name != "text" and parameter.default is None)


def calls_of(tiny):
    """The processor calls of the case's samples, and one of text alone (the last sample)."""
    calls = [dict(call) for call in samples_calls(tiny.name, tiny.processor)]
    rest = {key: value for key, value in calls[0].items() if key not in ("text", *media_arguments(tiny))}
    return [*calls, {**rest, "text": [TEXT]}]


def samples_of(tiny):
    if not takes_text_beside_images(tiny.name):
        return list(tiny.samples)
    return [*tiny.samples, dict(tiny.processor(**calls_of(tiny)[-1]))]


#: Model types whose forward takes no sample without its image (``pixel_values`` is a required
#: argument): they train no text-only sample, padded or packed.
NEEDS_MEDIA = {"blip", "blip-2"}
#: What processors say when they refuse a text-only sample, alone (PaliGemma's) or beside samples
#: with images (transformers 5.10's Mllama's, Kosmos-2's): their batches then hold none.
NO_TEXT_ONLY = ("at least one image per sample", "`images` are expected", "they must match 1:1",
                "needs images to classify", "required positional argument: 'audio'",
                "`texts` and `images` should be the same")
#: Model types whose processor takes no sample without its media (GOT-OCR2's writes each prompt
#: around its image: transformers 5.24 says so, 5.10 fails loading the missing image; Qwen3-ASR's
#: requires its audio argument, PP-Chart2Table's both, Kosmos-2.5's its images; InstructBLIP's
#: gives every row of a batch with images the image's tokens; Fuyu's pairs texts with images,
#: dropping the texts past them), and those whose model takes none (:data:`NEEDS_MEDIA`).
MEDIA_EVERY_SAMPLE = {"got_ocr2", "qwen3_asr", "pp_chart2table", "kosmos-2.5", "instructblip", "instructblipvideo",
                      "fuyu", *NEEDS_MEDIA}


@functools.cache
def takes_text_beside_images(name):
    """Whether the processor batches a text-only sample beside samples with images. GLM-Image's
    refuses it, and so must the collator (:func:`refused_typed`)."""
    tiny = case(name)[0]
    if tiny.config.model_type == "glm_image":
        return True
    if tiny.config.model_type in MEDIA_EVERY_SAMPLE:
        return False
    try:
        tiny.processor(**calls_of(tiny)[-1])
        processor_batch(tiny, calls_of(tiny), "right")
    except (ValueError, TypeError) as refused:  # TypeError: transformers 5.10's VibeVoice-ASR requires audio
        if not any(message in str(refused) for message in NO_TEXT_ONLY):
            raise
        return False
    return True


#: Processors that place the padding their own way: BLIP-2's pads the text before prepending its
#: query tokens (its left-padded rows hold the padding after them), Fuyu's pads on the left whatever
#: side is asked. The reference moves it to the side asked, where the collator puts it; the model
#: reads its positions from the mask either way.
PADS_ITS_OWN_WAY = {"blip-2", "fuyu"}


def processor_batch(tiny, calls, side):
    """The processor's own batched call on the samples' texts and media, padded on ``side``."""
    batch = _processor_batch(tiny, calls, side)
    if tiny.config.model_type in PADS_ITS_OWN_WAY:
        mask = batch["attention_mask"].long()
        order = (mask if side == "left" else 1 - mask).argsort(dim=1, stable=True)  # tokens kept in order
        batch.update({key: batch[key].gather(1, order) for key in ("input_ids", "attention_mask")})
    return batch


def _processor_batch(tiny, calls, side):
    media, kinds = {}, media_arguments(tiny)
    for kind in kinds:
        if any(kind in call for call in calls):
            nested = any(isinstance(call.get(kind, [None])[0], list) for call in calls)
            media[kind] = ([call[kind][0] if kind in call else [] for call in calls] if nested
                           else [item for call in calls for item in call.get(kind, ())])
    texts = [text for call in calls for text in call["text"]]
    rest = {key: value for key, value in calls[0].items() if key not in ("text", "return_tensors", *kinds)}
    padding = {"padding": True, "padding_side": side}
    if tiny.config.model_type in PADS_ONLY_THE_TEXT:
        padding = {"text_kwargs": padding}
    parameters = inspect.signature(tiny.processor.__call__).parameters
    if not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
        padding = {"padding": True}  # a processor taking no padding_side (transformers 5.10's Video-LLaVA)
    # and its tokenizer's side: Kosmos-2's processor pads a batch with images on it, whatever it is told
    tokenizer = tiny.processor.tokenizer
    saved, tokenizer.padding_side = tokenizer.padding_side, side
    try:
        return dict(tiny.processor(text=texts, **media, **padding, return_tensors="pt", **rest))
    finally:
        tokenizer.padding_side = saved


#: Processors that hand ``padding`` to their feature extractor too: the batch's clips padded to the
#: longest instead of the 30 s each sample gets alone (which the encoder then reads differently).
#: The reference pads only the text, as the samples' own clips are padded.
PADS_ONLY_THE_TEXT = {"glmasr"}


def alone(model, sample):
    """The sample's logits and its summed token loss, the model computing its own positions."""
    labels = sample["input_ids"]
    out = model(**sample, use_cache=False)
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1].float(), labels[0, 1:], reduction="sum")
    return out.logits[0], loss, labels.shape[1] - 1


def refused_typed(tiny, engine, samples):
    """Samples the model cannot take in one batch are refused at the call, typed."""
    if tiny.config.model_type == "glm_image":  # a text-to-image sample beside image-to-image ones
        with pytest.raises(CollateError, match="sample 2 has no 'pixel_values'"):
            PaddedCollator(engine)(samples)
        return samples[:-1]
    return samples


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", [*names(), *EXTRA])
def test_a_padded_batch_trains_as_its_samples_alone(name, side):
    tiny, engine = case(name)
    model = tiny.model
    samples = refused_typed(tiny, engine, samples_of(tiny))
    batch = PaddedCollator(engine, padding_side=side)(samples)
    equals_the_processors_batch(tiny, batch, calls_of(tiny)[:len(samples)], side)
    mask = batch["attention_mask"].bool()
    model_type = tiny.config.model_type
    reference = None
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits
        if model_type in PROCESSOR_BATCH_IS_REFERENCE:  # the model computing its positions on it
            reference = processor_batch(tiny, calls_of(tiny)[:len(samples)], side)
            theirs = model(**reference, use_cache=False).logits
            torch.testing.assert_close(logits[mask], theirs[mask], **LOGITS)
        else:
            for index, sample in enumerate(samples):
                own = alone(model, sample)[0]
                torch.testing.assert_close(logits[index][mask[index]], own, **LOGITS,
                                           msg=lambda m, index=index: f"sample {index}: {m}")
    # the loss and its gradients: the samples' summed token losses over their token count (or the
    # processor's batch's loss, on the same labels)
    model.zero_grad(set_to_none=True)
    if reference is None:
        losses = [alone(model, sample)[1:] for sample in samples]
        expected = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    else:
        expected = model(**reference, labels=batch["labels"], use_cache=False).loss
    assert_loss_and_gradients(model, expected, lambda: model(**batch, use_cache=False).loss)


#: Model types whose processor's left-padded batch gives a sample other logits than alone: the
#: collator's left batch is the processor's right one with each row's tokens moved to its end.
LEFT_BATCH_DIFFERS = dict.fromkeys(
    ("instructblip", "instructblipvideo"),
    "the processor pads the Q-Former's instruction on the left too, shifting its absolute positions (a sample's "
    "logits differ by 1e-3), and puts the query tokens before the padding")


def equals_the_processors_batch(tiny, batch, calls, side):
    """Every key of the processor's batched call, in the collator's batch, equal."""
    if side == "left" and tiny.config.model_type in LEFT_BATCH_DIFFERS:
        reference = processor_batch(tiny, calls, "right")
        for key in ("input_ids", "attention_mask"):
            reference[key] = torch.stack([row.roll(int((mask == 0).sum())) for row, mask
                                          in zip(reference[key], reference["attention_mask"])])
    else:
        reference = processor_batch(tiny, calls, side)
    mask = reference["attention_mask"].bool()
    torch.testing.assert_close(batch["input_ids"], reference["input_ids"], rtol=0, atol=0)
    torch.testing.assert_close(batch["attention_mask"], reference["attention_mask"].to(batch["attention_mask"].dtype),
                               rtol=0, atol=0)
    for key, value in reference.items():
        if not isinstance(value, torch.Tensor) or key in ("input_ids", "attention_mask", "labels", *NEVER_READ):
            continue
        assert key in batch, f"{key}: in the processor's batch, not in the collator's"
        mine = batch[key]
        assert mine.shape == value.shape, f"{key}: {tuple(mine.shape)}, the processor's {tuple(value.shape)}"
        if side == "left" and key in PLACED_FROM_THE_ROW_START.get(tiny.config.model_type, ()):
            right = processor_batch(tiny, calls, "right")
            value = right[key][right["attention_mask"].bool()]
            mine = mine[mask]
        if key in AT_TOKENS_ONLY.get(tiny.config.model_type, ()):
            mine, value = mine[mask], value[mask]
        if key in FRAMES and any(mask_key in reference for mask_key in FRAMES[key]):  # else each clip alone: whole
            frames = next(reference[mask_key] for mask_key in FRAMES[key] if mask_key in reference).sum(-1)
            for row, count in enumerate(frames.tolist()):
                torch.testing.assert_close(mine[row, ..., :count - 1], value[row, ..., :count - 1], rtol=0, atol=0,
                                           msg=lambda m, row=row, key=key: f"{key} of clip {row}: {m}")
            continue
        torch.testing.assert_close(mine, value.to(mine.dtype), rtol=0, atol=0, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", [name for name in names() if name.startswith("HunYuan-VL")])  # not in 5.10
def test_hunyuan_vl_samples_with_images_train_as_alone_wherever_they_stand(name, side):
    """Its get_rope_index numbers the batch's images across rows: the second sample with an image
    gets other positions in the model's own batch than alone; the collator's are each alone."""
    tiny, engine = case(name)
    samples = [tiny.samples[0], tiny.samples[1], tiny.samples[0]]
    batch = PaddedCollator(engine, padding_side=side)(samples)
    assert batch["position_ids"].shape[0] == 4  # its xD-RoPE rows, no text row
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        logits = tiny.model(**batch, use_cache=False).logits
        own = alone(tiny.model, samples[2])[0]
        torch.testing.assert_close(logits[2][mask[2]], own, **LOGITS)
        theirs = tiny.model(**{key: value for key, value in batch.items() if key != "position_ids"},
                            use_cache=False).logits  # the model numbering the images itself
        assert not torch.allclose(theirs[2][mask[2]], own, **LOGITS)


#: Cases whose media a packed row batches otherwise than on dim 0 (one strip for all samples).
PACKED_MEDIA = [*(name for name in names() if cases()[name].name.startswith("MiniCPM-V")),
                *(name for name in EXTRA if name.startswith("MiniCPM-OCR"))]


@pytest.mark.parametrize("name", PACKED_MEDIA)
def test_a_packed_row_takes_its_media_as_the_model_does_or_is_refused(name):
    tiny, engine = case(name)
    samples = [{**sample, "labels": sample["input_ids"]} for sample in tiny.samples]
    reference = processor_batch(tiny, calls_of(tiny)[:len(samples)], "right")
    media = engine.collate([{key: value for key, value in sample.items()
                             if key in ("pixel_values", "target_sizes")} for sample in samples])
    for key, value in media.items():  # what a packed row hands the model: the processor's batch
        torch.testing.assert_close(value, reference[key].to(value.dtype), rtol=0, atol=0)
    try:
        collator = PackedCollator(engine)
    except PackingUnsupportedError as refused:  # its layers' reason (linear attention, no kernels)
        assert tiny.config.model_type in str(refused)
        return
    batch = collator(samples)
    with torch.no_grad():
        logits = tiny.model(**batch).logits[0]
        start = 0
        for index, sample in enumerate(samples):
            length = sample["input_ids"].shape[1]
            torch.testing.assert_close(logits[start:start + length], alone(tiny.model, tiny.samples[index])[0],
                                       **LOGITS, msg=lambda m, index=index: f"sample {index}: {m}")
            start += length
        losses = [alone(tiny.model, sample)[1:] for sample in tiny.samples]
        expected = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
        torch.testing.assert_close(tiny.model(**batch).loss, expected, rtol=1e-5, atol=1e-6)


#: In a child process: the linear-attention kernels MiniCPM-V 4.7's and MiniCPM-OCR's layers need
#: for packed rows (CUDA only) replaced by the stand-ins of ``stand_in_kernels/`` (see test_linear_attention_kernels.py).
CHILD = f"""
import sys
sys.path[:0] = [{str(Path(__file__).parent / "stand_in_kernels")!r}, {str(Path(__file__).parent)!r}]
import torch
import transformers.utils.import_utils as import_utils
import_utils.is_flash_linear_attention_available = lambda: True
import_utils.is_causal_conv1d_available = lambda: True
torch.cuda.current_device = lambda: 0
import test_padded_batches as tests
from mmrope_core.collators import PackedCollator
for name in {PACKED_MEDIA!r}:
    PackedCollator(tests.case(name)[1])  # accepted: its layers get their kernels, its positions are probed
    tests.test_a_packed_row_takes_its_media_as_the_model_does_or_is_refused(name)
    print(name, "packs exactly")
"""


def test_a_packed_minicpm_v_row_trains_exactly_once_its_kernels_take_the_boundaries():
    """With the kernels its layers need, MiniCPM-V 4.7's (and MiniCPM-OCR's) packed row is
    accepted (its positions are shown to be each sample's alone by the plugin's probe) and trains
    each sample as alone."""
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for name in PACKED_MEDIA:
        assert f"{name} packs exactly" in result.stdout


# -- model types without an example case --------------------------------------------------------
# Their own image processors need torchvision, which the tests run without: the samples are text
# (what the padding side changes does not depend on images), and the engine is built from the
# Mllama case's processor as a stand-in, which only tokenizes; GIT's processor is its own.


def tiny_of(model_type, **values):
    """A tiny random model of ``model_type``'s default config, ``values`` (dotted paths) set after
    shrinking, and the config."""
    import transformers
    from tiny_models import _enliven, _model_class, _shrink

    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model type {model_type}")
    config = transformers.AutoConfig.for_model(model_type).to_dict()
    _shrink(config)
    for path, value in values.items():
        *parents, last = path.split(".")
        tree = config
        for parent in parents:
            tree = tree[parent]
        tree[last] = value
    config = transformers.AutoConfig.for_model(model_type).__class__.from_dict(config)
    model_class = _model_class(config)
    config._attn_implementation = "sdpa" if getattr(model_class, "_supports_sdpa", True) else "eager"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config).eval()
        _enliven(model)
    return config, model


def text_samples(length=(9, 5)):
    generator = torch.Generator().manual_seed(0)
    samples = []
    for count in length:
        ids = torch.randint(3, 60, (1, count), generator=generator)
        samples.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    return samples


def logits_differ_on_the_left(model, engine, samples, forward=None):
    """Each sample's logits at its tokens in a right- and a left-padded batch against alone:
    (right equal, left's largest difference)."""
    forward = forward or (lambda **batch: model(**batch, use_cache=False).logits)
    differences = {}
    for side in SIDES:
        ids, mask, _ = engine.batch(samples, padding_side=side)
        positions = engine.compute_position_ids(ids, mask, {})
        with torch.no_grad():
            logits = forward(input_ids=ids, attention_mask=mask, position_ids=positions)
            differences[side] = max(float((logits[row][mask[row].bool()] - forward(**sample)[0]).abs().max())
                                    for row, sample in enumerate(samples))
    return differences


def test_llama4_left_padding_is_refused_where_its_nope_layers_read_the_slot():
    from mmrope_core import PaddingUnsupportedError

    # rows longer than floor_scale get another attention temperature in NoPE layers
    config, _ = tiny_of("llama4", **{"text_config.floor_scale": 2, "text_config.attn_scale": 1.0,
                                     "text_config.vocab_size": 64})
    import transformers

    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(config.text_config).eval()
    engine = RopeEngine.from_processor(tiny_model("Mllama (mllama)").processor, config)
    with pytest.raises(PaddingUnsupportedError, match=r"NoPE layers .* floor_scale=2"):
        PaddedCollator(engine, padding_side="left")
    differences = logits_differ_on_the_left(model, engine, text_samples())
    assert differences["right"] < 1e-5 and differences["left"] > 1e-4, differences
    PaddedCollator(engine, padding_side="right")  # the side it trains exactly


def test_minimax_m3_left_padding_is_refused_where_its_sparse_indexer_reads_the_slot():
    from mmrope_core import PaddingUnsupportedError

    config, model = tiny_of("minimax_m3_vl", **{
        "text_config.vocab_size": 64, "text_config.layer_types": ["minimax_m3_sparse", "full_attention"],
        "text_config.index_block_size": 2, "text_config.index_topk_blocks": 1, "text_config.index_local_blocks": 1})
    engine = RopeEngine.from_processor(tiny_model("Mllama (mllama)").processor, config)
    with pytest.raises(PaddingUnsupportedError, match="sparse indexer"):
        PaddedCollator(engine, padding_side="left")
    differences = logits_differ_on_the_left(model, engine, text_samples((11, 4)))
    assert differences["right"] < 1e-5 and differences["left"] > 1e-4, differences


@pytest.mark.parametrize("side", SIDES)
def test_t5gemma2_labels_are_padded_right_as_its_decoder_reads_them(side):
    config, model = tiny_of("t5gemma2", **{"encoder.text_config.vocab_size": 64, "decoder.vocab_size": 64})
    engine = RopeEngine.from_processor(tiny_model("Gemma3 (gemma3)").processor, config)
    samples = text_samples()
    batch = PaddedCollator(engine, padding_side=side)(samples)
    assert all(bool((row[:sample["input_ids"].shape[1]] == sample["input_ids"][0]).all())
               for row, sample in zip(batch["labels"], samples))
    with torch.no_grad():
        logits = model(**batch).logits
        for row, sample in enumerate(samples):
            own = model(**sample, labels=sample["input_ids"]).logits[0]
            torch.testing.assert_close(logits[row, :own.shape[0]], own, **LOGITS)


def git_case():
    import transformers
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mmrope_core.tiny import FILLER_WORDS, random_image, word_level_tokenizer

    tokenizer = word_level_tokenizer({}, words=FILLER_WORDS)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = transformers.GitProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config, model = tiny_of("git", **{"vocab_size": len(tokenizer), "vision_config.image_size": 28,
                                      "vision_config.patch_size": 14})
    rng = random.Random(0)
    samples = [dict(processor(text=[text], images=[random_image(rng, 28, 28)], return_tensors="pt"))
               for text in ("the cat sat on the mat", "a cat")]
    text = dict(processor(text=["the mat"], return_tensors="pt"))
    return processor, config, model, samples, text


@pytest.mark.parametrize("side", SIDES)
def test_git_prepends_each_rows_image_and_refuses_a_row_without_one(side):
    processor, config, model, samples, text = git_case()
    engine = RopeEngine.from_processor(processor, config)
    batch = PaddedCollator(engine, padding_side=side)(samples)
    torch.testing.assert_close(batch["pixel_values"], torch.cat([sample["pixel_values"] for sample in samples]))
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        logits = model(**batch).logits[:, -mask.shape[1]:]  # the image's tokens come first in every row
        for row, sample in enumerate(samples):
            own = model(**sample).logits[0, -sample["input_ids"].shape[1]:]
            torch.testing.assert_close(logits[row][mask[row]], own, **LOGITS)
    with pytest.raises(CollateError, match=r"sample 2 has no .pixel_values.*places each row.s pixel_values itself"):
        PaddedCollator(engine, padding_side=side)([*samples, text])
    with pytest.raises(PackingUnsupportedError, match="git"):  # the layers' reason, or the media's
        PackedCollator(engine)
