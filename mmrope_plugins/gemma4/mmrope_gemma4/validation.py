"""What ``engine.process`` still checks for Gemma4 once the per-sample placeholder count is relaxed."""

from __future__ import annotations

from typing import Any

from mmrope_core.errors import counted


def validate_relaxed(processor: Any, images: Any = None, text: Any = None, videos: Any = None,
                     audio: Any = None, **kwargs: Any) -> None:
    """Reject what would fail later inside the processor, accept collapsed placeholders.

    Checked:
      - at least one of text, images, videos or audio is given;
      - text is a string or a list of strings;
      - the batch holds no more image placeholders than images (more would make the processor
        run out of images while expanding them);
      - audio is given only if the tokenizer defines audio, begin-of-audio and end-of-audio tokens.
    Not checked: that each sample has exactly as many placeholders as images.
    """
    from transformers.image_utils import make_flat_list_of_images

    name = type(processor).__name__
    if images is None and text is None and videos is None and audio is None:
        raise ValueError(f"{name} needs at least one of text, images, videos or audio")
    samples = [text] if isinstance(text, str) else text
    if samples is not None and not all(isinstance(sample, str) for sample in samples):
        raise ValueError(f"{name}: text must be a string or a list of strings")
    if samples is not None and images is not None:
        placeholders = sum(sample.count(processor.image_token) for sample in samples)
        count = len(make_flat_list_of_images(images))  # type: ignore[arg-type]
        if placeholders > count:
            raise ValueError(
                f"{name}: the text holds {placeholders} {processor.image_token} placeholders but only "
                f"{counted(count, 'image')} {'was' if count == 1 else 'were'} given; remove the extra "
                f"placeholders or pass their images"
            )
    if audio is not None and None in (processor.audio_token, processor.boa_token, processor.eoa_token):
        raise ValueError(
            f"{name}: audio was given but the tokenizer lacks an audio, begin-of-audio or end-of-audio token"
        )
