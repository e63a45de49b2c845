"""Megatron-core's two context-parallel batch cutters, cutting M-RoPE positions on their last dim.

Megatron-core 0.16's ``get_batch_on_this_cp_rank`` and ``get_thd_batch_on_this_cp_rank`` cut every
tensor of a batch on dim 1, the sequence dim of ``(B, S)`` tokens; M-RoPE positions are
``(3, B, S)`` (or mmrope's ``(4, B, S)``), whose dim 1 is the batch. The functions here take the
same arguments and cut everything as Megatron-core does, but ``position_ids`` on their last dim,
with the indices of :func:`mmrope_core.parallel.split_index`; the THD one needs no Transformer
Engine (its ``thd_get_partitioned_indices`` is a CUDA op; :func:`thd_partitioned_indices` gives the
same indices in torch). Like Megatron-core's, they cut every tensor they are given (keep media out
of the batch, or use :func:`mmrope_core.parallel.split_batch`). The caller's batch is not changed::

    from mmrope_core.integrations.megatron import get_thd_batch_on_this_cp_rank

    batch, packed_seq_params = get_thd_batch_on_this_cp_rank(batch, cu_seqlens, cu_seqlens_padded, max_seqlen)

Importing this module imports no Megatron package: the CP size and rank default to Megatron-core's
``parallel_state``, read when a function is called without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from ..parallel import split_index

__all__ = ["get_batch_on_this_cp_rank", "get_thd_batch_on_this_cp_rank", "thd_partitioned_indices"]

#: What Megatron-core's THD helper leaves whole: the mask and the boundaries.
THD_WHOLE = frozenset({"attention_mask", "cu_seqlens", "cu_seqlens_padded", "max_seqlen"})
POSITIONS = "position_ids"


def thd_partitioned_indices(cu_seqlens_padded: torch.Tensor, total_tokens: int, cp_size: int,
                            cp_rank: int) -> torch.Tensor:
    """Transformer Engine's ``tex.thd_get_partitioned_indices`` without CUDA: the indices of the
    tokens rank ``cp_rank`` of ``cp_size`` holds, every segment of the padded layout cut into
    ``2 * cp_size`` chunks, chunks ``cp_rank`` and ``2 * cp_size - 1 - cp_rank`` of each in order.

    ``total_tokens`` is the row's length (``batch["tokens"].size(1)``); it must equal
    ``cu_seqlens_padded[-1]`` (a typed error otherwise, as for lengths the cut cannot split).
    """
    bounds = torch.as_tensor(cu_seqlens_padded)
    if bounds.dim() == 1 and bounds.numel() and int(bounds[-1]) != int(total_tokens):
        from ..errors import SequenceSplitError

        raise SequenceSplitError(f"cu_seqlens_padded ends at {int(bounds[-1])} but the row holds {int(total_tokens)} "
                                 f"tokens: pass the padded layout of this row")
    return split_index(bounds, scheme="zigzag", size=cp_size, rank=cp_rank)


def get_batch_on_this_cp_rank(batch: Mapping[str, Any], cp_group: Any = None, *, cp_size: int | None = None,
                              cp_rank: int | None = None) -> dict[str, Any]:
    """Megatron-core's ``get_batch_on_this_cp_rank`` (the whole ``(B, S)`` row as one sequence,
    ``2 * cp_size`` chunks, rank ``r`` holding chunks ``r`` and ``2 * cp_size - 1 - r``), with
    ``position_ids`` cut on their last dim: ``(B, S)``, ``(3, B, S)`` and ``(4, B, S)`` alike.

    ``attention_mask`` is cut on dim 2 and every other tensor on dim 1, as Megatron-core cuts them;
    None values stay None. The size and rank come from ``cp_size``/``cp_rank``, else from
    ``cp_group`` (a process group), else from Megatron-core's ``parallel_state``.
    Returns a new dict.
    """
    size, rank = _size_and_rank(cp_group, cp_size, cp_rank)
    if size == 1:
        return dict(batch)
    cut: dict[str, Any] = {}
    indices: dict[int, torch.Tensor] = {}  # Megatron-core cuts each tensor by its own length
    for key, value in batch.items():
        if value is None:
            cut[key] = value
            continue
        dim = _sequence_dim(key, value, 2 if key == "attention_mask" else 1)
        length = value.shape[dim]
        if length not in indices:
            indices[length] = split_index([0, length], scheme="zigzag-row", size=size, rank=rank)
        cut[key] = value.index_select(dim, indices[length].to(value.device))
    return cut


def get_thd_batch_on_this_cp_rank(batch: Mapping[str, Any], cu_seqlens: torch.Tensor, cu_seqlens_padded: torch.Tensor,
                                  max_seqlen: torch.Tensor, cp_size: int | None = None,
                                  cp_rank: int | None = None) -> tuple[dict[str, Any], Any]:
    """Megatron-core's ``get_thd_batch_on_this_cp_rank`` for a packed ``(1, T)`` THD row: every
    segment of ``cu_seqlens_padded`` cut as Transformer Engine cuts it, without Transformer
    Engine, and ``position_ids`` cut on their last dim.

    Returns the rank's batch (a new dict: ``attention_mask``, ``cu_seqlens``,
    ``cu_seqlens_padded`` and ``max_seqlen`` whole, every other tensor cut on dim 1) and
    Megatron-core's ``PackedSeqParams`` for it, as Megatron-core builds them.
    """
    PackedSeqParams = importlib.import_module("megatron.core.packed_seq_params").PackedSeqParams

    max_length = int(max_seqlen[0].item())
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                             cu_seqlens_q_padded=cu_seqlens_padded, cu_seqlens_kv_padded=cu_seqlens_padded,
                             max_seqlen_q=max_length, max_seqlen_kv=max_length)
    size, rank = _size_and_rank(None, cp_size, cp_rank)
    if size == 1:
        return dict(batch), params
    index = thd_partitioned_indices(cu_seqlens_padded, batch["tokens"].size(1), size, rank)
    cut = {}
    for key, value in batch.items():
        if key in THD_WHOLE:
            cut[key] = value
        else:
            cut[key] = value.index_select(_sequence_dim(key, value, 1), index.to(value.device))
    return cut, params


def _sequence_dim(key: str, value: torch.Tensor, megatron_dim: int) -> int:
    """Megatron-core's dim, but the last one for positions."""
    return value.dim() - 1 if key == POSITIONS else megatron_dim


def _size_and_rank(cp_group: Any, cp_size: int | None, cp_rank: int | None) -> tuple[int, int]:
    """Each of size and rank as given, else from ``cp_group``, else from Megatron-core's ``parallel_state``."""
    if cp_size is None or cp_rank is None:
        if cp_group is not None:
            initialized = torch.distributed.is_initialized()  # as Megatron-core reads a group before init
            size, rank = ((torch.distributed.get_world_size(cp_group), torch.distributed.get_rank(cp_group))
                          if initialized else (1, 0))
        else:
            parallel_state = importlib.import_module("megatron.core.parallel_state")
            size = max(parallel_state.get_context_parallel_world_size(), 1)
            rank = parallel_state.get_context_parallel_rank()
        cp_size = size if cp_size is None else cp_size
        cp_rank = rank if cp_rank is None else cp_rank
    return cp_size, cp_rank
