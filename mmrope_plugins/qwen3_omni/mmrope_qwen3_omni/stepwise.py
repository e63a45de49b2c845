"""The step-by-step kernel: the batched kernel's positions and errors where the compiled loops are
missing, placed in torch sample by sample and item by item."""

from __future__ import annotations

from typing import Any

import torch

from .audio import audio_token_counts
from .inputs import host_batch, host_media, mask_or_ones, refuse_unknown, seconds_tensor, valid_tokens
from .kernel import Kernel


class StepwiseRopeIndex(Kernel):
    """The batched kernel's positions and errors without the compiled loops: the batch is read
    item by item (:mod:`.layout`, the reader that says why the batched kernel refuses a batch),
    then placed sample by sample and item by item, each item's positions written at once (the
    audio-in-video interleave with ``searchsorted`` or a stable sort); no Python runs per token.
    The engine unpacks packed rows for it."""

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                   audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                   **unknown: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, B, L)`` positions and ``(B, 1)`` deltas, as the reference returns them."""
        refuse_unknown(unknown)
        if cu_seqlens is not None:
            raise TypeError("the step-by-step Omni kernel does not place packed rows: unpack them first")
        ids, mask = host_batch(input_ids, attention_mask)
        second_per_grids = self._timing(second_per_grids, video_grid_thw)
        host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens)  # checked as the batched kernel does
        seconds = seconds_tensor(second_per_grids) if video_grid_thw is not None else None
        lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
        mask = mask_or_ones(ids, mask)
        spans = [valid_tokens(row) for row in mask]
        text_only = image_grid_thw is None and video_grid_thw is None
        items = self.check([ids[sample, span].numpy() for sample, span in enumerate(spans)], image_grid_thw,
                           video_grid_thw, lengths, seconds, use_audio_in_video, self.tokens, refuse_empty=not text_only)
        if text_only:
            positions, deltas = self._text_only(mask)
        else:
            positions, deltas = self._placed(items, spans, mask, image_grid_thw, video_grid_thw, lengths, seconds)
        return positions.to(input_ids.device), deltas.to(input_ids.device)

    __call__ = rope_index

    def _text_only(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # what the reference does when no image or video grid is given, audio included (vLLM's
        # positions of such samples count on too, without padding)
        mask = mask.long()
        positions = mask.to(self.dtype).cumsum(-1) - 1
        positions.masked_fill_(mask == 0, 1)
        if self.vllm:
            return positions.unsqueeze(0).repeat(3, 1, 1), torch.zeros(mask.shape[0], 1, dtype=self.dtype)
        highest = positions.max(-1, keepdim=True).values  # the padding's 1 counts
        return positions.unsqueeze(0).repeat(3, 1, 1), highest + 1 - mask.sum(-1, keepdim=True)

    def _placed(self, items, spans, mask, image_grid_thw, video_grid_thw, lengths, seconds) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's positions, from its items, written where its valid tokens are."""
        out = torch.full((3, *mask.shape), 0 if self.family.float_positions else 1, dtype=self.dtype)  # padding
        deltas = torch.empty(mask.shape[0], 1, dtype=self.dtype)
        place = self._vllm_sample if self.vllm else self._sample
        for sample, (sample_items, span) in enumerate(zip(items, spans)):
            count = int(mask[sample].sum())
            chunks = place(sample_items, count, image_grid_thw, video_grid_thw, lengths, seconds)
            positions = torch.cat([chunk.to(self.dtype) for chunk in chunks], dim=1)
            out[:, sample, span] = positions
            deltas[sample] = positions.max() + 1 - count
        return out, deltas

    def _sample(self, items, count, image_grid_thw, video_grid_thw, lengths, seconds) -> list[torch.Tensor]:
        """One sample's positions as the chunks the reference appends, in order."""
        chunks: list[torch.Tensor] = []
        cursor = 0  # index of the next token of the sample
        qwen3 = self.family.float_positions
        for item in items:
            text = item.start - cursor
            pairs = item.kind == "audio_in_video"
            if qwen3:  # counts on over the start markers
                start = _next(chunks)
                if text:
                    chunks.append(_run(text, start))
                    start = start + text
                opening = 2 if pairs else 1
                chunks.append(_run(opening, start))
                media_start = start + opening
            else:  # gives both start markers of a video with its audio one position
                if text:
                    chunks.append(_run(text, _next(chunks)))
                start = _next(chunks)
                chunks.append(_run(1, start))
                if pairs:
                    chunks.append(_run(1, start))
                media_start = _next(chunks)
            last = self._media(chunks, item, media_start, image_grid_thw, video_grid_thw, lengths, seconds)
            closing = _next([last])
            chunks.append(_run(2 if (pairs and qwen3) else 1, closing))
            if pairs and not qwen3:
                chunks.append(_run(1, closing))
            cursor = item.start + item.length
        if cursor < count:
            chunks.append(_run(count - cursor, _next(chunks)))
        return chunks

    def _media(self, chunks, item, start, image_grid_thw, video_grid_thw, lengths, seconds) -> torch.Tensor:
        """Append the item's media positions; return the chunk the reference appended last."""
        qwen3 = self.family.float_positions
        if item.kind == "audio":
            chunks.append(_run(lengths[item.index], start))
            return chunks[-1]
        if item.kind == "image":
            frames = torch.arange(image_grid_thw[item.index][0]) * 1 * self._per_second
            chunks.append(self._vision(start, image_grid_thw[item.index], frames.float() if qwen3 else frames.long()))
            return chunks[-1]
        frames = torch.arange(video_grid_thw[item.index][0]) * seconds[item.index].cpu().float() * self._per_second
        video = self._vision(start, video_grid_thw[item.index], frames.float() if qwen3 else frames.long())
        if item.kind == "video":
            chunks.append(video)
            return video
        audio = _run(lengths[item.audio_index], start)
        if qwen3:
            return self._merge_qwen3(chunks, video, audio, int(video_grid_thw[item.index][0]))
        return self._merge_qwen2_5(chunks, video, audio, start)

    def _vllm_sample(self, items, count, image_grid_thw, video_grid_thw, lengths, seconds) -> list[torch.Tensor]:
        """One sample's positions as vLLM 0.33 computes them (``omni_sample_vllm`` of the batched
        kernel says how): each media block one past the largest position before it, every other
        token text counting on."""
        chunks: list[torch.Tensor] = []
        cursor = following = 0  # the next token, and one past the largest position so far
        qwen3 = self.family.float_positions
        for item in items:
            pair = item.kind == "audio_in_video"
            lead = item.start - cursor + 1 + int(pair and qwen3)
            chunks.append(_run(lead, following))
            block = self._vllm_block(item, following + lead, image_grid_thw, video_grid_thw, lengths, seconds)
            chunks.append(block)
            tail = item.start + item.length - (cursor + lead + block.shape[1])
            largest = int(block.max())
            chunks.append(_run(tail, largest + 1))
            following = largest + 1 + tail
            cursor = item.start + item.length
        chunks.append(_run(count - cursor, following))
        return chunks

    def _vllm_block(self, item, start: int, image_grid_thw, video_grid_thw, lengths, seconds) -> torch.Tensor:
        """The positions vLLM gives the item's media tokens (for a video with its audio, the block
        it lays from the audio start marker on)."""
        if item.kind == "audio":
            return _run(int(lengths[item.index]), start)
        if item.kind == "image":
            grid = image_grid_thw[item.index]
            return self._vision(start, grid, self._vllm_times(int(grid[0]), 1.0))
        grid = video_grid_thw[item.index]
        frames = int(grid[0])
        video = self._vision(start, grid, self._vllm_times(frames, float(seconds[item.index])))
        if item.kind == "video":
            return video
        audio = _run(int(lengths[item.audio_index]), start)
        if self.family.float_positions:  # merged by integer time: the frames' times are truncated
            merged: list[torch.Tensor] = []
            self._merge_qwen3(merged, video, audio, frames)
            return merged[0]
        return self._merge_by_groups(video, audio, start, frames)

    def _vllm_times(self, frames: int, seconds: float) -> torch.Tensor:
        # frame * (seconds * positions per second) in float64, truncated: numpy's astype(int64)
        return (torch.arange(frames, dtype=torch.float64) * (seconds * self._per_second)).long()

    def _merge_by_groups(self, video, audio, start: int, frames: int) -> torch.Tensor:
        # vLLM's Qwen2.5-Omni interleave: frames grouped by temporal id // chunk (a group without
        # frames takes nothing), each group's frames then the next chunk of audio, the rest last
        per_frame = video.shape[1] // frames
        groups = torch.div(video[0].view(frames, per_frame)[:, 0] - start, self._chunk, rounding_mode="floor")
        group = torch.cat([torch.zeros(1, dtype=torch.long), (groups[1:] != groups[:-1]).long()]).cumsum(0)
        audio_group = (torch.arange(audio.shape[1]) // self._chunk).clamp(max=int(group[-1]))
        keys = torch.cat([2 * group.repeat_interleave(per_frame), 2 * audio_group + 1])
        order = torch.sort(keys, stable=True).indices
        return torch.cat([video, audio.to(video.dtype)], dim=1)[:, order]

    def _vision(self, start, grid, frames: torch.Tensor) -> torch.Tensor:
        height, width = int(grid[1]) // self.merge, int(grid[2]) // self.merge
        out = torch.empty(3, frames.numel(), height, width, dtype=self.dtype)
        out[0] = frames.to(self.dtype).view(-1, 1, 1) + start
        out[1] = torch.arange(height).view(1, -1, 1) + start
        out[2] = torch.arange(width).view(1, 1, -1) + start
        return out.view(3, -1)

    @staticmethod
    def _merge_qwen3(chunks, video, audio, frames: int) -> torch.Tensor:
        # Tokens in order of temporal position; on a tie the video token comes first. All tokens
        # of a frame share its time, so the comparisons are made once per frame.
        per_frame = video.shape[1] // frames
        frame_time = video[0].view(frames, per_frame)[:, 0].contiguous()
        audio_time = audio[0].to(video.dtype).contiguous()
        audio_before = torch.searchsorted(audio_time, frame_time, right=False)
        video_slot = torch.arange(video.shape[1]) + audio_before.view(-1, 1).expand(-1, per_frame).reshape(-1)
        # audio times increase strictly, so frame f precedes audio k exactly when k >= audio_before[f]
        frames_before = torch.bincount(audio_before, minlength=audio_time.numel() + 1).cumsum(0)[: audio_time.numel()]
        audio_slot = torch.arange(audio_time.numel()) + frames_before * per_frame
        merged = torch.empty(3, video.shape[1] + audio.shape[1], dtype=video.dtype)
        merged.index_copy_(1, video_slot, video)
        merged.index_copy_(1, audio_slot, audio.to(video.dtype))
        chunks.append(merged)
        if audio.shape[1] and bool(frame_time[-1] <= audio_time[-1]):
            return audio[:, -1:]  # the audio ran longer: its tail was appended last
        tail = video_slot > (audio_slot[-1] if audio.shape[1] else -1)
        return video[:, tail]  # the video ran longer: its tail was appended last

    def _merge_qwen2_5(self, chunks, video, audio, start) -> torch.Tensor:
        # Both streams are cut into chunks of `seconds_per_chunk`; video chunk j, then audio chunk j.
        video_chunk = _chunk_ids(video[0] - start, self._chunk)
        audio_chunk = _chunk_ids(audio[0] - start, self._chunk)
        keys = torch.cat([video_chunk * 2, audio_chunk * 2 + 1])
        order = torch.sort(keys, stable=True).indices
        chunks.append(torch.cat([video, audio], dim=1)[:, order])
        video_chunks = int(video_chunk[-1]) + 1 if video_chunk.numel() else 0
        audio_chunks = int(audio_chunk[-1]) + 1 if audio_chunk.numel() else 0
        if audio_chunks >= video_chunks and audio_chunks:
            return audio[:, audio_chunk == audio_chunks - 1]
        return video[:, video_chunk == video_chunks - 1]


def _chunk_ids(values: torch.Tensor, per_chunk: int) -> torch.Tensor:
    """The chunk of each value as transformers' ``get_chunked_index`` cuts a non-decreasing
    sequence: a new chunk starts at the first value reaching the next multiple of ``per_chunk``,
    at most one new chunk per value."""
    if values.numel() == 0:
        return values.long()
    target = torch.div(values, per_chunk, rounding_mode="floor").long() + 1
    index = torch.arange(values.numel())
    lag = torch.cummin(target - index, dim=0).values.clamp(max=2)
    return index + lag - 1


def _next(chunks: list[torch.Tensor]) -> Any:
    """Where the reference starts the next chunk: one past the previous chunk's largest position."""
    return chunks[-1].max() + 1 if chunks else 0


def _run(length: Any, start: Any) -> torch.Tensor:
    """``length`` consecutive positions from ``start`` on all three axes (a view: the three rows
    are one)."""
    return (torch.arange(length) + start).view(1, -1).expand(3, -1)
