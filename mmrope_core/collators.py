"""Data collators for transformers' ``Trainer`` and TRL's ``SFTTrainer``: processor outputs, one
per sample, in; the model's inputs with their position ids out, padded or packed into one row."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from ._names import checked_keywords
from .batching import BatchLayout, MediaKey
from .engine import RopeEngine
from .errors import CollateError, InvalidInputError, PaddingUnsupportedError, a
from .media import require_string_keys, require_values
from .parallel import check_split, padded_lengths, split_packed_row
from .segments import packed_row_support

IGNORE_INDEX = -100  # what transformers' and TRL's losses skip
_TOKEN_KEYS = ("input_ids", "attention_mask", "labels", "generated_mask")
_TOKEN_TYPES = "token_type_ids"  # the suffix of the keys holding one type per token (mm_, moe_mm_ ...)


class PaddedCollator:
    """Samples to one padded batch: ``input_ids``, ``attention_mask``, ``labels``, ``position_ids``
    in the model's layout (``(4, B, L)`` for M-RoPE, ``(B, L)`` for 1-D) and the media.

    A sample is one processor output: ``input_ids`` ``(1, L)`` (or ``(L,)``) and optionally its
    ``attention_mask`` and ``labels`` of the same shape; without labels, the ids are the labels.
    Given labels are kept, padding gets -100. ``mm_processor_kwargs`` are the processor
    arguments positions depend on (``{"use_audio_in_video": True}`` for Omni).

    ``convention`` trains on a rollout engine's positions (``"vllm"``, ``"sglang"``; see
    :mod:`mmrope_core.conventions`): the engine's family must offer it. A sample's
    ``generated_mask`` (like its ids: 1 where the rollout generated the token) reaches the
    positions and stays out of the batch.

    Media are batched as the family's processor batches them (the engine's
    :attr:`~mmrope_core.RopeEngine.batch_layout`); a padding side the model's own layers get
    wrong raises :class:`~mmrope_core.PaddingUnsupportedError` here. Left-padded, a row's first
    label is -100: the pad before it would predict it, which the sample alone never does.
    """

    @checked_keywords
    def __init__(self, engine: RopeEngine, padding_side: str = "right",
                 mm_processor_kwargs: Mapping[str, Any] | None = None, *, convention: str | None = None) -> None:
        _check_engine(engine)
        if padding_side not in ("left", "right"):
            raise InvalidInputError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        self.engine = engine if convention is None else engine.with_convention(convention)
        refused = self.engine.batch_layout.refused_sides.get(padding_side)
        if refused:
            other = "right" if padding_side == "left" else "left"
            raise PaddingUnsupportedError(f"{_model_name(self.engine)} cannot train samples padded on the "
                                          f"{padding_side}: {refused}; use padding_side={other!r}")
        self.padding_side = padding_side
        self.mm_processor_kwargs = _processor_kwargs(mm_processor_kwargs)
        #: the batch's positions in one call, or each sample's alone where the kernel may number
        #: media across the batch (HunYuan-VL): decided once, here
        self.samples_independent = self.engine.samples_independent

    @checked_keywords
    def __call__(self, samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        read = _read_samples(samples)
        labels = [sample.pop("labels") for sample in read]
        generated = _generated(read)
        aligned = _token_aligned(read, self.engine.batch_layout)
        per_token = {key: [sample.pop(key) for sample in read] for key in aligned}
        input_ids, attention_mask, inputs = self.engine.batch(read, padding_side=self.padding_side)
        generated_mask = None if generated is None else self._padded(generated, input_ids.shape[1], 0)
        if self.samples_independent:
            positions = self.engine.compute_position_ids(input_ids, attention_mask, inputs, self.mm_processor_kwargs,
                                                         generated_mask=generated_mask)
        else:
            positions = self._each_alone(input_ids, attention_mask, read, generated_mask)
        positions = _as_the_model_takes(self.engine, positions)
        if self.engine.batch_layout.labels_right:  # a sequence of their own (decoder targets): padded on the right
            batch_labels = torch.cat([F.pad(row, (0, input_ids.shape[1] - row.shape[1]), value=IGNORE_INDEX)
                                      for row in labels])
        else:
            batch_labels = self._padded(labels, input_ids.shape[1], IGNORE_INDEX).masked_fill(attention_mask == 0,
                                                                                              IGNORE_INDEX)
            if self.padding_side == "left":  # a pad would predict the first token, which the sample alone never does
                starts = input_ids.shape[1] - torch.tensor([row.shape[1] for row in labels])
                batch_labels[torch.arange(len(labels)), starts] = IGNORE_INDEX
        types = {key: self._padded(rows, input_ids.shape[1], 0) for key, rows in per_token.items()}
        given = {"position_ids": positions} if self.engine.batch_layout.takes_positions else {}
        return {"input_ids": input_ids, "attention_mask": attention_mask, **given, "labels": batch_labels, **types,
                **inputs}

    def _each_alone(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, read: list[dict[str, Any]],
                    generated_mask: torch.Tensor | None) -> torch.Tensor:
        """Each row's positions computed as its sample's alone, padded as in the batch, where the
        model's method may number the batch's media across rows: a sample must not depend on the
        samples before it."""
        rows = []
        for row, sample in enumerate(read):
            media = {key: value for key, value in sample.items() if key not in ("input_ids", "attention_mask")}
            rows.append(self.engine.compute_position_ids(
                input_ids[row:row + 1], attention_mask[row:row + 1], media, self.mm_processor_kwargs,
                generated_mask=None if generated_mask is None else generated_mask[row:row + 1]))
        return torch.cat(rows)

    def _padded(self, rows: list[torch.Tensor], width: int, value: int) -> torch.Tensor:
        """``(1, L_i)`` rows as one ``(B, width)`` tensor, padded with ``value`` where the ids are."""
        sides = [(width - row.shape[1], 0) if self.padding_side == "left" else (0, width - row.shape[1]) for row in rows]
        return torch.cat([F.pad(row, side, value=value) for row, side in zip(rows, sides)])


class PackedCollator:
    """Samples to one padding-free ``(1, T)`` row: ``input_ids``, ``labels``, ``position_ids``
    (``(4, 1, T)`` for M-RoPE, ``(1, T)`` for 1-D; each segment's as its sample alone) and the
    media of every sample in order, and ``use_cache=False``. There is no ``attention_mask``:
    transformers separates the segments where the text row restarts, when no cache is used.

    Built only for models whose layers then train each segment as its sample alone: a model whose
    layers would mix them (state carried along the row without the kernels that take the
    boundaries, bidirectional attention, image masks read by position) raises
    :class:`~mmrope_core.PackingUnsupportedError` here, naming why and what to do. Models whose
    layers read the boundaries (linear attention with its kernels) get them in every batch; a
    batch longer than a model keeps apart (Llama 4's rows, an indexer's samples) raises it too.

    Labels are the given ones (or the ids) with -100 at every segment's first token, so that no
    sample learns to predict the next sample's first token. ``max_length`` refuses rows longer
    than it (with ``split``, the padded row); ``flash_attn_kwargs=True`` adds ``cu_seq_lens_q/k`` and ``max_length_q/k``, which
    flash-attention's varlen kernels take instead of scanning the positions. ``convention`` and
    a sample's ``generated_mask`` as in :class:`PaddedCollator`.

    ``split=(scheme, size, rank)`` returns rank ``rank``'s part of the row for sequence or context
    parallel (schemes in :mod:`mmrope_core.parallel`): the row is padded so that the scheme can cut
    it (ids the tokenizer's pad token, labels -100, positions of text continuing the segment), the
    whole row's ``cu_seqlens_padded``, ``cu_seq_lens_q/k`` and ``max_length_q/k`` are added, and the
    per-token tensors are cut with :func:`~mmrope_core.parallel.split_batch`'s rule. ``shift_labels``
    is added, each token's target on the whole row (the next token's label; -100 at each segment's
    last token and on padding) cut like the tokens: a rank's part ends mid-row, so a loss that
    shifts the rank's ``labels`` itself would pair tokens of different chunks; transformers' causal-LM
    loss reads ``shift_labels`` where given. ``labels`` is cut as it is. Every rank
    builds the same row; real tokens keep the ids, labels and positions they have without ``split``.
    Rank None returns the padded row uncut, for :func:`~mmrope_core.parallel.split_batch` to cut
    later (where one process builds the batch and hands it to the ranks).
    """

    @checked_keywords
    def __init__(self, engine: RopeEngine, max_length: int | None = None, flash_attn_kwargs: bool = False,
                 mm_processor_kwargs: Mapping[str, Any] | None = None, *, convention: str | None = None,
                 split: tuple[str, int, int | None] | None = None) -> None:
        _check_engine(engine)
        self.split = None if split is None else check_split(split)
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise InvalidInputError(f"max_length must be a positive int or None, got {max_length!r}")
        if not isinstance(flash_attn_kwargs, bool):
            raise InvalidInputError(f"flash_attn_kwargs must be True or False, got {flash_attn_kwargs!r}")
        self.engine = engine if convention is None else engine.with_convention(convention)
        self.support = packed_row_support(self.engine)
        self.support.require()
        self.max_length = max_length
        self.flash_attn_kwargs = flash_attn_kwargs
        self.mm_processor_kwargs = _processor_kwargs(mm_processor_kwargs)

    @checked_keywords
    def __call__(self, samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        read = _read_samples(samples)
        for index, sample in enumerate(read):
            mask = sample.pop("attention_mask", None)
            if mask is not None and not bool(mask.all()):
                raise CollateError(f"sample {index}: attention_mask has padding (0s), which a packed row cannot "
                                   f"hold; give each sample unpadded (one processor call per sample)")
        lengths = [sample["input_ids"].shape[1] for sample in read]
        self._check_length(lengths)
        self.support.require_lengths(lengths)  # layers that keep segments apart only in short rows or samples
        generated = _generated(read)
        token_types = _token_aligned(read, self.engine.batch_layout)
        cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
        input_ids = torch.cat([sample.pop("input_ids") for sample in read], dim=1)
        labels = torch.cat([sample.pop("labels") for sample in read], dim=1)
        labels[0, cu_seqlens[:-1]] = IGNORE_INDEX  # the token before a segment's first one belongs to another sample
        per_token = {key: torch.cat([sample.pop(key) for sample in read], dim=1) for key in token_types}
        inputs = self.engine.collate(read)
        positions = self.engine.compute_position_ids(input_ids, None, inputs, self.mm_processor_kwargs,
                                                     cu_seqlens=cu_seqlens,
                                                     generated_mask=None if generated is None else torch.cat(generated, 1))
        positions = _as_the_model_takes(self.engine, positions)
        # a cache turns the model's segment detection off: the segments would attend to one another
        batch = {"input_ids": input_ids, "position_ids": positions, "labels": labels, **per_token, **inputs,
                 "use_cache": False}
        if self.flash_attn_kwargs or self.support.boundaries:
            boundaries = cu_seqlens.to(torch.int32)
            longest = max(lengths)
            batch.update(cu_seq_lens_q=boundaries, cu_seq_lens_k=boundaries.clone(),
                         max_length_q=longest, max_length_k=longest)
        if self.support.boundaries:  # what causal-conv1d reads: each token's segment
            batch["seq_idx"] = torch.arange(len(lengths), dtype=torch.int32).repeat_interleave(
                torch.tensor(lengths))[None]
        if self.split is not None:
            pad = getattr(getattr(self.engine.processor, "tokenizer", None), "pad_token_id", None)
            # a rank's part ends mid-row: its model cannot shift its labels, so each token's target travels
            return split_packed_row(batch, lengths, self.split, pad_token_id=pad or 0, shift_labels=True,
                                    token_keys=["input_ids", "labels", "position_ids", *per_token])
        return batch

    def _check_length(self, lengths: list[int]) -> None:
        if self.max_length is None:
            return
        if self.split is not None:  # each rank's memory follows the padded row
            padded = int(padded_lengths(lengths, self.split).sum())
            if padded > self.max_length:
                raise CollateError(
                    f"the {len(lengths)} samples hold {sum(lengths)} tokens, {padded} once padded for "
                    f"split={self.split!r} (the padding counts: it takes each rank's memory like real tokens), "
                    f"more than max_length={self.max_length} for one packed row; lower the batch size, or group "
                    f"samples by length so that a batch fits")
            return
        if sum(lengths) <= self.max_length:
            return
        too_long = [index for index, length in enumerate(lengths) if length > self.max_length]
        if too_long:
            raise CollateError(f"sample {too_long[0]} alone has {lengths[too_long[0]]} tokens, more than "
                               f"max_length={self.max_length}; truncate it before the media (or drop it) when "
                               f"preparing the dataset")
        raise CollateError(f"the {len(lengths)} samples hold {sum(lengths)} tokens, more than max_length="
                           f"{self.max_length} for one packed row; lower the batch size, or group samples by "
                           f"length so that a batch fits")


def _check_engine(engine: Any) -> None:
    if not isinstance(engine, RopeEngine):
        raise InvalidInputError(f"a collator takes a RopeEngine, got {type(engine).__name__}; build it once with "
                                f"RopeEngine.from_pretrained(path) or RopeEngine.from_processor(processor, config)")


def _as_the_model_takes(engine: RopeEngine, positions: torch.Tensor) -> torch.Tensor:
    """The engine's positions in the form the model takes: M-RoPE rows first (only those its rotary
    embedding reads), 1-D positions counted from the model's first position."""
    layout = engine.batch_layout
    if engine.rope_kind == "mrope":
        positions = positions.transpose(0, 1)  # (B, 4, L) -> (4, B, L): the model takes the rows first
        return positions if layout.text_positions else positions[1:]
    return positions + layout.first_position if layout.first_position else positions


