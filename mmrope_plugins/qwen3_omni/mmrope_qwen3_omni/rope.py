"""Omni positions: the installed thinker's ``get_rope_index`` (``reference``) and a batched
kernel (``fast``), checked against each other when bound. Without the compiled loops the fast
implementation is a step-by-step kernel with the batched kernel's results and errors. Both
kernels also compute vLLM 0.33's positions (``convention="vllm"``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import torch

from mmrope_core import (
    InvalidInputError,
    MmropeError,
    PlaceholderMismatchError,
    RopeBinding,
    RopeKernel,
    SegmentCutError,
    UnknownConventionError,
    conventions,
)
from mmrope_core._compiled import native
from mmrope_core.conventions import TRANSFORMERS, VLLM_0_33
from mmrope_core.errors import counted
from mmrope_core.reference import config_only_model, probe_once

from .families import Family
from .layout import Counters, Item, Tokens, check_all_used, iter_items, read_items

IMPLEMENTATIONS = ("fast", "reference")
CONVENTIONS = (TRANSFORMERS, VLLM_0_33)

#: vLLM 0.33 counts Qwen3-Omni's audio tokens with an encoder window of 50 mel frames whatever
#: the config says.
VLLM_AUDIO_RULES = {True: "window_50", False: "qwen2_5"}


def bind(family: Family, processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding:
    implementation = options.get("implementation", "fast")
    if implementation not in IMPLEMENTATIONS:
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {family.name}; use "
                                f"one of {IMPLEMENTATIONS}")
    convention = conventions.convention(options, family.name, CONVENTIONS)
    integer = bool(options.get("integer_positions", False))
    thinker = thinker_config(family, processor, config)
    ids = token_ids(processor)
    markers = {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]}
    # the batched kernel is a compiled loop
    kernel, name = (FastRopeIndex, "batched kernel") if native is not None else (StepwiseRopeIndex, "step-by-step kernel")
    why = "" if native is not None else " (the compiled loops are missing)"
    if convention != TRANSFORMERS:
        if implementation == "reference":
            raise UnknownConventionError(
                f"position convention {convention!r} has no reference implementation in {family.name}: "
                f"implementation='reference' is the installed transformers' own get_rope_index, whose positions are "
                f"the 'transformers' convention. Drop implementation='reference': the fast kernels compute "
                f"{convention!r}"
            )
        # no probe: there is no vLLM here to agree with (the tests and benchmarks compare with vLLM's code)
        bound = kernel(family, thinker, markers, VLLM_AUDIO_RULES[family.float_positions], convention=convention)
        return RopeBinding("mrope", bound, "fast", f"{family.name}, {name}{why}{conventions.described(convention)}")
    dtype = torch.float32 if family.float_positions and not integer else torch.int64
    note = ", integer positions (fractional positions truncated)" if family.float_positions and integer else ""
    rule = agreeing_audio_rule(family, thinker, markers, kernel)
    if implementation == "fast" and rule is not None:
        return RopeBinding("mrope", kernel(family, thinker, markers, rule, position_dtype=dtype), "fast",
                           f"{family.name}, {name}{why}{note}")
    why = "" if implementation == "reference" else f" (the {name} disagrees with this transformers)"
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
        kwargs["audio_seqlens"] = _frames_per_audio(mask)
    seconds = multi_modal_inputs.get("second_per_grids", multi_modal_inputs.get("video_second_per_grid"))
    if seconds is not None:
        kwargs["second_per_grids"] = seconds if isinstance(seconds, torch.Tensor) else torch.tensor(seconds, dtype=torch.float32)
    use = mm_processor_kwargs.get("use_audio_in_video", mm_processor_kwargs.get("load_audio_from_video"))
    if use is not None:
        kwargs["use_audio_in_video"] = bool(use)
    return kwargs


def _frames_per_audio(mask: torch.Tensor) -> torch.Tensor:
    """Each audio's mel frames, ``feature_attention_mask.sum(-1)`` (int64); on the CPU in numpy,
    whose integer sums take a third of torch's on a batch's masks."""
    if mask.is_cpu and mask.dtype in (torch.int32, torch.int64, torch.bool, torch.int8, torch.uint8):
        return torch.from_numpy(mask.numpy().sum(-1, dtype=np.int64))
    return mask.sum(-1)


class _Implementation(RopeKernel):
    def __init__(self, family: Family, thinker: Any, position_dtype: torch.dtype | None = None,
                 convention: str = TRANSFORMERS) -> None:
        self.family = family
        self.config = thinker
        self.merge = int(thinker.vision_config.spatial_merge_size)
        self.convention = convention
        self.vllm = convention == VLLM_0_33
        # the reference's; vLLM's positions are int64 in both generations
        self.dtype = torch.float32 if family.float_positions and not self.vllm else torch.int64
        self.position_dtype = self.dtype if position_dtype is None else position_dtype
        # Qwen2.5-Omni's reference finds a video with its audio by its first video token;
        # vLLM reads no token inside the video's markers
        self.video_token_first = not family.float_positions and not self.vllm

    def check(self, rows: Sequence[np.ndarray], image_grid_thw, video_grid_thw, audio_lengths, second_per_grids,
              use_audio_in_video, tokens: Tokens, *, refuse_empty: bool = False) -> list[list[Item]]:
        """Each sample's media items, after checking inputs and layout; ``rows`` are each
        sample's valid tokens. ``refuse_empty``: a sample without tokens is an error where the
        reader reaches it, as in the batched kernel."""
        for key, value in (("image_grid_thw", image_grid_thw), ("video_grid_thw", video_grid_thw)):
            if value is not None and (not isinstance(value, torch.Tensor) or value.dim() != 2 or value.shape[1] != 3):
                raise InvalidInputError(f"{key} must be a tensor of shape (N, 3), got {type(value).__name__} "
                                        f"{tuple(getattr(value, 'shape', ()))}")
            if value is not None and bool((value <= 0).any()):
                raise InvalidInputError(f"{key} holds a size that is not positive: {value.tolist()}")
            if value is not None and bool((value[:, 1:] % self.merge != 0).any()):
                raise InvalidInputError(f"{key} holds a height or width not divisible by the spatial merge size "
                                        f"{self.merge}: {value.tolist()}")
        if video_grid_thw is not None:
            _check_seconds(second_per_grids, video_grid_thw)
        counters = Counters()
        items = []
        for sample, row in enumerate(rows):
            if refuse_empty and row.size == 0:
                raise InvalidInputError(f"sample {sample} has no valid token; drop empty samples")
            items.append(read_items(sample, row, tokens, counters, image_grid_thw=image_grid_thw,
                                    video_grid_thw=video_grid_thw, audio_lengths=audio_lengths, merge=self.merge,
                                    use_audio_in_video=use_audio_in_video, video_token_first=self.video_token_first))
            if self.vllm:
                _refuse_what_vllm_refuses(sample, items[-1])
        check_all_used(counters, image_grid_thw, video_grid_thw, audio_lengths)
        return items


def _refuse_what_vllm_refuses(sample: int, items: Sequence[Item]) -> None:
    with_audio = next((item for item in items if item.kind == "audio_in_video"), None)
    alone = next((item for item in items if item.kind == "audio"), None)
    if with_audio is not None and alone is not None:
        raise InvalidInputError(
            f"sample {sample}: an audio of its own (token {alone.start}) beside a video with its audio (token "
            f"{with_audio.start}). vLLM 0.33 refuses such a request (with use_audio_in_video every audio must be a "
            f"video's), so the vllm-0.33 convention has no positions for it; put that audio in a sample without "
            f"videos, or use the transformers convention"
        )


def _check_seconds(second_per_grids: torch.Tensor | None, video_grid_thw: torch.Tensor) -> None:
    if second_per_grids is None:
        raise InvalidInputError("videos need second_per_grids (the processor's video_second_per_grid)")
    if second_per_grids.numel() != video_grid_thw.shape[0]:
        raise InvalidInputError(f"second_per_grids has {counted(second_per_grids.numel(), 'value')} for "
                                f"{counted(video_grid_thw.shape[0], 'video')}; pass one per video")
    if not bool(torch.isfinite(second_per_grids.float()).all()) or bool((second_per_grids < 0).any()):
        raise InvalidInputError(f"second_per_grids must be finite and not negative: {second_per_grids.tolist()}")


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


def audio_window(family: Family, thinker: Any, rule: str | None) -> int:
    """The mel frames of one Qwen3-Omni encoder window half (``n_window``) under ``rule``; 0 for
    Qwen2.5-Omni, whose audio length has no window."""
    if not family.float_positions:
        return 0
    return int(thinker.audio_config.n_window) if rule == "config_window" else 50


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

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, image_grid_thw=None, video_grid_thw=None,
                   audio_seqlens=None, second_per_grids=None, use_audio_in_video: bool = False,
                   **unknown: Any) -> tuple[torch.Tensor, torch.Tensor]:
        _refuse_unknown(unknown)
        second_per_grids = _seconds(second_per_grids)
        mask = _ones_if_none(input_ids, attention_mask)
        if self.audio_rule is not None:
            lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
            rows = [input_ids[sample][valid_tokens(row)].cpu().numpy() for sample, row in enumerate(mask)]
            self.check(rows, image_grid_thw, video_grid_thw, lengths, second_per_grids, use_audio_in_video, self.tokens)
        return self.model.get_rope_index(
            input_ids=input_ids, image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
            attention_mask=mask.long(), use_audio_in_video=use_audio_in_video,
            audio_seqlens=audio_seqlens, second_per_grids=second_per_grids,
        )

    __call__ = rope_index


def audio_token_counts(family: Family, thinker: Any, rule: str | None, audio_seqlens: Any) -> torch.Tensor | None:
    if audio_seqlens is None:
        return None
    lengths = torch.as_tensor(audio_seqlens).reshape(-1).long()
    if bool((lengths < 0).any()):
        raise InvalidInputError(f"audio_seqlens (feature_attention_mask.sum(-1)) holds a negative length: "
                                f"{lengths.tolist()}")
    if family.float_positions:
        return qwen3_audio_tokens(lengths, audio_window(family, thinker, rule))
    return qwen2_5_audio_tokens(lengths)


def _refuse_unknown(unknown: Mapping[str, Any]) -> None:
    """The thinker's ``get_rope_index`` takes no other keyword: neither do its kernels."""
    if unknown:
        raise InvalidInputError(
            f"get_rope_index got {', '.join(map(repr, sorted(unknown)))}, which the Omni thinker's get_rope_index "
            f"does not take; it takes {', '.join(map(repr, INPUT_KEYS))}"
        )


