"""Omni positions: the installed thinker's ``get_rope_index`` (``reference``) and an
implementation without per-token Python (``fast``), checked against each other when bound."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from mmrope_core import InvalidInputError, RopeBinding
from mmrope_core.kernel import RopeKernel
from mmrope_core.reference import config_only_model, probe_once

from .families import Family
from .layout import Counters, Item, Tokens, check_all_used, read_items

IMPLEMENTATIONS = ("fast", "reference")


def bind(family: Family, processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    implementation = options.get("implementation", "fast")
    if implementation not in IMPLEMENTATIONS:
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {family.name}; use "
                                f"one of {IMPLEMENTATIONS}")
    integer = bool(options.get("integer_positions", False))
    thinker = thinker_config(family, processor, config)
    ids = token_ids(processor)
    markers = {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]}
    rule = agreeing_audio_rule(family, thinker, markers)
    dtype = torch.float32 if family.float_positions and not integer else torch.int64
    note = ", integer positions (fractional positions truncated)" if family.float_positions and integer else ""
    if implementation == "fast" and rule is not None:
        return RopeBinding("mrope", FastRopeIndex(family, thinker, markers, rule, dtype), "fast",
                           f"{family.name}, loop-free implementation{note}")
    why = "" if implementation == "reference" else " (the fast implementation disagrees with this transformers)"
    return RopeBinding("mrope", ReferenceRopeIndex(family, thinker, markers, rule, dtype), "reference",
                       f"{family.name}, transformers reference{why}{note}")


def thinker_config(family: Family, processor: Any, config: Any) -> Any:
    """The thinker config (full model config or thinker config accepted; None: the default),
    completed with the vision start token the default configs lack."""
    import copy

    import transformers

    if config is None:
        config = transformers.AutoConfig.for_model(family.model_type)
    model_type = getattr(config, "model_type", None)
    if model_type == family.model_type:
        config = config.thinker_config
    elif model_type != family.thinker_model_type:
        raise InvalidInputError(
            f"{type(processor).__name__} belongs to {family.name}, whose configs have model_type "
            f"{family.model_type!r} (or {family.thinker_model_type!r} for the thinker), but the config "
            f"given has {model_type!r}. Pass the model's config or None"
        )
    config = copy.copy(config)
    ids = token_ids(processor)
    from_processor = {
        "vision_start_token_id": ids["vision_bos"],
        "image_token_id": ids["image"],
        "video_token_id": ids["video"],
        "audio_token_id": ids["audio"],
        "audio_start_token_id": ids["audio_bos"],
    }
    for key, value in from_processor.items():
        have = getattr(config, key, None)
        if have is None:
            setattr(config, key, value)
        elif have != value:
            raise InvalidInputError(
                f"the config's {key} is {have} but the processor's tokenizer uses {value}; "
                f"pass the config saved with this processor"
            )
    return config


def token_ids(processor: Any) -> dict[str, int]:
    """Ids of the processor's placeholder and marker tokens, from its tokenizer."""
    convert = processor.tokenizer.convert_tokens_to_ids
    names = ("image", "video", "audio", "vision_bos", "vision_eos", "audio_bos", "audio_eos")
    return {name: convert(getattr(processor, f"{name}_token")) for name in names}


def tokens_of(config: Any, processor_tokens: Mapping[str, int]) -> Tokens:
    return Tokens(
        image=config.image_token_id,
        video=config.video_token_id,
        audio=config.audio_token_id,
        vision_start=config.vision_start_token_id,
        vision_end=processor_tokens["vision_end"],
        audio_start=config.audio_start_token_id,
        audio_end=processor_tokens["audio_end"],
    )


