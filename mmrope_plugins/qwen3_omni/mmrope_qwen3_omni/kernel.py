"""What the Omni implementations share: :class:`Implementation`, the base of the reference and
the batched kernel (the config, the input check), and :class:`Kernel`, the base of the batched
kernel (the config's sizes, the audio-length rule, vLLM's timing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmrope_core import InvalidInputError, RopeKernel
from mmrope_core.conventions import SGLANG_0_5_23, TRANSFORMERS, VLLM_0_33, label
from mmrope_core.media import read_grid

from .audio import audio_window
from .families import Family
from .inputs import INPUT_KEYS, check_seconds
from .layout import Counters, Item, Tokens, check_all_used, read_items, tokens_of


class Implementation(RopeKernel):
    """What the reference and both kernels share: the thinker config, the dtypes of the
    convention, and the check of a batch's inputs and layout."""

    input_keys = INPUT_KEYS

    def __init__(self, family: Family, thinker: Any, position_dtype: torch.dtype | None = None,
                 convention: str = TRANSFORMERS, release: str | None = None) -> None:
        self.family = family
        self.config = thinker
        self.merge = int(thinker.vision_config.spatial_merge_size)
        self.convention = convention
        self.release = release or convention  # the release asked for, whose rules are ``convention``'s
        self.vllm = convention == VLLM_0_33
        self.sglang = convention == SGLANG_0_5_23
        # the reference's; vLLM's positions are int64 in both generations, SGLang's truncated to int64
        self.dtype = torch.float32 if family.float_positions and convention == TRANSFORMERS else torch.int64
        self.position_dtype = self.dtype if position_dtype is None else position_dtype
        # Qwen2.5-Omni's reference finds a video with its audio by its first video token;
        # vLLM reads no token inside the video's markers
        self.video_token_first = not family.float_positions and not self.vllm

    def check(self, rows: Sequence[np.ndarray], image_grid_thw, video_grid_thw, audio_lengths, second_per_grids,
              use_audio_in_video, tokens: Tokens, *, refuse_empty: bool = False) -> list[list[Item]]:
        """Each sample's media items, after checking inputs and layout; ``rows`` are each
        sample's valid tokens. ``refuse_empty``: a sample without tokens is an error where the
        reader reaches it, as in the batched kernel."""
        # read as the engine reads them, for kernels called directly
        in_rows = sum(row.size for row in rows)
        image_grid_thw = read_grid("image_grid_thw", image_grid_thw, tokens=in_rows)
        video_grid_thw = read_grid("video_grid_thw", video_grid_thw, tokens=in_rows)
        for key, value in (("image_grid_thw", image_grid_thw), ("video_grid_thw", video_grid_thw)):
            if value is not None and bool((value[:, 1:] % self.merge != 0).any()):
                raise InvalidInputError(f"{key} holds a height or width not divisible by the spatial merge size "
                                        f"{self.merge}: {value.tolist()}")
        if video_grid_thw is not None:
            check_seconds(second_per_grids, video_grid_thw)
        counters = Counters()
        items = []
        for sample, row in enumerate(rows):
            if refuse_empty and row.size == 0:
                raise InvalidInputError(f"sample {sample} has no valid token; drop empty samples")
            items.append(read_items(sample, row, tokens, counters, image_grid_thw=image_grid_thw,
                                    video_grid_thw=video_grid_thw, audio_lengths=audio_lengths, merge=self.merge,
                                    use_audio_in_video=use_audio_in_video, video_token_first=self.video_token_first))
            if self.vllm:
                _refuse_what_vllm_refuses(sample, items[-1], self.release)
        check_all_used(counters, image_grid_thw, video_grid_thw, audio_lengths)
        return items


def _refuse_what_vllm_refuses(sample: int, items: Sequence[Item], release: str) -> None:
    """vLLM 0.33.0 and 0.34.0 alike (``_derive_audio_from_video_placeholders``) refuse a request
    with ``use_audio_in_video`` whose audios are not one per video."""
    with_audio = next((item for item in items if item.kind == "audio_in_video"), None)
    alone = next((item for item in items if item.kind == "audio"), None)
    if with_audio is not None and alone is not None:
        raise InvalidInputError(
            f"sample {sample}: an audio of its own (token {alone.start}) beside a video with its audio (token "
            f"{with_audio.start}). {label(release)} refuses such a request (with use_audio_in_video every audio must "
            f"be a video's), so the {release} convention has no positions for it; put that audio in a sample "
            f"without videos, or use the transformers convention"
        )


class Kernel(Implementation):
    """What a fast kernel takes from the config: its sizes, checked when bound, and the
    audio-length rule the probe found (vLLM's, in its convention)."""

    samples_independent = True  # batched: every row computed alike, as the conformance suite checks

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str,
                 position_dtype: torch.dtype | None = None, convention: str = TRANSFORMERS,
                 release: str | None = None) -> None:
        super().__init__(family, thinker, position_dtype, convention, release)
        self.tokens = tokens_of(thinker, markers)
        self.audio_rule = audio_rule
        per_second = thinker.position_id_per_seconds
        if self.vllm and not family.float_positions:  # vLLM times Qwen2.5-Omni's videos by the vision config
            per_second = getattr(thinker.vision_config, "tokens_per_second", 25)
        self._per_second = float(per_second)
        self._chunk = int(per_second * getattr(thinker, "seconds_per_chunk", 2))
        self._window = audio_window(family, thinker, audio_rule)
        # vLLM's seconds per grid where the inputs have none
        self._default_seconds = (2.0 if family.float_positions else 1.0) if self.vllm else None
        if self.merge < 1 or (family.float_positions and self._window < 1) or (not family.float_positions and self._chunk < 1):
            raise InvalidInputError(
                f"the {family.name} config's spatial_merge_size ({self.merge}), audio n_window or "
                f"position_id_per_seconds * seconds_per_chunk ({self._chunk}) is below 1; pass the model's config"
            )

    def _timing(self, second_per_grids: Any, video_grid_thw: Any) -> Any:
        """The seconds per video grid given, or vLLM's default for each video when none are."""
        if second_per_grids is None and self._default_seconds is not None and isinstance(video_grid_thw, torch.Tensor):
            return torch.full((video_grid_thw.shape[0],), self._default_seconds, dtype=torch.float32)
        return second_per_grids
