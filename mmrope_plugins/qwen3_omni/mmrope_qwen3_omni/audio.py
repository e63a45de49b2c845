"""How many placeholder tokens an audio's mel frames take: each Omni generation's encoder rule,
the rules the probe tries (``AUDIO_RULES``) and the one vLLM 0.33 uses (``VLLM_AUDIO_RULES``)."""

from __future__ import annotations

from typing import Any

import torch

from mmrope_core.items import SequenceMedia
from mmrope_core.media import read_audio_lengths

from .families import Family

#: The audio-length rules tried, in order, until a kernel agrees with the installed reference:
#: Qwen3-Omni's encoder window as the config gives it or of 50 mel frames; Qwen2.5-Omni's one.
AUDIO_RULES = {True: ("config_window", "window_50"), False: ("qwen2_5",)}


#: vLLM 0.33 counts Qwen3-Omni's audio tokens with an encoder window of 50 mel frames whatever
#: the config says.
VLLM_AUDIO_RULES = {True: "window_50", False: "qwen2_5"}


def audio_media(family: Family, n_window: int) -> SequenceMedia:
    """The encoder's rule as data: Qwen3-Omni's windows of ``2 * n_window`` mel frames give 13
    tokens each, what is left three strided convolutions; Qwen2.5-Omni's frames pass a strided
    convolution and a pooling."""
    return _qwen3_audio(n_window) if family.float_positions else SequenceMedia("audio", steps=((1, 2), (2, 2)))


def _qwen3_audio(n_window: int) -> SequenceMedia:
    return SequenceMedia("audio", steps=((1, 2), (1, 2), (1, 2)), window=2 * n_window, per_window=13)


def qwen3_audio_tokens(lengths: torch.Tensor, n_window: int) -> torch.Tensor:
    """Audio tokens of Qwen3-Omni's encoder for ``lengths`` mel frames (chunks of ``2 * n_window``)."""
    tokens: torch.Tensor = _qwen3_audio(n_window).tokens(lengths)
    return tokens


def audio_window(family: Family, thinker: Any, rule: str | None) -> int:
    """The mel frames of one Qwen3-Omni encoder window half (``n_window``) under ``rule``; 0 for
    Qwen2.5-Omni, whose audio length has no window."""
    if not family.float_positions:
        return 0
    return int(thinker.audio_config.n_window) if rule == "config_window" else 50


def audio_token_counts(family: Family, thinker: Any, rule: str | None, audio_seqlens: Any) -> torch.Tensor | None:
    lengths = read_audio_lengths("audio_seqlens", audio_seqlens, mask="feature_attention_mask")
    if lengths is None:
        return None
    tokens: torch.Tensor = audio_media(family, audio_window(family, thinker, rule)).tokens(lengths)
    return tokens
