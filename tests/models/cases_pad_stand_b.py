"""Model types whose only image processor needs torchvision, built for the model-level collator
tests (test_padded_batches.py, test_packed_rows.py) with their real processors.

Each is the model type's real processor class with a word-level tokenizer and the real image
processor class of :mod:`torchvision_stand_in`: the real class's own code (tiling, token counts,
keys, shapes, dtypes, how it batches images), with torch kernels in place of the torchvision
ones it calls, which the tests run without. Only pixel values differ from torchvision's.
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
    return found


def muse_glimmer() -> tuple[Any, Any]:
    import transformers

    from mmrope_core.tiny import processors_without_torchvision, word_level_tokenizer

    tokenizer = word_level_tokenizer(MUSE_TOKENS)
    image_processor = image_processor_class("muse_glimmer", "MuseGlimmerImageProcessor")(max_image_tokens=16)
    with processors_without_torchvision() as video_processor:
        processor = transformers.MuseGlimmerProcessor(image_processor=image_processor, video_processor=video_processor,
                                                      tokenizer=tokenizer)
    config = transformers.AutoConfig.for_model("muse_glimmer")
    return processor, config
