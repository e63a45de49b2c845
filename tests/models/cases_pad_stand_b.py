"""Model types whose only image processor needs torchvision, built for the model-level collator
tests (test_padded_batches.py, test_packed_rows.py) with their real processors: Muse Glimmer,
Muse Spark, Nemotron-H Omni, Phi-4-multimodal, Step-3.7 and Unlimited-OCR.

Each is the model type's real processor class with a word-level tokenizer, its real audio
feature extractor (numpy) where it has one, and its real image processor class from
:mod:`torchvision_stand_in`: the stand-in replaces only the torchvision kernels the class calls
(resize, pad, crop, normalize), which the tests run without, by torch ones. The class's own code
plans the tiles and crops, counts each image's tokens, and returns and batches its keys, so the
keys, shapes, dtypes and tokens per image are the real processor's; only pixel values differ from
torchvision's resampling. Where a default config does not fit the tiny sizes or the processor,
the case's overrides say what is set and why.
"""

from __future__ import annotations

import functools
from typing import Any

from tiny_models import WIDTH
from torchvision_stand_in import image_processor_class

#: Muse Glimmer's processor names its tokens itself; the tokenizer must hold them.
MUSE_TOKENS = {"image_token": "<|patch|>", "image_start_token": "<|image_start|>", "image_end_token": "<|image_end|>",
               "video_token": "<|video|>", "video_sep_token": "<|vid_frame_separator|>",
               "video_start_token": "<|vid_start|>", "video_end_token": "<|vid_end|>"}
#: Muse Spark's processor takes them from its tokenizer, with these defaults, and its audio ones.
SPARK_TOKENS = {**MUSE_TOKENS, "audio_token": "<|audio|>", "audio_start_token": "<|soft_audio_start|>",
                "audio_end_token": "<|soft_audio_end|>"}
#: Step-3.7's processor writes these around each image's crops and global view.
STEP_TOKENS = {"image_token": "<im_patch>", **{name: f"<{name}>" for name in (
    "patch_start", "patch_end", "patch_newline", "im_start", "im_end")}}
#: The checkpoints' image and audio placeholders.
PHI4_TOKENS = {"image_token": "<|endoftext10|>", "audio_token": "<|endoftext11|>"}
#: Nemotron-H Omni's processor reads these from its tokenizer, with these defaults.
NEMOTRON_TOKENS = {"image_token": "<image>", "video_token": "<video>", "audio_token": "<so_embedding>",
                   "image_start_token": "<img>", "image_end_token": "</img>", "audio_start_token": "<so_start>",
                   "audio_end_token": "<so_end>"}