INPUT_KEYS = ("image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids", "use_audio_in_video")


def _seconds(value: Any) -> torch.Tensor | None:
    if value is None or isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch.float32)


class _Kernel(_Implementation):
    """What the batched and the step-by-step kernels share: the config's sizes, checked when
    bound, and the audio-length rule the probe found (vLLM's, in its convention)."""

    def __init__(self, family: Family, thinker: Any, markers: Mapping[str, int], audio_rule: str,
                 position_dtype: torch.dtype | None = None, convention: str = TRANSFORMERS) -> None:
        super().__init__(family, thinker, position_dtype, convention)
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


# what _native.omni_positions returns
_WRITTEN, _MISMATCH, _PADDING_INSIDE, _BAD_MEDIA, _EMPTY_SAMPLE = range(5)


class FastRopeIndex(_Kernel):
    """The batched kernel: every sample and media item of a batch in one compiled read of the
    tokens, which finds and checks the items, and one write of the positions
    (``mmrope_core._native.omni_positions``); no Python runs per sample, item or token. When it
    refuses a batch, the item-by-item reader of :mod:`.layout` says why.

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
        _refuse_unknown(unknown)
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
        _refuse_unknown(unknown)
        positions, _ = self._on_device(True, input_ids, attention_mask, cu_seqlens, image_grid_thw, video_grid_thw,
                                       audio_seqlens, self._timing(second_per_grids, video_grid_thw),
                                       use_audio_in_video)
        return positions if positions.dtype == self.position_dtype else positions.to(self.position_dtype)

    def _on_device(self, text_row, input_ids, attention_mask, cu_seqlens, *media) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = _host_batch(input_ids, attention_mask)
        positions, deltas = self._placed(text_row, ids, mask, cu_seqlens, *media)
        if input_ids.device.type != "cpu":
            return positions.to(input_ids.device), deltas.to(input_ids.device)
        return positions, deltas

    def _placed(self, text_row, ids, mask, cu_seqlens, image_grid_thw, video_grid_thw, audio_seqlens,
                second_per_grids, use_audio_in_video) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = ids.shape
        first = count = None
        if cu_seqlens is not None:
            first, count = _segments(cu_seqlens, ids.shape, mask)
            mask = None
        images, videos, seconds, frames = _host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens)
        out = torch.empty((batch, 4, length) if text_row else (3, batch, length), dtype=self.dtype)
        deltas = torch.empty(batch if first is None else first.size, 1, dtype=self.dtype)
        text_only = image_grid_thw is None and video_grid_thw is None
        status = native.omni_positions(  # type: ignore[union-attr]
            out.numpy(), text_row, batch, length, ids.numpy(), None if mask is None else mask.numpy(), first, count,
            self._token_ids, (self.family.float_positions, bool(use_audio_in_video), text_only, self.vllm), self._sizes,
            self._per_second, images, videos, seconds, frames, deltas.numpy(),
            torch.get_num_threads())
        if status == _PADDING_INSIDE:
            return self._compacted(text_row, ids, mask, image_grid_thw, video_grid_thw, audio_seqlens,
                                   second_per_grids, use_audio_in_video)
        if status != _WRITTEN:
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
        self.check(rows, image_grid_thw, video_grid_thw, lengths, _seconds(second_per_grids), use_audio_in_video,
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


class StepwiseRopeIndex(_Kernel):
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
        _refuse_unknown(unknown)
        if cu_seqlens is not None:
            raise TypeError("the step-by-step Omni kernel does not place packed rows: unpack them first")
        ids, mask = _host_batch(input_ids, attention_mask)
        second_per_grids = self._timing(second_per_grids, video_grid_thw)
        _host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens)  # checked as the batched kernel does
        seconds = _seconds(second_per_grids) if video_grid_thw is not None else None
        lengths = audio_token_counts(self.family, self.config, self.audio_rule, audio_seqlens)
        mask = _ones_if_none(ids, mask)
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


def _host_batch(input_ids: Any, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The token ids as int64 and the mask as bool, contiguous on the host (the reference takes
    a token where the mask is 1)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise InvalidInputError(f"input_ids must be a (B, L) tensor, got {type(input_ids).__name__} "
                                f"{tuple(getattr(input_ids, 'shape', ()))}")
    ids = input_ids
    if ids.dtype is not torch.int64 or not ids.is_cpu or not ids.is_contiguous():
        ids = ids.to(device="cpu", dtype=torch.int64).contiguous()
    if attention_mask is not None:
        attention_mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 1
        if not attention_mask.is_cpu or not attention_mask.is_contiguous():
            attention_mask = attention_mask.cpu().contiguous()
    return ids, attention_mask


def _host_media(image_grid_thw, video_grid_thw, second_per_grids, audio_seqlens) -> tuple[Any, Any, Any, Any]:
    """The image and video grids, the seconds per video grid and the audio mel frames as host
    arrays (or None), their shapes and counts checked in the batched kernel's order."""
    videos = _host_grid("video_grid_thw", video_grid_thw)
    seconds = None
    if videos is not None:
        second_per_grids = _seconds(second_per_grids)
        _check_seconds_count(second_per_grids, video_grid_thw)
        seconds = _host(second_per_grids, torch.float32)
    frames = None if audio_seqlens is None else _host(torch.as_tensor(audio_seqlens), torch.int64)
    return _host_grid("image_grid_thw", image_grid_thw), videos, seconds, frames


