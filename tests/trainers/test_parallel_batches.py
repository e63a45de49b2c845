"""Real packed rows (Qwen2.5-VL and Qwen3-VL with videos, Qwen2.5-Omni with audio in video) cut
for sequence and context parallel: ``PackedCollator(engine, split=...)``'s batch on every rank is
the framework's own cut of the padded row (mcore-bridge's ``split_cp_inputs``, Megatron-core's
``get_batch_on_this_cp_rank``, verl's ``slice_input_tensor``), the shards put back in the
framework's order are the unsplit batch, and every segment's positions are its sample's alone."""

from __future__ import annotations

import warnings

import pytest
import torch
from parallel_cases import FAMILIES, SIZES, alone, engine_and_rows, split_cp_inputs, world

from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import split_index

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron-core warns that neither Transformer Engine nor Apex is installed
    from megatron.core import utils as megatron_utils
    from megatron.core.ssm.mamba_context_parallel import _undo_attention_load_balancing
from verl.utils.ulysses import slice_input_tensor


def framework_cut(scheme, tensor, bounds, size, rank):
    """The framework's own cut of one per-token tensor (sequence on its last dim) of the padded
    row, on rank ``rank`` of ``size``."""
    if scheme == "zigzag-row" and tensor.dim() == 3:  # Megatron-core cuts (B, S): each positions row alone
        return torch.stack([framework_cut(scheme, row, bounds, size, rank) for row in tensor])
    with world(size, rank) as group:
        if scheme == "zigzag":  # ms-swift's Megatron path: split_cp_inputs on the last dim
            return split_cp_inputs()(tensor, bounds, -1)
        if scheme == "contiguous":  # verl's vision path: slice_input_tensor on the last dim
            return slice_input_tensor(tensor, dim=-1, padding=False)
        return megatron_utils.get_batch_on_this_cp_rank({"tokens": tensor}, cp_group=group)["tokens"]


def put_back(scheme, shards, bounds, size):
    """The ranks' shards, in rank order, back in row order as the framework puts them back:
    verl's all-gather concatenates; Megatron-core undoes its row cut with
    ``_undo_attention_load_balancing``; Transformer Engine's THD partition is undone by its
    documented layout (chunks ``r`` and ``2 * size - 1 - r`` of every segment on rank ``r``)."""
    gathered = torch.cat(shards, dim=-1)
    if scheme == "contiguous":
        return gathered
    if scheme == "zigzag-row":
        return _undo_attention_load_balancing(gathered.movedim(-1, 0), size).movedim(0, -1)
    row = torch.empty_like(gathered)
    for rank, shard in enumerate(shards):
        row[..., split_index(bounds, scheme="zigzag", size=size, rank=rank)] = shard
    return row


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("scheme", ["zigzag", "zigzag-row", "contiguous"])
@pytest.mark.parametrize("size", SIZES)
def test_each_ranks_batch_is_the_frameworks_cut_of_the_row(family, scheme, size):
    engine, rows, kwargs = engine_and_rows(family)
    unsplit = PackedCollator(engine, mm_processor_kwargs=kwargs)(rows)
    batches = [PackedCollator(engine, mm_processor_kwargs=kwargs, split=(scheme, size, rank))(rows)
               for rank in range(size)]
    bounds = batches[0]["cu_seqlens_padded"]
    keys = ("input_ids", "labels", "position_ids")
    whole = {key: put_back(scheme, [batch[key] for batch in batches], bounds, size) for key in keys}
    for rank, batch in enumerate(batches):
        assert torch.equal(batch["cu_seqlens_padded"], bounds)
        for key in keys:
            theirs = framework_cut(scheme, whole[key], bounds, size, rank)
            assert torch.equal(batch[key], theirs), (key, rank)
    # the real tokens of the row put back are the unsplit batch's; every segment is its sample alone
    real = torch.cat([torch.arange(int(start), int(start) + row["input_ids"].shape[1])
                      for start, row in zip(bounds[:-1], rows)])
    for key in keys:
        assert torch.equal(whole[key][..., real], unsplit[key]), key
    for start, row in zip(bounds[:-1], rows):
        segment = slice(int(start), int(start) + row["input_ids"].shape[1])
        assert torch.equal(whole["position_ids"][:, 0, segment], alone(engine, row, kwargs))