def extra_cases() -> dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]]:
    """``name -> (build() -> (processor, config), calls(processor, rng), overrides)`` of each
    model type the installed transformers has."""
    import transformers

    from mmrope_transformers.examples import samples
    from mmrope_transformers.specs import Spec

    found: dict[str, tuple[Any, Any, tuple[tuple[str, Any], ...]]] = {}
    if "muse_glimmer" in transformers.CONFIG_MAPPING:
        spec = Spec("Muse Glimmer (muse_glimmer)", "muse_glimmer", "MuseGlimmerProcessor", ("", "", {}), MUSE_TOKENS,
                    sizes=(1, 3, 28))
        # its pixel shuffle joins each 2x2 of vision features: the adapter takes 4 times the vision width
        found[spec.name] = (muse_glimmer, functools.partial(samples, spec), (("out_hidden_size", 4 * WIDTH),))
    if "muse_spark" in transformers.CONFIG_MAPPING:
        spec = Spec("Muse Spark (muse_spark)", "muse_spark", "MuseSparkProcessor", ("", "", {}), MUSE_TOKENS,
                    sizes=(1, 3, 28))
        # its audio encoder's four stages together take 1920 samples a token: all kept, one block each
        found[spec.name] = (muse_spark, functools.partial(with_audio, functools.partial(samples, spec)),
                            (("out_hidden_size", 4 * WIDTH), ("audio_config.num_hidden_layers", 4),
                             ("audio_config.patch_sizes", [16, 6, 5, 4]), ("audio_config.depths", [1] * 4),
                             ("audio_config.hidden_sizes", [WIDTH] * 4)))
    if "step3p7" in transformers.CONFIG_MAPPING:
        spec = Spec("Step-3.7 (step3p7)", "step3p7", "Step3p7Processor", ("", "", {}), STEP_TOKENS, sizes=(1, 3, 56))
        # a global view of 112 pixels, as the processor has it; its text model builds a sliding-window
        # mask whatever its layers are, and the default config sets no window: a window of 8 tokens,
        # on a layer of its own beside a full-attention one
        found[spec.name] = (step3p7, functools.partial(samples, spec), (
            ("vision_config.image_size", 112), ("text_config.sliding_window", 8),
            ("text_config.layer_types", ["full_attention", "sliding_attention"]),
            ("text_config.num_sliding_attention_heads", 2)))
    if "phi4_multimodal" in transformers.CONFIG_MAPPING:
        spec = Spec("Phi-4-multimodal (phi4_multimodal)", "phi4_multimodal", "Phi4MultimodalProcessor", ("", "", {}),
                    PHI4_TOKENS, counts=(1, 1), sizes=(1, 2, 448))
        # two conformer blocks, whose convolutions' widths the tiny sizes do not name
        found[spec.name] = (phi4_multimodal, functools.partial(phi4_calls, functools.partial(samples, spec)),
                            (("audio_config.num_blocks", 2), *((f"audio_config.{key}", WIDTH) for key in (
                                "ext_pw_out_channel", "depthwise_separable_out_channel", "nemo_conv_channels"))))
    if "unlimited_ocr" in transformers.CONFIG_MAPPING:
        spec = Spec("Unlimited-OCR (unlimited_ocr)", "unlimited_ocr", "UnlimitedOcrProcessor", ("", "", {}),
                    {"image_token": "<image>"}, sizes=(1, 3, 64))
        # its SAM encoder's neck and downsampling convolutions feed the CLIP encoder's width; a window
        # shorter than the samples (a prefill attends past it)
        found[spec.name] = (unlimited_ocr, functools.partial(samples, spec), (
            ("text_config.sliding_window", 4), ("vision_config.sam_config.output_channels", WIDTH),
            ("vision_config.sam_config.downsample_channels", [WIDTH, WIDTH])))
    if "nemotron_h_omni" in transformers.CONFIG_MAPPING:
        spec = Spec("Nemotron-H Omni (nemotron_h_omni)", "nemotron_h_omni", "NemotronH_Omni_Reasoning_V3Processor",
                    ("", "", {}), NEMOTRON_TOKENS, sizes=(1, 3, 32))
        # the vision tower's width, as the projector reads it; Mamba and shared-expert sizes the tiny
        # sizes do not name (chunks shorter than the samples, so that the scan crosses chunks)
        found[spec.name] = (nemotron_h_omni, functools.partial(with_audio, functools.partial(samples, spec),
                                                               samples=16000, rate=16000),
                            (("vision_hidden_size", WIDTH), ("text_config.mamba_num_heads", 2),
                             ("text_config.mamba_head_dim", WIDTH), ("text_config.ssm_state_size", 16),
                             ("text_config.n_groups", 1), ("text_config.chunk_size", 8),
                             ("text_config.moe_shared_expert_intermediate_size", 2 * WIDTH)))
    return found


def muse_glimmer(model_type: str = "muse_glimmer", processor_class: str = "MuseGlimmerProcessor",
                 tokens: dict[str, str] = MUSE_TOKENS, **parts: Any) -> tuple[Any, Any]:
    """Muse Glimmer's processor (and Muse Spark's, which takes its image processor), at most 16
    tokens an image."""
    import transformers

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(tokens)
    image_processor = image_processor_class("muse_glimmer", "MuseGlimmerImageProcessor")(max_image_tokens=16)
    with processors_without_torchvision() as video_processor:
        processor = getattr(transformers, processor_class)(image_processor=image_processor,
                                                           video_processor=video_processor, tokenizer=tokenizer,
                                                           **parts)
    return processor, transformers.AutoConfig.for_model(model_type)


def with_audio(calls: Any, processor: Any, rng: Any, samples: int = 3 * 1920 - 100,
               rate: int = 24000) -> list[dict[str, Any]]:
    """``calls``, and one of an audio clip (by default 3 of Muse Spark's tokens, 1920 samples each)."""
    import numpy as np

    from mmrope_core.tiny import filler_text

    clip = np.sin(np.arange(samples) / rng.uniform(5, 40)).astype(np.float32)
    return [*calls(processor, rng), {"text": [f"{filler_text(rng, 2)} {processor.audio_token} {filler_text(rng, 3)}"],
                                     "audio": [clip], "sampling_rate": rate, "return_tensors": "pt"}]


def muse_spark() -> tuple[Any, Any]:
    import transformers

    return muse_glimmer("muse_spark", "MuseSparkProcessor", SPARK_TOKENS,
                        feature_extractor=transformers.MuseSparkFeatureExtractor())