def _host_grid(key: str, grid: Any) -> np.ndarray | None:
    if grid is None:
        return None
    if not isinstance(grid, torch.Tensor) or grid.dim() != 2 or grid.shape[1] != 3:
        raise InvalidInputError(f"{key} must be a tensor of shape (N, 3), got {type(grid).__name__} "
                                f"{tuple(getattr(grid, 'shape', ()))}")
    return _host(grid, torch.int64)


def _host(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``tensor``'s values as a contiguous numpy array of ``dtype`` on the host, without a copy
    when it is one (each check here costs a fraction of a conversion's microsecond)."""
    if tensor.dtype is dtype and tensor.is_cpu and not tensor.requires_grad and tensor.is_contiguous():
        return tensor.numpy()
    return tensor.detach().to(device="cpu", dtype=dtype).contiguous().numpy()


def _check_seconds_count(second_per_grids: torch.Tensor | None, video_grid_thw: torch.Tensor) -> None:
    if second_per_grids is None or second_per_grids.numel() != video_grid_thw.shape[0]:
        _check_seconds(second_per_grids, video_grid_thw)


def _segments(cu_seqlens: Any, shape: tuple[int, int], mask: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """The first token and the length of each segment of one packed row."""
    if shape[0] != 1 or (mask is not None and not bool(mask.all())):
        raise InvalidInputError(f"cu_seqlens describes one packed (1, L) row without padding, got a batch of shape "
                                f"{tuple(shape)}{' with padding' if mask is not None else ''}")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point:
        raise InvalidInputError("cu_seqlens must be a 1-D integer tensor (K + 1,) of segment boundaries")
    bounds = _host(cu_seqlens, torch.int64)
    count = np.diff(bounds)
    if bounds.size < 2 or bounds[0] != 0 or bounds[-1] != shape[1] or count.min() <= 0:
        raise InvalidInputError(f"cu_seqlens must increase from 0 to the row length {shape[1]}, got {bounds.tolist()}")
    return np.ascontiguousarray(bounds[:-1]), count


# -- does the fast implementation agree with the installed reference? ------------------------------

AUDIO_RULES = {True: ("config_window", "window_50"), False: ("qwen2_5",)}


def agreeing_audio_rule(family: Family, thinker: Any, markers: Mapping[str, int],
                        kernel: type[_Kernel] = FastRopeIndex) -> str | None:
    """The audio-length rule under which ``kernel`` (the batched kernel, or without the compiled
    loops the step-by-step one) equals the installed reference on probe batches, or None (with
    one warning per process) when none does."""
    from .probe import probe_batches

    def probe() -> str | None:
        reference = ReferenceRopeIndex(family, thinker, markers)
        tokens = tokens_of(thinker, markers)
        return next((rule for rule in AUDIO_RULES[family.float_positions]
                     if _agrees(kernel(family, thinker, markers, rule), reference,
                                probe_batches(family, tokens, reference.merge, thinker, rule))), None)

    key = ("qwen3_omni", kernel.__name__, family.name, thinker.position_id_per_seconds,
           getattr(thinker, "seconds_per_chunk", None), getattr(thinker.audio_config, "n_window", None),
           int(thinker.vision_config.spatial_merge_size))
    return probe_once(key, probe, fast=f"mmrope-qwen3-omni: the fast {family.name} implementation")


def _agrees(fast: _Kernel, reference: ReferenceRopeIndex, batches) -> bool:
    for batch in batches:
        try:
            want = reference(**batch)
        except Exception:  # the batch's audio lengths follow another rule than this reference's
            return False
        try:
            got = fast.rope_index(**batch)
        except MmropeError:  # refuses what this reference places
            return False
        if not _equal(got, want):
            return False
    return True


def _equal(got, want) -> bool:
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))
