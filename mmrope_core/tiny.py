"""Building blocks for tiny, real processors built offline: for demos, tests and plugin authors.

Nothing here downloads anything. A processor built with these pieces is a real transformers
processor (real tokenizer class, real image processor) with a vocabulary of a few words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

FILLER_WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "looked", "at", "it")


def word_level_tokenizer(special_tokens: Mapping[str, str], words: Iterable[str] = FILLER_WORDS) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``words`` plus ``special_tokens``.

    Args:
        special_tokens: attribute name -> token text, e.g. ``{"image_token": "<|image_pad|>"}``.
            Each becomes a single token and an attribute of the tokenizer (``tokenizer.image_token``).
        words: the ordinary vocabulary; anything else tokenizes to ``[UNK]``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "[UNK]", *dict.fromkeys(special_tokens.values())]
    vocab = {token: index for index, token in enumerate([*specials, *dict.fromkeys(words)])}
    model = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="<pad>", unk_token="[UNK]", extra_special_tokens=dict(special_tokens)
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[2:]})
    return tokenizer


@contextlib.contextmanager
def processors_without_torchvision() -> Iterator[Any]:
    """Let transformers build processors that declare a video processor when torchvision is
    missing, yielding a placeholder video processor to pass as ``video_processor=``.

    Without torchvision, transformers cannot resolve the base class it checks video processors
    against (``VideoProcessorMixin`` or, in older releases, ``BaseVideoProcessor``). Inside the
    block that name resolves to the class itself; the placeholder cannot process videos (build
    video inputs from grids instead). With torchvision installed nothing is changed.
    """
    import transformers.processing_utils as processing_utils
    import transformers.video_processing_utils as video_processing_utils

    name = str(processing_utils.MODALITY_TO_BASE_CLASS_MAPPING["video_processor"])
    base = getattr(video_processing_utils, name)
    module = processing_utils.transformers_module
    resolved = _attribute(module, name)
    if resolved is base:
        yield base()
        return
    setattr(module, name, base)  # without torchvision the name is missing or a dummy
    try:
        yield base()
    finally:
        if resolved is None:
            with contextlib.suppress(AttributeError):
                delattr(module, name)
        else:
            setattr(module, name, resolved)


def _attribute(module: Any, name: str) -> Any:
    try:
        return getattr(module, name)
    except Exception:
        return None


def random_image(rng: Any, height: int, width: int) -> Any:
    """An RGB ``PIL.Image`` of random pixels."""
    import numpy as np
    from PIL import Image

    pixels = np.frombuffer(rng.randbytes(height * width * 3), dtype=np.uint8).reshape(height, width, 3)
    return Image.fromarray(pixels)


def filler_text(rng: Any, count: int) -> str:
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(count))


def padded_batch(rows: Sequence[Sequence[int]], pad_token_id: int, *, left: bool, length: int | None = None,
                 mask_dtype: Any = None) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` of token-id rows padded with ``pad_token_id`` on the left or
    the right to ``length`` (the longest row's by default), as a tokenizer pads a generated batch;
    the mask is int64 unless ``mask_dtype`` says otherwise."""
    import torch

    length = max(map(len, rows)) if length is None else length
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), length, dtype=mask_dtype or torch.long)
    for index, row in enumerate(rows):
        span = slice(length - len(row), length) if left else slice(0, len(row))
        input_ids[index, span] = torch.tensor(row)
        attention_mask[index, span] = 1
    return input_ids, attention_mask
