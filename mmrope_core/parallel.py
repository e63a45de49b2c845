"""Sequence and context parallel: which tokens of a packed row each rank holds, and that rank's batch.

Trainers that spread one long row over ``size`` ranks cut it in one of three ways:

- ``"zigzag"``: every segment cut into ``2 * size`` equal chunks, rank ``r`` holding chunks ``r``
  and ``2 * size - 1 - r`` of each, segment after segment (Transformer Engine's
  ``thd_get_partitioned_indices``: Megatron-core's THD context parallel, ms-swift's Megatron and
  ring-attention paths). Every segment's length, in the padded layout, is a multiple of ``2 * size``.
- ``"zigzag-row"``: the whole row as one sequence, cut the same way (Megatron-core's
  ``get_batch_on_this_cp_rank``). The row's length is a multiple of ``2 * size``.
- ``"contiguous"``: the row cut into ``size`` equal parts in order (Ulysses sequence parallel, as
  verl and DeepSpeed slice it). The row's length is a multiple of ``size``.

M-RoPE positions are computed on the whole row, each segment as its sample alone, and then cut
exactly as the tokens are: :func:`split_index` gives the indices, :func:`split_batch` cuts a
:class:`~mmrope_core.collators.PackedCollator` batch with them, keeping the whole row's boundaries
so that attention never has to infer them from the positions. ``PackedCollator(engine,
split=(scheme, size, rank))`` pads the row so that it can be cut and returns the rank's batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

import torch

from ._names import checked_keywords
from .errors import SequenceSplitError

__all__ = ["split_batch", "split_index"]

SCHEMES = ("zigzag", "zigzag-row", "contiguous")
IGNORE_INDEX = -100  # what the losses skip
#: per-token keys by name, cut on their last dim (``inputs_embeds`` on its second to last)
TOKEN_KEYS = ("input_ids", "tokens", "labels", "shift_labels", "attention_mask", "loss_mask", "generated_mask",
              "seq_idx", "position_ids", "inputs_embeds")
TOKEN_TYPES = "token_type_ids"  # the suffix of the keys holding one type per token (mm_, moe_mm_ ...)
#: the whole row's boundaries, kept on every rank: the layout decides the cut, the first found
LAYOUT_KEYS = ("cu_seqlens_padded", "cu_seq_lens_q", "cu_seqlens")
ROW_KEYS = (*LAYOUT_KEYS, "cu_seq_lens_k", "max_length_q", "max_length_k", "max_seqlen", "max_seqlen_q",
            "max_seqlen_k")
_HOW_TO_PAD = "build the batch with PackedCollator(engine, split=(scheme, size, rank)), which pads each row to fit"


@checked_keywords
def split_index(cu_seqlens: torch.Tensor | Sequence[int], *, scheme: str, size: int, rank: int) -> torch.Tensor:
    """The indices into the packed row of the tokens rank ``rank`` of ``size`` holds, in its order.

    ``cu_seqlens`` holds the row's segment boundaries, ``[0, end of segment 0, ..., row length]``
    (for ``"zigzag"``, the padded layout: Megatron's ``cu_seqlens_padded``). Returns an int64
    1-D tensor on ``cu_seqlens``'s device, ``row length / size`` long.

    Raises :class:`~mmrope_core.SequenceSplitError` for an unknown scheme, a size below 1, a rank
    outside ``range(size)``, boundaries that are not a 1-D integer sequence rising from 0, and a
    segment (or row) whose length the scheme cannot cut in equal parts. At size 1 the row is
    not cut, whatever its lengths.

    >>> split_index(torch.tensor([0, 8, 12]), scheme="zigzag", size=2, rank=0).tolist()
    [0, 1, 6, 7, 8, 11]
    """
    _check_layout(scheme, size, rank)
    bounds = _boundaries(cu_seqlens)
    total = int(bounds[-1])
    if size == 1:  # the frameworks leave the row whole: any length will do
        return torch.arange(total, device=bounds.device)
    if scheme == "contiguous":
        _require_multiple("the row", total, size, scheme, size)
        part = total // size
        return torch.arange(rank * part, (rank + 1) * part, device=bounds.device)
    if scheme == "zigzag-row":
        _require_multiple("the row", total, 2 * size, scheme, size)
        bounds = bounds[[0, -1]]  # the row as one segment
    lengths = bounds[1:] - bounds[:-1]
    uneven = torch.nonzero(lengths % (2 * size)).flatten()
    if uneven.numel():
        segment = int(uneven[0])
        _require_multiple(f"segment {segment} (tokens {int(bounds[segment])} to {int(bounds[segment + 1])})",
                          int(lengths[segment]), 2 * size, scheme, size)
    chunk = lengths // (2 * size)
    starts = bounds[:-1]
    # per segment, two runs: chunk `rank`, then chunk `2 * size - 1 - rank`
    run_starts = torch.stack([starts + rank * chunk, starts + (2 * size - 1 - rank) * chunk], dim=1).flatten()
    return _runs(run_starts, chunk.repeat_interleave(2))


def _runs(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``cat([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a Python loop."""
    total = int(lengths.sum())
    offsets = torch.cumsum(lengths, 0) - lengths  # where each run begins in the output
    shift = (starts - offsets).repeat_interleave(lengths, output_size=total)
    return torch.arange(total, device=starts.device) + shift


def _check_layout(scheme: Any, size: Any, rank: Any) -> None:
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise SequenceSplitError(f"scheme {scheme!r} is unknown; the schemes are "
                                 f"{', '.join(repr(known) for known in SCHEMES)}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SequenceSplitError(f"size must be a positive int (the number of ranks sharing a row), got {size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise SequenceSplitError(f"rank must be an int in range({size}) for size={size}, got {rank!r}")


def _boundaries(cu_seqlens: Any) -> torch.Tensor:
    """``cu_seqlens`` checked, as an int64 tensor."""
    if not isinstance(cu_seqlens, torch.Tensor) and hasattr(cu_seqlens, "__array__"):  # numpy's cumsum
        cu_seqlens = torch.as_tensor(cu_seqlens)
    if not isinstance(cu_seqlens, torch.Tensor):
        if isinstance(cu_seqlens, (str, bytes)) or not isinstance(cu_seqlens, Sequence):
            raise SequenceSplitError(f"cu_seqlens must be a 1-D tensor (or list) of segment boundaries, got "
                                     f"{type(cu_seqlens).__name__}")
        if not all(isinstance(value, Integral) and not isinstance(value, bool) for value in cu_seqlens):
            raise SequenceSplitError(f"cu_seqlens must hold integer boundaries, got {list(cu_seqlens)!r}")
        cu_seqlens = torch.tensor([int(value) for value in cu_seqlens], dtype=torch.long)
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise SequenceSplitError(f"cu_seqlens must hold integer boundaries, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.device.type == "meta":
        raise SequenceSplitError("cu_seqlens is on the meta device, which holds no values")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() == 0:
        raise SequenceSplitError(f"cu_seqlens must be 1-D, [0, end of segment 0, ..., row length], got shape "
                                 f"{tuple(cu_seqlens.shape)}")
    bounds = cu_seqlens.long()
    if int(bounds[0]) != 0:
        raise SequenceSplitError(f"cu_seqlens must start at 0, got {int(bounds[0])}")
    falls = torch.nonzero(bounds[1:] < bounds[:-1]).flatten()
    if falls.numel():
        at = int(falls[0]) + 1
        raise SequenceSplitError(f"cu_seqlens must not decrease, but entry {at} is {int(bounds[at])} after "
                                 f"{int(bounds[at - 1])}")
    return bounds


def _require_multiple(what: str, length: int, multiple: int, scheme: str, size: int) -> None:
    if length % multiple:
        raise SequenceSplitError(f"{what} has {length} tokens, which scheme {scheme!r} with size {size} cannot cut: "
                                 f"it needs a multiple of {multiple}; {_HOW_TO_PAD}")


@checked_keywords
def split_batch(batch: Mapping[str, Any], *, scheme: str, size: int, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s part of a ``(B, T)`` batch: a new dict, ``batch`` left unchanged.

    ``batch`` is a :class:`~mmrope_core.collators.PackedCollator` batch (one packed row, ``B = 1``),
    or one in Megatron's naming (``tokens``, ``loss_mask``; ``cu_seqlens`` the real boundaries,
    ``cu_seqlens_padded`` the layout). Its layout decides the cut: ``cu_seqlens_padded``, else
    ``cu_seq_lens_q``, else ``cu_seqlens``; a batch without any is refused rather than guessed from
    its positions. Every row of a ``(B, T)`` batch shares that layout and is cut alike, as
    Megatron-core's ``get_batch_on_this_cp_rank`` cuts a micro-batch of ``B`` rows of one length
    (``cu_seqlens=[0, T]`` with ``"zigzag-row"``); ``(3, B, T)`` positions keep their ``B`` rows.

    - Per-token tensors, known by name (``input_ids``, ``tokens``, ``labels``, ``shift_labels``, ``attention_mask``,
      ``loss_mask``, ``generated_mask``, ``seq_idx``, every ``*token_type_ids``), are cut on their
      last dim, ``position_ids`` too (``(4, 1, T)`` M-RoPE or ``(1, T)``), ``inputs_embeds`` on its
      sequence dim: each holds ``T / size`` tokens, in :func:`split_index`'s order.
    - The whole row's boundaries are kept, and added where missing so that attention never infers
      them from the positions: ``cu_seqlens_padded`` (the layout), and for one packed row
      ``cu_seq_lens_q/k`` (each real segment and each padding run, as offsets into the row) and
      ``max_length_q/k`` (which varlen attention would read as the whole batch's, so not for ``B > 1``).
    - Every other value (media: pixels, grids, audio features; flags) is kept whole: the vision and
      audio towers run on every rank. A tensor of another name shaped ``(B, T)``, like the rows, is
      refused as ambiguous (a per-token value of your own, or media that happens to be ``T`` long),
      except media masks named ``*_attention_mask``: cut your own per-token values with
      :func:`split_index` (``value[..., index]``) and leave them out of ``batch``.
    """
    if not isinstance(batch, Mapping):
        raise SequenceSplitError(f"split_batch takes a packed batch (a dict), got {type(batch).__name__}")
    _check_layout(scheme, size, rank)
    layout_key = next((key for key in LAYOUT_KEYS if isinstance(batch.get(key), torch.Tensor)), None)
    if layout_key is None:
        raise SequenceSplitError("the batch holds no segment boundaries (cu_seqlens_padded, cu_seq_lens_q or "
                                 "cu_seqlens), and split_batch does not guess them from the positions; build it with "
                                 "PackedCollator(engine, split=(scheme, size, rank)) or flash_attn_kwargs=True")
    layout = _boundaries(batch[layout_key])
    total = int(layout[-1])
    token_keys = [key for key, value in batch.items() if isinstance(value, torch.Tensor) and _is_token_key(key)]
    ids = next((batch[key] for key in ("input_ids", "tokens") if isinstance(batch.get(key), torch.Tensor)), None)
    rows = ids.shape[0] if ids is not None and ids.dim() == 2 else 1
    for key, value in batch.items():
        if key not in token_keys and key not in ROW_KEYS and isinstance(value, torch.Tensor) and value.dim() == 2 \
                and value.shape == (rows, total) and not key.endswith("_attention_mask"):
            raise SequenceSplitError(
                f"{key} has shape {tuple(value.shape)}, the row's, but is not a per-token key split_batch knows "
                f"({', '.join(TOKEN_KEYS)}, *{TOKEN_TYPES}) nor media it can tell apart; cut it yourself with "
                f"split_index(cu_seqlens, ...) as {key}[..., index] and pass the batch without it")
    index = split_index(layout, scheme=scheme, size=size, rank=rank)
    part = cut_tokens(batch, index, token_keys, total)
    if rows == 1:
        part.update(_row_boundaries(batch, layout))
    elif not isinstance(batch.get("cu_seqlens_padded"), torch.Tensor):
        part["cu_seqlens_padded"] = layout.to(torch.int32)
    return part


def cut_tokens(batch: Mapping[str, Any], index: torch.Tensor, token_keys: Sequence[str], total: int) -> dict[str, Any]:
    """``batch`` with each of ``token_keys`` cut by ``index`` on its sequence dim; the rest as it is."""
    part = dict(batch)
    for key in token_keys:
        value = batch[key]
        dim = -2 if key == "inputs_embeds" else -1
        if value.dim() < -dim or value.shape[dim] != total:
            raise SequenceSplitError(f"{key} has shape {tuple(value.shape)}, but the row's boundaries end at {total}: "
                                     f"a per-token value needs {total} entries on its "
                                     f"{'second to last' if dim == -2 else 'last'} dim")
        if key == "attention_mask" and value.dim() > 2:  # its query dim would stay whole
            raise SequenceSplitError(f"attention_mask has shape {tuple(value.shape)}, a mask of token pairs, which "
                                     f"split_batch cannot cut per token; leave it out: the row's boundaries "
                                     f"(cu_seq_lens_q/k) say which tokens attend to which")
        at = index.to(value.device)
        part[key] = value[..., at, :] if dim == -2 else value[..., at]  # faster than index_select on views
    return part


def _is_token_key(key: str) -> bool:
    return key in TOKEN_KEYS or key.endswith(TOKEN_TYPES)


def _row_boundaries(batch: Mapping[str, Any], layout: torch.Tensor) -> dict[str, Any]:
    """The whole row's boundaries that ``batch`` lacks: the layout, and attention's segments."""
    added: dict[str, Any] = {}
    if not isinstance(batch.get("cu_seqlens_padded"), torch.Tensor):
        added["cu_seqlens_padded"] = layout.to(torch.int32)
    attention = batch.get("cu_seq_lens_q")
    if not isinstance(attention, torch.Tensor):
        real = batch.get("cu_seqlens")
        attention = (attention_segments(_boundaries(real), layout) if isinstance(real, torch.Tensor)
                     and isinstance(batch.get("cu_seqlens_padded"), torch.Tensor) else layout).to(torch.int32)
        added["cu_seq_lens_q"] = attention
    if not isinstance(batch.get("cu_seq_lens_k"), torch.Tensor):
        added["cu_seq_lens_k"] = attention.clone()
    longest = int((attention[1:] - attention[:-1]).max()) if attention.numel() > 1 else 0
    for key in ("max_length_q", "max_length_k"):
        if key not in batch:
            added[key] = longest
    return added


def attention_segments(real: torch.Tensor, layout: torch.Tensor) -> torch.Tensor:
    """Offsets into the padded row of every real segment and every padding run after one.

    ``real`` holds the segments' real boundaries (``[0, 5, 12]``: lengths 5 and 7), ``layout`` the
    padded ones (``[0, 8, 16]``); the answer, ``[0, 5, 8, 15, 16]``, keeps each sample's attention
    to its own tokens and each padding run to itself.
    """
    lengths = real[1:] - real[:-1]
    if lengths.shape != layout[1:].shape or bool((lengths > layout[1:] - layout[:-1]).any()):
        raise SequenceSplitError(f"the real boundaries {real.tolist()} do not fit the padded layout {layout.tolist()}: "
                                 f"every segment's real length must be at most its padded one")
    ends = torch.stack([layout[:-1] + lengths, layout[1:]], dim=1).flatten()
    return torch.cat([layout[:1], ends]).unique_consecutive()


def check_split(split: Any) -> tuple[str, int, int | None]:
    """A collator's ``split=(scheme, size, rank)``, checked; rank None asks for the padded row uncut."""
    if not isinstance(split, (tuple, list)) or len(split) != 3:
        raise SequenceSplitError(f"split must be (scheme, size, rank), like ('zigzag', 2, rank), got {split!r}")
    scheme, size, rank = split
    _check_layout(scheme, size, 0 if rank is None else rank)
    return scheme, size, rank


def padded_lengths(lengths: Sequence[int], split: tuple[str, int, int | None]) -> torch.Tensor:
    """Each segment's length once the row is padded so that ``split``'s scheme can cut it."""
    scheme, size, _ = split
    padded = torch.tensor(lengths)
    if size > 1 and scheme == "zigzag":
        padded = -(-padded // (2 * size)) * (2 * size)
    elif size > 1:
        padded[-1] += -int(padded.sum()) % (2 * size if scheme == "zigzag-row" else size)
    return padded


def split_packed_row(batch: dict[str, Any], lengths: Sequence[int], split: tuple[str, int, int | None], *,
                     pad_token_id: int, token_keys: Sequence[str], shift_labels: bool = False) -> dict[str, Any]:
    """Rank ``split[2]``'s part of a collator's whole packed row (its segments of ``lengths``),
    as if the row were first padded so that the scheme can cut it; rank None: that padded row.

    Padding goes at the end of each segment (``"zigzag"``) or of the last one (the other schemes):
    ids ``pad_token_id``, labels -100, token types 0, and positions those of text continuing the
    segment (its last real token's plus 1, 2, ... on every row), which no real token attends to.
    Only the rank's tokens are gathered: the padded row is never built. ``shift_labels`` adds each
    token's target on the padded row (the next token's label; -100 at each segment's last real
    token and on padding), gathered like the tokens.
    """
    scheme, size, rank = split
    sizes = torch.tensor(lengths)
    real = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    layout = torch.cat([real[:1], padded_lengths(lengths, split).cumsum(0)])
    index = torch.arange(int(layout[-1])) if rank is None else split_index(layout, scheme=scheme, size=size, rank=rank)
    if scheme == "zigzag":  # each slot's place in the unpadded row, past its segment's end where it pads
        segment = torch.searchsorted(layout, index, right=True) - 1
        place, end = index - (layout - real)[segment], real[1:][segment]
    else:  # the padding follows the last token
        place, end = index, real[-1]
    is_pad = place >= end
    # a padding slot reads its segment's last real token, then steps on from it
    source = torch.minimum(place, end - 1)
    steps = (place - end + 1)[is_pad]
    part = dict(batch)
    for key in token_keys:
        value = batch[key][..., source]
        if key == "position_ids":
            value[..., is_pad] += steps.to(value.dtype)
        else:
            value[..., is_pad] = IGNORE_INDEX if key == "labels" else pad_token_id if key == "input_ids" else 0
        part[key] = value
    if shift_labels:  # the next token's label, read from the unpadded row: no shifted copy of it
        labels = batch["labels"]
        after = labels[..., torch.clamp(source + 1, max=labels.shape[-1] - 1)]
        after[..., place + 1 >= end] = IGNORE_INDEX
        part["shift_labels"] = after
    attention = attention_segments(real, layout).to(torch.int32)
    longest = int((attention[1:] - attention[:-1]).max())
    part.update(cu_seqlens_padded=layout.to(torch.int32), cu_seq_lens_q=attention, cu_seq_lens_k=attention.clone(),
                max_length_q=longest, max_length_k=longest)
    if "seq_idx" in batch:  # causal-conv1d's segments: those of attention, padding runs apart
        part["seq_idx"] = (torch.searchsorted(attention, index.to(torch.int32), right=True) - 1).to(torch.int32)[None]
    return part