def rope_index_kwargs(multi_modal_inputs: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``audio_seqlens`` from ``feature_attention_mask``, the video timing and ``use_audio_in_video``."""
    kwargs: dict[str, Any] = {}
    for key in ("image_grid_thw", "video_grid_thw"):
        if multi_modal_inputs.get(key) is not None:
            kwargs[key] = multi_modal_inputs[key]
    mask = multi_modal_inputs.get("feature_attention_mask")
    if mask is not None:
        kwargs["audio_seqlens"] = mask.sum(-1)
    seconds = multi_modal_inputs.get("second_per_grids", multi_modal_inputs.get("video_second_per_grid"))
    if seconds is not None:
        kwargs["second_per_grids"] = seconds if isinstance(seconds, torch.Tensor) else torch.tensor(seconds, dtype=torch.float32)
    use = mm_processor_kwargs.get("use_audio_in_video", mm_processor_kwargs.get("load_audio_from_video"))
    if use is not None:
        kwargs["use_audio_in_video"] = bool(use)
    return kwargs


class _Implementation(RopeKernel):
    def __init__(self, family: Family, thinker: Any, position_dtype: torch.dtype | None = None) -> None:
        self.family = family
        self.config = thinker
        self.merge = int(thinker.vision_config.spatial_merge_size)
        self.position_dtype = position_dtype or (torch.float32 if family.float_positions else torch.int64)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self(input_ids, attention_mask, **inputs)

    def check(self, input_ids, spans, image_grid_thw, video_grid_thw, audio_lengths, second_per_grids,
              use_audio_in_video, tokens: Tokens) -> list[list[Item]]:
        """Each sample's media items, after checking inputs and layout; ``spans`` index each
        sample's valid tokens."""
        for key, value in (("image_grid_thw", image_grid_thw), ("video_grid_thw", video_grid_thw)):
            if value is not None and (not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape[1] != 3):
                raise InvalidInputError(f"{key} must be a tensor of shape (N, 3), got {type(value).__name__} "
                                        f"{tuple(getattr(value, 'shape', ()))}")
            if value is not None and bool((value <= 0).any()):
                raise InvalidInputError(f"{key} holds a size that is not positive: {value.tolist()}")
        if video_grid_thw is not None:
            if second_per_grids is None:
                raise InvalidInputError("videos need second_per_grids (the processor's video_second_per_grid)")
            if second_per_grids.numel() != video_grid_thw.shape[0]:
                raise InvalidInputError(f"second_per_grids has {second_per_grids.numel()} values for "
                                        f"{video_grid_thw.shape[0]} videos; pass one per video")
            if not bool(torch.isfinite(second_per_grids.float()).all()) or bool((second_per_grids < 0).any()):
                raise InvalidInputError(f"second_per_grids must be finite and not negative: {second_per_grids.tolist()}")
        counters = Counters()
        items = []
        for sample, span in enumerate(spans):
            row = input_ids[sample][span].cpu().numpy()
            items.append(read_items(sample, row, tokens, counters, image_grid_thw=image_grid_thw,
                                    video_grid_thw=video_grid_thw, audio_lengths=audio_lengths, merge=self.merge,
                                    use_audio_in_video=use_audio_in_video))
        check_all_used(counters, image_grid_thw, video_grid_thw, audio_lengths)
        return items


def valid_tokens(mask_row: torch.Tensor) -> slice | torch.Tensor:
    """The valid tokens of one sample: a slice when they form one span (left or right padding),
    which indexes far faster than the mask itself."""
    flags = mask_row.view(torch.int8) if mask_row.dtype == torch.bool else mask_row
    count = int(flags.sum())
    if count == 0:
        return slice(0, 0)
    first = int(flags.argmax())
    if int(flags[first : first + count].sum()) == count:
        return slice(first, first + count)
    return mask_row.bool()


def _ones_if_none(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    # the Qwen3-Omni reference cannot run without a mask
    return torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()


def qwen3_audio_tokens(lengths: torch.Tensor, n_window: int) -> torch.Tensor:
    """Audio tokens of Qwen3-Omni's encoder for ``lengths`` mel frames (chunks of ``2 * n_window``)."""
    chunk = n_window * 2
    rest = lengths % chunk
    frames = (rest - 1) // 2 + 1
    return ((frames - 1) // 2 + 1 - 1) // 2 + 1 + (lengths // chunk) * 13


def qwen2_5_audio_tokens(lengths: torch.Tensor) -> torch.Tensor:
    return ((lengths - 1) // 2 + 1 - 2) // 2 + 1


class ReferenceRopeIndex(_Implementation):
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

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 image_grid_thw=None, video_grid_thw=None, audio_seqlens=None, second_per_grids=None,
                 use_audio_in_video: bool = False, **ignored: Any) -> tuple[torch.Tensor, torch.Tensor]:
        second_per_grids = _seconds(second_per_grids)
        if self.audio_rule is not None:
            lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
            spans = [valid_tokens(row) for row in _ones_if_none(input_ids, attention_mask)]
            self.check(input_ids, spans, image_grid_thw, video_grid_thw, lengths, second_per_grids,
                       use_audio_in_video, self.tokens)
        return self.model.get_rope_index(
            input_ids=input_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
            attention_mask=_ones_if_none(input_ids, attention_mask).long(), use_audio_in_video=use_audio_in_video,
            audio_seqlens=audio_seqlens, second_per_grids=second_per_grids,
        )


def audio_token_counts(family: Family, thinker: Any, rule: str, audio_seqlens: Any) -> torch.Tensor | None:
    if audio_seqlens is None:
        return None
    lengths = torch.as_tensor(audio_seqlens).reshape(-1).long()
    if family.float_positions:
        n_window = thinker.audio_config.n_window if rule == "config_window" else 50
        return qwen3_audio_tokens(lengths, n_window)
    return qwen2_5_audio_tokens(lengths)


def _seconds(value: Any) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float32)


class FastRopeIndex(_Implementation):
    """The same positions with no Python loop over tokens: loops run over samples and media items,
    and the audio-in-video interleave is a merge computed with ``searchsorted``."""

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str,
                 position_dtype: torch.dtype | None = None) -> None:
        super().__init__(family, thinker, position_dtype)
        self.tokens = tokens_of(thinker, markers)
        self.audio_rule = audio_rule
        self.per_second = thinker.position_id_per_seconds
        self.per_chunk = int(thinker.position_id_per_seconds * getattr(thinker, "seconds_per_chunk", 2))

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 image_grid_thw=None, video_grid_thw=None, audio_seqlens=None, second_per_grids=None,
                 use_audio_in_video: bool = False, **ignored: Any) -> tuple[torch.Tensor, torch.Tensor]:
        second_per_grids = _seconds(second_per_grids)
        mask = _ones_if_none(input_ids, attention_mask)
        if image_grid_thw is None and video_grid_thw is None:
            return self._text_only(input_ids, mask)
        lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
        spans = [valid_tokens(row) for row in mask]
        items = self.check(input_ids, spans, image_grid_thw, video_grid_thw, lengths, second_per_grids,
                           use_audio_in_video, self.tokens)
        if self.family.float_positions:
            out = torch.zeros(3, *input_ids.shape, dtype=torch.float32, device=input_ids.device)
        else:
            out = torch.ones(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
        deltas = []
        for sample, (sample_items, valid) in enumerate(zip(items, spans)):
            count = int(mask[sample].sum())
            chunks = self._sample(sample_items, count, image_grid_thw, video_grid_thw, lengths, second_per_grids)
            positions = torch.cat([chunk.float() for chunk in chunks] if self.family.float_positions else chunks, dim=1)
            out[:, sample, valid] = positions.to(out.dtype)
            deltas.append(positions.max() + 1 - count)
        return out, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)

    def _text_only(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # what the reference does when no image or video grid is given, audio included
        mask = mask.long()
        positions = (mask.float() if self.family.float_positions else mask).cumsum(-1) - 1
        positions.masked_fill_(mask == 0, 1)
        positions = positions.unsqueeze(0).expand(3, -1, -1)
        highest = positions.max(0, keepdim=False)[0].max(-1, keepdim=True)[0]
        return positions, highest + 1 - torch.sum(mask, dim=-1, keepdim=True)

    def _sample(self, items, count, image_grid_thw, video_grid_thw, lengths, seconds) -> list[torch.Tensor]:
        chunks: list[torch.Tensor] = []
        cursor = 0  # index of the next token of the sample
        qwen3 = self.family.float_positions
        for item in items:
            text = item.start - cursor
            pairs = item.kind == "audio_in_video"
            if qwen3:
                start = _next(chunks)
                if text:
                    chunks.append(_run(text, start))
                    start = start + text
                opening = 2 if pairs else 1
                chunks.append(_run(opening, start))
                media_start = start + opening
            else:
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
            frames = (torch.arange(image_grid_thw[item.index][0]) * 1 * self.per_second)
            chunks.append(self._vision(start, image_grid_thw[item.index], frames.float() if qwen3 else frames.long()))
            return chunks[-1]
        frames = torch.arange(video_grid_thw[item.index][0]) * seconds[item.index].cpu().float() * self.per_second
        video = self._vision(start, video_grid_thw[item.index], frames.float() if qwen3 else frames.long())
        if item.kind == "video":
            chunks.append(video)
            return video
        audio = _run(lengths[item.audio_index], start)
        if qwen3:
            return self._merge_qwen3(chunks, video, audio, int(video_grid_thw[item.index][0]))
        return self._merge_qwen2_5(chunks, video, audio, start)

    def _vision(self, start, grid, frames: torch.Tensor) -> torch.Tensor:
        height, width = int(grid[1]) // self.merge, int(grid[2]) // self.merge
        dtype = torch.float32 if self.family.float_positions else torch.int64
        out = torch.empty(3, frames.numel(), height, width, dtype=dtype)
        out[0] = frames.to(dtype).view(-1, 1, 1) + start
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
        video_chunk = _chunk_ids(video[0] - start, self.per_chunk)
        audio_chunk = _chunk_ids(audio[0] - start, self.per_chunk)
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


# -- does the fast implementation agree with the installed reference? ------------------------------

AUDIO_RULES = {True: ("config_window", "window_50"), False: ("qwen2_5",)}


def agreeing_audio_rule(family: Family, thinker: Any, markers: Mapping[str, int]) -> str | None:
    """The audio-length rule under which the fast implementation equals the installed reference
    on probe batches, or None (with one warning per process) when none does."""
    from .probe import probe_batches

    def probe() -> str | None:
        reference = ReferenceRopeIndex(family, thinker, markers)
        tokens = tokens_of(thinker, markers)
        return next((rule for rule in AUDIO_RULES[family.float_positions]
                     if _agrees(FastRopeIndex(family, thinker, markers, rule), reference,
                                probe_batches(family, tokens, reference.merge, thinker, rule))), None)

    key = ("qwen3_omni", family.name, thinker.position_id_per_seconds, getattr(thinker, "seconds_per_chunk", None),
           getattr(thinker.audio_config, "n_window", None), int(thinker.vision_config.spatial_merge_size))
    return probe_once(key, probe, fast=f"mmrope-qwen3-omni: the fast {family.name} implementation")


def _agrees(fast: FastRopeIndex, reference: ReferenceRopeIndex, batches) -> bool:
    for batch in batches:
        try:
            want = reference(**batch)
        except Exception:  # the batch's audio lengths follow another rule than this reference's
            return False
        if not _equal(fast(**batch), want):
            return False
    return True


def _equal(got, want) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
