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

from collections.abc import Sequence
from typing import Any

import torch

from .errors import SequenceSplitError

SCHEMES = ("zigzag", "zigzag-row", "contiguous")
_HOW_TO_PAD = "build the batch with PackedCollator(engine, split=(scheme, size, rank)), which pads each row to fit"


def split_index(cu_seqlens: torch.Tensor | Sequence[int], *, scheme: str, size: int, rank: int) -> torch.Tensor:
    """The indices into the packed row of the tokens rank ``rank`` of ``size`` holds, in its order.

    ``cu_seqlens`` holds the row's segment boundaries, ``[0, end of segment 0, ..., row length]``
    (for ``"zigzag"``, the padded layout: Megatron's ``cu_seqlens_padded``). Returns an int64
    1-D tensor on ``cu_seqlens``'s device, ``row length / size`` long.

    Raises :class:`~mmrope_core.SequenceSplitError` for an unknown scheme, a size below 1, a rank
    outside ``range(size)``, boundaries that are not a 1-D integer sequence rising from 0, and a
    segment (or row) whose length the scheme cannot cut in equal parts.

    >>> split_index(torch.tensor([0, 8, 12]), scheme="zigzag", size=2, rank=0).tolist()
    [0, 1, 6, 7, 8, 11]
    """
    _check_layout(scheme, size, rank)
    bounds = _boundaries(cu_seqlens)
    total = int(bounds[-1])
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
    if not isinstance(cu_seqlens, torch.Tensor):
        if isinstance(cu_seqlens, (str, bytes)) or not isinstance(cu_seqlens, Sequence):
            raise SequenceSplitError(f"cu_seqlens must be a 1-D tensor (or list) of segment boundaries, got "
                                     f"{type(cu_seqlens).__name__}")
        if not all(isinstance(value, int) and not isinstance(value, bool) for value in cu_seqlens):
            raise SequenceSplitError(f"cu_seqlens must hold integer boundaries, got {list(cu_seqlens)!r}")
        cu_seqlens = torch.tensor(list(cu_seqlens), dtype=torch.long)
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
