"""The batched kernel: every sample and media item of a batch placed in one read of its tokens and
one write, by the family's layout as data (:mod:`.placing`) on the core's compiled primitives
(:mod:`mmrope_core.items`; numpy where they are missing), packed rows, the engine's four rows and
SGLang's truncated positions and decoded tokens included."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from mmrope_core import InvalidInputError
from mmrope_core.conventions import TRANSFORMERS
from mmrope_core.items import ItemKernel, ItemLayout

from .audio import audio_media, audio_token_counts
from .families import Family
from .inputs import refuse_unknown, seconds_tensor
from .kernel import Kernel
from .placing import SILENT_VIDEOS, VIDEOS_WITH_AUDIO, omni_layout, text_layout
from .sglang import refuse_audio_in_video

_KEYS = {"image": "image_grid_thw", "video": ("video_grid_thw", "second_per_grids"), "audio": "audio_seqlens"}


class FastRopeIndex(ItemKernel, Kernel):
    """The batched kernel: every sample and media item of a batch in one read of the tokens,
    which finds and checks the items, and one write of the positions; no Python runs per sample,
    item or token where the compiled loops are loaded (without them, numpy runs per item). When
    it refuses a batch, the item-by-item reader of :mod:`.layout` says why.

    :meth:`rope_index` (also the instance's call) has the reference ``get_rope_index``'s
    arguments and results, and takes ``cu_seqlens`` for one packed ``(1, L)`` row;
    :meth:`position_ids` gives the engine's ``(B, 4, L)`` layout in the same pass. In SGLang's
    convention both take ``generated_mask`` and place the tokens SGLang decoded where it decoded
    them (:mod:`.sglang`), in the same pass."""

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str,
                 position_dtype: torch.dtype | None = None, convention: str = TRANSFORMERS,
                 release: str | None = None) -> None:
        Kernel.__init__(self, family, thinker, markers, audio_rule, position_dtype, convention, release)
        try:
            layout = omni_layout(family, self.tokens, self.merge, audio_media(family, self._window), self._per_second,
                                 self._chunk, self.vllm, truncated=self.sglang)
        except ValueError as exc:  # sizes no processor uses
            raise InvalidInputError(f"the {family.name} config's sizes cannot be placed ({exc}); pass the model's "
                                    f"config") from exc
        ItemKernel.__init__(self, layout, _KEYS, switches=("use_audio_in_video",), position_dtype=self.position_dtype,
                            reads_generated_mask=self.sglang)
        self._without_grids = text_layout(layout, self.vllm)
        self._enabled = {False: layout.enabled(SILENT_VIDEOS), True: layout.enabled(VIDEOS_WITH_AUDIO)}

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                   audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                   generated_mask: torch.Tensor | None = None, **unknown: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, B, L)`` positions and ``(B, 1)`` deltas, as the reference returns them; with
        ``cu_seqlens`` (``(K + 1,)`` boundaries from 0 to L) one packed ``(1, L)`` row of K
        samples, each placed as it is alone, and ``(K, 1)`` deltas."""
        refuse_unknown(unknown)
        return self.placed(False, input_ids, attention_mask, cu_seqlens, self._inputs(
            image_grid_thw, video_grid_thw, audio_seqlens, second_per_grids, use_audio_in_video), generated_mask)

    __call__ = rope_index

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                     audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                     generated_mask: torch.Tensor | None = None, **unknown: Any) -> torch.Tensor:
        """The engine's ``(B, 4, L)`` layout, ``(1, 4, L)`` with ``cu_seqlens``: row 0 counts each
        sample's (segment's) valid tokens from 0, 1 at padding; rows 1 to 3 are
        :meth:`rope_index`'s positions, in ``position_dtype``. Written in the same pass."""
        refuse_unknown(unknown)
        positions, _ = self.placed(True, input_ids, attention_mask, cu_seqlens, self._inputs(
            image_grid_thw, video_grid_thw, audio_seqlens, second_per_grids, use_audio_in_video), generated_mask)
        return positions if positions.dtype == self.position_dtype else positions.to(self.position_dtype)

    def _inputs(self, image_grid_thw, video_grid_thw, audio_seqlens, second_per_grids,
                use_audio_in_video) -> dict[str, Any]:
        return {"image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw, "audio_seqlens": audio_seqlens,
                "second_per_grids": self._timing(second_per_grids, video_grid_thw),
                "use_audio_in_video": use_audio_in_video}

    def layout_for(self, inputs: Mapping[str, Any]) -> tuple[ItemLayout, int]:
        """Without image and video grids the reference counts every token on (after checking
        the items); ``use_audio_in_video`` says which kind a video is."""
        if self.sglang:
            refuse_audio_in_video(inputs)
        grids = inputs["image_grid_thw"] is not None or inputs["video_grid_thw"] is not None
        return self.layout if grids else self._without_grids, self._enabled[bool(inputs["use_audio_in_video"])]

    def explain(self, layout: ItemLayout, enabled: int, ids: torch.Tensor, mask: torch.Tensor | None,
                first: np.ndarray | None, count: np.ndarray | None, media: Any, seconds: Any,
                inputs: Mapping[str, Any]) -> None:
        """Raise the error that says why the kernel refused the batch, found by reading it item
        by item as the reference's input check reads it."""
        image_grid_thw, video_grid_thw = inputs["image_grid_thw"], inputs["video_grid_thw"]
        lengths = audio_token_counts(self.family, self.config, self.audio_rule, inputs["audio_seqlens"])
        if first is not None:
            rows = [ids[0, begin : begin + size].numpy() for begin, size in zip(first.tolist(), count.tolist())]  # type: ignore[union-attr]
        elif mask is None:
            rows = list(ids.numpy())
        else:
            rows = [row[valid] for row, valid in zip(ids.numpy(), mask.numpy())]
        self.check(rows, image_grid_thw, video_grid_thw, lengths, seconds_tensor(inputs["second_per_grids"]),
                   inputs["use_audio_in_video"], self.tokens,
                   refuse_empty=image_grid_thw is not None or video_grid_thw is not None)
