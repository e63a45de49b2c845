"""``implementation="reference"``: the installed thinker's own ``get_rope_index``, bound to its
config alone, with the plugin's input check in front."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from mmrope_core import PlaceholderMismatchError
from mmrope_core.reference import config_only_model

from .audio import audio_token_counts
from .families import Family
from .inputs import mask_or_ones, refuse_unknown, seconds_tensor, valid_tokens
from .kernel import Implementation
from .layout import tokens_of


class ReferenceRopeIndex(Implementation):
    """The thinker's own ``get_rope_index``, bound to its config alone. Inputs are checked first
    (when the audio-length rule is known), so a mismatch raises a typed error."""

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str | None = None,
                 position_dtype: torch.dtype | None = None) -> None:
        super().__init__(family, thinker, position_dtype)
        self.tokens = tokens_of(thinker, markers)
        self.markers = dict(markers)
        self.audio_rule = audio_rule
        model_cls = getattr(importlib.import_module(f"transformers.models.{family.module}.modeling_{family.module}"),
                            family.reference_class)
        self.model = config_only_model(model_cls, thinker, spatial_merge_size=self.merge)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                   audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                   **unknown: Any) -> tuple[torch.Tensor, torch.Tensor]:
        refuse_unknown(unknown)
        second_per_grids = seconds_tensor(second_per_grids)
        mask = mask_or_ones(input_ids, attention_mask)
        if self.audio_rule is not None:
            lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
            rows = [input_ids[sample][valid_tokens(row)].cpu().numpy() for sample, row in enumerate(mask)]
            self.check(rows, image_grid_thw, video_grid_thw, lengths, second_per_grids, use_audio_in_video, self.tokens)
        try:
            # int64 ids, whatever the caller's: Qwen2.5-Omni's writes int64 values into a tensor of
            # the ids' dtype and fails on int32 ids; its batched kernel gives int64 positions for all
            return self.model.get_rope_index(
                input_ids=input_ids.long(), image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                attention_mask=mask.long(), use_audio_in_video=use_audio_in_video,
                audio_seqlens=audio_seqlens, second_per_grids=second_per_grids,
            )
        except (IndexError, ValueError, RuntimeError, StopIteration) as exc:  # the layout checked above
            raise PlaceholderMismatchError(
                f"the installed transformers' {self.family.name} get_rope_index cannot place this batch "
                f"({type(exc).__name__}: {exc}): a start marker that opens no media (sampled in a response) is "
                f"read as text by implementation='fast' only. Mask such tokens out, or use implementation='fast'"
            ) from exc

    __call__ = rope_index