def step3p7() -> tuple[Any, Any]:
    """Step-3.7's processor with a global view of 112 pixels and local crops of 56: 4 and 1 tokens."""
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(STEP_TOKENS)
    image_processor = image_processor_class("step3p7", "Step3p7ImageProcessor")(
        size={"height": 112, "width": 112}, patch_size=56)
    processor = transformers.Step3p7Processor(image_processor=image_processor, tokenizer=tokenizer)
    return processor, transformers.AutoConfig.for_model("step3p7")


def phi4_multimodal() -> tuple[Any, Any]:
    """Phi-4-multimodal's processor at its real crop size, 448 pixels: its image processor counts
    an image's tokens for that size (256 for the global view), whatever size it is given."""
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer(PHI4_TOKENS)
    image_processor = image_processor_class("phi4_multimodal", "Phi4MultimodalImageProcessor")(dynamic_hd=2)
    processor = transformers.Phi4MultimodalProcessor(image_processor=image_processor,
                                                     audio_processor=transformers.Phi4MultimodalFeatureExtractor(),
                                                     tokenizer=tokenizer)
    return processor, transformers.AutoConfig.for_model("phi4_multimodal")


def phi4_calls(calls: Any, processor: Any, rng: Any) -> list[dict[str, Any]]:
    """``calls`` (an image each), the last with a second of audio too: its model projects audio for
    vision in a batch holding images, so a sample with audio alone trains otherwise beside them
    (the collators refuse that batch: test_batch_wide_modes.py)."""
    import numpy as np

    out = [dict(call) for call in calls(processor, rng)]
    out[-1]["text"] = [f"{out[-1]['text'][0]} {processor.audio_token} the"]
    out[-1]["audio"] = [np.sin(np.arange(16000) / rng.uniform(5, 40)).astype(np.float32)]
    out[-1]["sampling_rate"] = 16000
    return out


def unlimited_ocr() -> tuple[Any, Any]:
    """Unlimited-OCR's processor with a global view and tiles of 64 pixels."""
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"image_token": "<image>"})
    image_processor = image_processor_class("unlimited_ocr", "UnlimitedOcrImageProcessor")(
        size={"height": 64, "width": 64}, tile_size=64, max_patches=4)
    processor = transformers.UnlimitedOcrProcessor(image_processor=image_processor, tokenizer=tokenizer)
    return processor, transformers.AutoConfig.for_model("unlimited_ocr")


def nemotron_h_omni() -> tuple[Any, Any]:
    """Nemotron-H Omni's processor with images of 4 to 16 patches of 16 pixels (1 to 4 tokens)."""
    import transformers

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(NEMOTRON_TOKENS)
    image_processor = image_processor_class("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3ImageProcessor")(
        min_num_patches=4, max_num_patches=16)
    with processors_without_torchvision() as video_processor:
        processor = transformers.NemotronH_Omni_Reasoning_V3Processor(
            image_processor=image_processor, video_processor=video_processor, tokenizer=tokenizer,
            feature_extractor=transformers.ParakeetFeatureExtractor())
    config = transformers.AutoConfig.for_model("nemotron_h_omni")  # its default config holds no token ids
    for kind in ("image", "video", "audio"):
        setattr(config, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(NEMOTRON_TOKENS[f"{kind}_token"]))
    return processor, config


def pi0() -> tuple[Any, Any]:
    """PI0's processor with one camera image of 28 pixels (4 tokens), a state and actions of 4
    values (padded to 8) and chunks of 4 actions. Not one of :func:`extra_cases`: its output is a
    chunk of action velocities, not token logits (test_action_models.py tests it)."""
    import transformers

    from mmrope_core.tiny import word_level_tokenizer

    tokenizer = word_level_tokenizer({"bos_token": "<bos>"})
    image_processor = image_processor_class("pi0", "PI0ImageProcessor")(
        size={"height": 28, "width": 28}, pad_size={"height": 28, "width": 28})
    image_processor.image_seq_length = 4  # what the processor reads: tokens per image
    statistics = {f"{kind}_{moment}": [float(moment == "std")] * 4 for kind in ("state", "actions")
                  for moment in ("mean", "std")}
    processor = transformers.PI0Processor(image_processor=image_processor, tokenizer=tokenizer, max_state_dim=8,
                                          chunk_size=4, **statistics)
    config = transformers.AutoConfig.for_model("pi0", max_state_dim=8, max_action_dim=8, chunk_size=4)
    return processor, config
