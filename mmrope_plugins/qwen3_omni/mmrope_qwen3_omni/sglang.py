"""SGLang 0.5.23's Qwen3-Omni positions (``convention="sglang"``).

SGLang computes the thinker's float positions as transformers does (audio counted with encoder
windows of 50 mel frames, whatever the config says), then casts them to int64: a prefilled token
sits at ``trunc(position)``, a decoded one at ``index + trunc(delta)`` (see
:mod:`mmrope_core.rollout`). Its processor calls them with ``use_audio_in_video=False``, so no
rollout of it holds a video with its audio.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrope_core import InvalidInputError, RopeKernel
from mmrope_core.rollout import decoded_positions

from .kernel import Kernel

#: SGLang's ``_get_feat_extract_output_lengths`` chunks audio in windows of 100 mel frames.
SGLANG_AUDIO_RULE = "window_50"


class SglangRopeIndex(RopeKernel):
    """SGLang's positions from ``kernel``'s (the batched kernel in the transformers convention,
    float32): truncated to int64, generated tokens at their index plus
    the truncated delta of what precedes their run (``generated_mask``)."""

    position_dtype = torch.int64
    reads_generated_mask = True

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.places_packed_rows = kernel.places_packed_rows

    def __repr__(self) -> str:
        return f"SglangRopeIndex({type(self.kernel).__name__})"

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, generated_mask: torch.Tensor | None = None,
                   **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        _refuse_audio_in_video(inputs)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        positions, deltas = self.kernel.rope_index(input_ids, attention_mask, **packed, **inputs)
        decoded, decoded_deltas = decoded_positions(positions, generated_mask, attention_mask, cu_seqlens, deltas)
        assert decoded_deltas is not None  # (deltas were given)
        return decoded, decoded_deltas

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, generated_mask: torch.Tensor | None = None,
                     **inputs: Any) -> torch.Tensor:
        _refuse_audio_in_video(inputs)
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        four = self.kernel.position_ids(input_ids, attention_mask, **packed, **inputs)
        out = torch.empty(four.shape, dtype=torch.int64, device=four.device)
        out[:, 0] = four[:, 0]
        decoded_positions(four[:, 1:].transpose(0, 1), generated_mask, attention_mask, cu_seqlens,
                          out=out[:, 1:].transpose(0, 1))
        return out


def _refuse_audio_in_video(inputs: dict[str, Any]) -> None:
    if inputs.get("use_audio_in_video") and inputs.get("video_grid_thw") is not None:
        raise InvalidInputError(
            "use_audio_in_video=True with videos: SGLang 0.5.23 computes Qwen3-Omni's positions with "
            "use_audio_in_video=False, so no rollout it sampled holds a video with its audio, and the sglang "
            "convention has no positions for one. Process these samples without use_audio_in_video, or use the "
            "transformers or vllm convention"
        )
