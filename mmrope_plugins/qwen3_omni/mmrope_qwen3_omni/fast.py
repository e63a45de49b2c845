"""The batched kernel: every sample and media item of a batch placed in one compiled read and one
write (:func:`mmrope_core.compiled.omni_positions`), packed rows and the engine's four rows
included."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import torch

from mmrope_core import PlaceholderMismatchError, SegmentCutError
from mmrope_core.compiled import OMNI_PADDING_INSIDE, OMNI_WRITTEN, omni_positions
from mmrope_core.conventions import TRANSFORMERS

from .audio import audio_token_counts
from .families import Family
from .inputs import host_batch, host_media, packed_segments, refuse_unknown, seconds_tensor
from .kernel import Kernel
from .layout import Counters, iter_items


class FastRopeIndex(Kernel):
    """The batched kernel: every sample and media item of a batch in one compiled read of the
    tokens, which finds and checks the items, and one write of the positions
    (:func:`mmrope_core.compiled.omni_positions`); no Python runs per sample, item or token.
    When it refuses a batch, the item-by-item reader of :mod:`.layout` says why.

    :meth:`rope_index` (also the instance's call) has the reference ``get_rope_index``'s
    arguments and results, and takes ``cu_seqlens`` for one packed ``(1, L)`` row;
    :meth:`position_ids` gives the engine's ``(B, 4, L)`` layout in the same pass."""

    places_packed_rows = True

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str,
                 position_dtype: torch.dtype | None = None, convention: str = TRANSFORMERS) -> None:
        super().__init__(family, thinker, markers, audio_rule, position_dtype, convention)
        t = self.tokens
        self._token_ids = (t.image, t.video, t.audio, t.vision_start, t.vision_end, t.audio_start, t.audio_end)
        self._sizes = (self.merge, self._chunk, self._window)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                   audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                   **unknown: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, B, L)`` positions and ``(B, 1)`` deltas, as the reference returns them; with
        ``cu_seqlens`` (``(K + 1,)`` boundaries from 0 to L) one packed ``(1, L)`` row of K
        samples, each placed as it is alone, and ``(K, 1)`` deltas."""
        refuse_unknown(unknown)
        return self._on_device(False, input_ids, attention_mask, cu_seqlens, image_grid_thw, video_grid_thw,
                               audio_seqlens, self._timing(second_per_grids, video_grid_thw), use_audio_in_video)

    __call__ = rope_index

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                     cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                     audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                     **unknown: Any) -> torch.Tensor:
        """The engine's ``(B, 4, L)`` layout, ``(1, 4, L)`` with ``cu_seqlens``: row 0 counts each
        sample's (segment's) valid tokens from 0, 1 at padding; rows 1 to 3 are
        :meth:`rope_index`'s positions, in ``position_dtype``. Written in the same pass."""
        refuse_unknown(unknown)
        positions, _ = self._on_device(True, input_ids, attention_mask, cu_seqlens, image_grid_thw, video_grid_thw,
                                       audio_seqlens, self._timing(second_per_grids, video_grid_thw),
                                       use_audio_in_video)
        return positions if positions.dtype == self.position_dtype else positions.to(self.position_dtype)

    def _on_device(self, text_row, input_ids, attention_mask, cu_seqlens, *media) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = host_batch(input_ids, attention_mask)
        positions, deltas = self._placed(text_row, ids, mask, cu_seqlens, *media)
        if input_ids.device.type != "cpu":
            return positions.to(input_ids.device), deltas.to(input_ids.device)
        return positions, deltas

    def _placed(self, text_row, ids, mask, cu_seqlens, image_grid_thw, video_grid_thw, audio_seqlens,
                second_per_grids, use_audio_in_video) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = ids.shape
        first = count = None
        if cu_seqlens is not None:
            first, count = packed_segments(cu_seqlens, ids.shape, mask)
            mask = None
        images, videos, seconds, frames = host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens)
        out = torch.empty((batch, 4, length) if text_row else (3, batch, length), dtype=self.dtype)
        deltas = torch.empty(batch if first is None else first.size, 1, dtype=self.dtype)
        text_only = image_grid_thw is None and video_grid_thw is None
        status = omni_positions(
            out.numpy(), text_row, batch, length, ids.numpy(), None if mask is None else mask.numpy(), first, count,
            self._token_ids, (self.family.float_positions, bool(use_audio_in_video), text_only, self.vllm), self._sizes,
            self._per_second, images, videos, seconds, frames, deltas.numpy(),
            torch.get_num_threads())
        if status == OMNI_PADDING_INSIDE:
            return self._compacted(text_row, ids, mask, image_grid_thw, video_grid_thw, audio_seqlens,
                                   second_per_grids, use_audio_in_video)
        if status != OMNI_WRITTEN:
            self._refuse(ids, mask, cu_seqlens, first, count, image_grid_thw, video_grid_thw, audio_seqlens,
                         second_per_grids, use_audio_in_video)
        return out, deltas

    def _compacted(self, text_row, ids, mask, *media) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions for masks with padding inside a sample: computed with each sample's valid
        tokens moved to the front, in order, then put back (the padding goes where padding was)."""
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
        valid = torch.arange(mask.shape[1]) < mask.sum(dim=1, keepdim=True)
        compact, deltas = self._placed(text_row, ids.gather(1, order), valid, None, *media)
        order = order.unsqueeze(1 if text_row else 0).expand_as(compact)
        return torch.empty_like(compact).scatter_(2, order, compact), deltas

    def _refuse(self, ids, mask, cu_seqlens, first, count, image_grid_thw, video_grid_thw, audio_seqlens,
                second_per_grids, use_audio_in_video) -> NoReturn:
        """Raise the error that says why the kernel refused the batch, found by reading it item
        by item."""
        lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
        media = {"image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw, "audio_lengths": lengths,
                 "merge": self.merge, "use_audio_in_video": use_audio_in_video,
                 "video_token_first": self.video_token_first}
        if first is not None:
            rows = [ids[0, begin : begin + size].numpy() for begin, size in zip(first.tolist(), count.tolist())]
            self._check_segment_cuts(ids[0].numpy(), np.append(first, first[-1] + count[-1]), media)
        elif mask is None:
            rows = list(ids.numpy())
        else:
            rows = [row[valid] for row, valid in zip(ids.numpy(), mask.numpy())]
        self.check(rows, image_grid_thw, video_grid_thw, lengths, seconds_tensor(second_per_grids), use_audio_in_video,
                   self.tokens, refuse_empty=image_grid_thw is not None or video_grid_thw is not None)
        raise PlaceholderMismatchError(
            "the media placeholders of the batch do not fit its grids and audio lengths; pass the processor's "
            "outputs for these samples"
        )

    def _check_segment_cuts(self, row: np.ndarray, bounds: np.ndarray, media: dict[str, Any]) -> None:
        """Raise where an item of the packed row, read as one sample, crosses a segment boundary."""
        items = iter_items(0, row, self.tokens, Counters(), **media)
        while True:
            try:
                item = next(items)
            except (StopIteration, PlaceholderMismatchError):
                return
            inside = np.flatnonzero((bounds > item.start) & (bounds < item.start + item.length))
            if inside.size:
                raise SegmentCutError((int(inside[0]),), f"token {int(bounds[inside[0]])}")