def _per_token(rule: MediaKey | None) -> bool:
    """A media key holding one value per token and nothing else, shaped like the ids."""
    return rule is not None and rule.token_dim == 1 and rule.items_dim is None and rule.join == "rows"


def _model_name(engine: RopeEngine) -> str:
    processor = type(engine.processor).__name__
    model_type = getattr(engine.config, "model_type", None)
    return f"{model_type} ({processor})" if model_type else processor


def _processor_kwargs(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidInputError(f"mm_processor_kwargs must be a dict of the processor's arguments (or None), "
                                f"got {type(value).__name__}")
    return None if value is None else dict(value)


def _read_samples(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checked shallow copies of the samples: None-valued keys left out (a ``datasets`` row holds
    None for what its sample lacks), token keys as ``(1, L)`` tensors, ``labels`` always there."""
    if isinstance(samples, (Mapping, str, bytes)) or not isinstance(samples, Iterable):
        raise CollateError(f"a collator takes a list of samples (one processor output each), got "
                           f"{type(samples).__name__}")
    read = []
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise CollateError(f"sample {index} is {a(type(sample).__name__)}, not a dict of processor outputs")
        require_string_keys(f"sample {index}", sample)
        copy = {key: value for key, value in sample.items() if value is not None}
        ids = _token_row(index, "input_ids", copy.get("input_ids"))
        if ids is None:
            raise CollateError(_without_ids(index, copy))
        if ids.shape[1] == 0:
            raise CollateError(f"sample {index} has no tokens (input_ids of length 0); drop it from the dataset")
        copy["input_ids"] = ids
        for key in _TOKEN_KEYS[1:]:
            row = _token_row(index, key, copy.get(key))
            if row is not None and row.shape != ids.shape:
                raise CollateError(f"sample {index}: {key} has shape {tuple(row.shape)}, input_ids "
                                   f"{tuple(ids.shape)}; give one {key} value per token")
            if row is not None:
                copy[key] = row
        labels = copy.setdefault("labels", ids)
        if not (labels.dtype.is_floating_point or labels.dtype.is_complex):  # the loss takes int64 targets
            copy["labels"] = labels.long()
        for key, value in copy.items():  # per-token keys follow the ids' layout
            if key.endswith(_TOKEN_TYPES) and isinstance(value, torch.Tensor) and value.shape == ids.shape[1:]:
                copy[key] = value[None]
        read.append(copy)
    if not read:
        raise CollateError("no samples to collate: pass at least one processor output")
    return read


def _generated(samples: list[dict[str, Any]]) -> list[torch.Tensor] | None:
    """Each sample's ``generated_mask`` (taken out of it; zeros where a sample has none), or None
    where no sample has one."""
    given = [sample.pop("generated_mask", None) for sample in samples]
    if all(mask is None for mask in given):
        return None
    return [torch.zeros_like(sample["input_ids"]) if mask is None else mask.long() if mask.dtype == torch.bool else mask
            for sample, mask in zip(samples, given)]


def _token_row(index: int, key: str, value: Any) -> torch.Tensor | None:
    """``value`` as a ``(1, L)`` tensor; None when it is missing."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise CollateError(f"sample {index}: {key} is {a(type(value).__name__)}, not a tensor; call the processor "
                           f"with return_tensors='pt', or read a datasets.Dataset with .with_format('torch')")
    require_values(f"sample {index}: {key}", value)
    if value.dim() == 1:
        return value[None]
    if value.dim() != 2 or value.shape[0] != 1:
        raise CollateError(f"sample {index}: {key} must be (1, L) or (L,) per sample, got {tuple(value.shape)}; "
                           f"give the collator one processor output per sample")
    return value


def _token_aligned(samples: list[dict[str, Any]], layout: BatchLayout) -> list[str]:
    """The keys of these samples holding one value per token, each sample's ``(1, L)``: token
    types, and the keys ``layout`` says are (a sample without one gets zeros: the type of text,
    no media placed)."""
    # and the keys the model's layout says hold one value per token (Kosmos-2's image_embeds_position_mask)
    keys = [key for key in dict.fromkeys(key for sample in samples for key in sample)
            if key.endswith(_TOKEN_TYPES) or _per_token(layout.media.get(key))]
    for key in keys:
        for index, sample in enumerate(samples):
            value = sample.get(key)
            if value is None:
                sample[key] = torch.zeros_like(sample["input_ids"])
            elif not isinstance(value, torch.Tensor) or value.shape != sample["input_ids"].shape:
                raise CollateError(f"sample {index}: {key} holds one value per token and must be shaped like "
                                   f"input_ids {tuple(sample['input_ids'].shape)}, got "
                                   f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}")
    return keys


def _without_ids(index: int, sample: Mapping[str, Any]) -> str:
    """Why a sample without ``input_ids`` is refused: the collators place positions on token ids.
    A sample whose text is all the decoder's (Pix2Struct, vision-encoder-decoder models) needs no
    positions from mmrope."""
    held = ", ".join(sorted(sample)) or "nothing"
    if any(key.startswith("decoder_") or key == "labels" for key in sample):
        return (f"sample {index} has no input_ids (it holds {held}): its model takes no text beside its media but "
                f"the decoder's, whose positions it counts itself, so mmrope has none to place; batch it with "
                f"transformers' own data collator")
    return f"sample {index} has no input_ids (it holds {held}); pass the processor's outputs"
