"""Real packed rows (Qwen2.5-VL and Qwen3-VL with videos, Qwen2.5-Omni with audio in video) cut
for sequence and context parallel: ``PackedCollator(engine, split=...)``'s batch on every rank is
the framework's own cut of the padded row (mcore-bridge's ``split_cp_inputs``, Megatron-core's
``get_batch_on_this_cp_rank``, verl's ``slice_input_tensor``), the shards put back in the
framework's order are the unsplit batch, and every segment's positions are its sample's alone.
verl's Ulysses attention, which infers the boundaries from the gathered positions, finds every
segment in mmrope's."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
from cases import loading_without_torchvision, trajectories
from parallel_cases import FAMILIES, SIZES, alone, engine_and_rows, split_cp_inputs, world

from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import split_batch, split_index

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron-core warns that neither Transformer Engine nor Apex is installed
    from megatron.core import utils as megatron_utils
    from megatron.core.ssm.mamba_context_parallel import _undo_attention_load_balancing
from swift.utils import get_cu_seqlens_from_position_ids
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids
from verl.models.transformers.qwen2_vl import prepare_fa2_from_position_ids
from verl.utils.ulysses import slice_input_tensor, ulysses_pad


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


def test_a_micro_batch_of_rows_is_cut_as_megatron_core_cuts_it():
    """``split_batch`` on Megatron's ``(B, S)`` micro-batch (``cu_seqlens=[0, S]``) keeps what
    ``get_batch_on_this_cp_rank`` gives each rank, for every per-token tensor."""
    tokens = torch.randint(0, 1000, (3, 32), generator=torch.Generator().manual_seed(0))
    batch = {"tokens": tokens, "labels": tokens.roll(-1, 1), "loss_mask": torch.rand(3, 32),
             "position_ids": torch.arange(32).expand(3, 32).clone()}
    for size in (2, 4, 8):
        for rank in range(size):
            with world(size, rank) as group:
                theirs = megatron_utils.get_batch_on_this_cp_rank(dict(batch), cp_group=group)
            mine = split_batch({**batch, "cu_seqlens": torch.tensor([0, 32])}, scheme="zigzag-row", size=size,
                               rank=rank)
            for key, value in theirs.items():
                assert torch.equal(mine[key], value), (key, size, rank)


# -- verl's Ulysses attention: the boundaries it infers from the gathered positions ---------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("size", SIZES)
def test_verls_ulysses_attention_finds_every_segment_in_mmropes_positions(family, size):
    """verl's Ulysses flash-attention all-gathers each rank's positions (concatenated in rank
    order), takes row 0 of ``(4, 1, T)`` positions, and cuts the row where it is 0
    (``prepare_fa2_from_position_ids``; transformers' ``prepare_fa_kwargs_from_position_ids``
    alike): mmrope's text row restarts at 0 exactly at each segment's start, and the collator's
    padding continues the last segment, so the inferred boundaries are the padded layout's."""
    engine, rows, kwargs = engine_and_rows(family)
    batches = [PackedCollator(engine, mm_processor_kwargs=kwargs, split=("contiguous", size, rank))(rows)
               for rank in range(size)]
    gathered = torch.cat([batch["position_ids"] for batch in batches], dim=-1)[0]  # (1, T): row 0
    states = torch.zeros(1, gathered.shape[1], 2, 4)
    _, _, _, (cu_seqlens, _), (max_length, _) = prepare_fa2_from_position_ids(states, states, states, gathered)
    assert torch.equal(cu_seqlens, batches[0]["cu_seqlens_padded"])
    assert max_length == int(batches[0]["cu_seqlens_padded"].diff().max())
    (transformers_cu_seqlens, _), _ = prepare_fa_kwargs_from_position_ids(gathered)
    assert torch.equal(transformers_cu_seqlens, cu_seqlens)
    real = batches[0]["cu_seq_lens_q"]  # the real segments start where the inferred ones do
    assert set(real[:-1].tolist()) >= set(cu_seqlens[:-1].tolist())


@pytest.mark.parametrize("size", SIZES)
def test_verls_own_padding_becomes_a_segment_of_its_own(size):
    """verl's own path pads the unsplit row (``ulysses_pad``: positions counting from 0, so the
    padding is one more segment) and each rank slices the positions on their last dim; the
    gathered text row gives the samples' boundaries and the padding's."""
    engine, rows, kwargs = engine_and_rows("Qwen2.5-VL")
    batch = PackedCollator(engine, mm_processor_kwargs=kwargs)(rows)
    _, positions, pad = ulysses_pad(batch["input_ids"], batch["position_ids"], sp_size=size)
    shards = []
    for rank in range(size):
        with world(size, rank):
            shards.append(slice_input_tensor(positions, dim=-1, padding=False))
    gathered = torch.cat(shards, dim=-1)[0]
    states = torch.zeros(1, gathered.shape[1], 2, 4)
    _, _, _, (cu_seqlens, _), _ = prepare_fa2_from_position_ids(states, states, states, gathered)
    lengths = [row["input_ids"].shape[1] for row in rows]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    expected = torch.cat([bounds, bounds[-1:] + pad]) if pad else bounds
    assert torch.equal(cu_seqlens, expected)


# -- ms-swift's Ulysses and ring paths: the boundaries it reads from its text row -----------------


def test_swift_reads_the_boundaries_from_a_text_row_of_its_own():
    """ms-swift's sequence parallel (Ulysses and ring attention) takes each row's boundaries from
    ``text_position_ids`` with ``get_cu_seqlens_from_position_ids``, which reads a ``(1, T)`` row
    (where it is 0). mmrope's text row gives the segments; the ``(4, 1, T)`` positions themselves,
    which ms-swift falls back to without ``text_position_ids``, are read as if 2-D: their first
    row, ``(1, T)``, taken for the sequence."""
    engine, rows, kwargs = engine_and_rows("Qwen2.5-VL")
    batch = PackedCollator(engine, mm_processor_kwargs=kwargs, flash_attn_kwargs=True)(rows)
    text_row = batch["position_ids"][0]  # (1, T), what a batch hands ms-swift as text_position_ids
    assert torch.equal(get_cu_seqlens_from_position_ids(text_row), batch["cu_seq_lens_q"])
    assert get_cu_seqlens_from_position_ids(batch["position_ids"])[-1] == 1  # a "sequence" of one token


@pytest.mark.parametrize("family", ["Qwen2.5-VL", "Qwen3-VL", "Qwen3-Omni"])
def test_verls_own_pipeline_hands_its_ulysses_attention_the_samples_boundaries(checkpoint, family):
    """From the drop-in processor to the attention's boundaries, on verl's own code: its agent
    loop's ``_compute_position_ids`` per trajectory (prompt left-padded, response right-padded),
    its padding removal (``unpad_input``, ``index_first_axis``: the samples in one row), its
    Ulysses padding and slicing on 4 ranks, and its flash-attention's boundaries from the gathered
    row 0: each sample's, then the padding's."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.attention_utils import index_first_axis, unpad_input

    from mmrope_core.integrations.verl import hf_processor

    with loading_without_torchvision():
        processor = hf_processor(checkpoint(family))
    worker = type("Worker", (), {"processor": processor})()  # _compute_position_ids reads only .processor
    rng = random.Random(f"ulysses {family}")
    samples = []
    for trajectory in trajectories(family, rng, 4):
        ids, mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        position_ids = AgentLoopWorker._compute_position_ids(worker, ids, mask, trajectory.inputs())  # (1, 4, L)
        samples.append((ids, mask, position_ids))
    width = max(ids.shape[1] for ids, _, _ in samples)  # verl's batch: every row as long

    def batched(index):
        return torch.cat([torch.nn.functional.pad(sample[index], (0, width - sample[0].shape[1])) for sample in samples])

    input_ids, attention_mask, position_ids = batched(0), batched(1), batched(2).transpose(0, 1)  # (4, B, L)
    ids_rmpad, indices, cu_seqlens, *_ = unpad_input(input_ids.unsqueeze(-1), attention_mask)
    flat = position_ids.permute(1, 2, 0).reshape(-1, position_ids.shape[0])  # (B * L, 4)
    positions_rmpad = index_first_axis(flat, indices).transpose(0, 1).unsqueeze(1)  # (4, 1, total)
    _, padded, pad = ulysses_pad(ids_rmpad.transpose(0, 1), positions_rmpad, sp_size=4)
    shards = []
    for rank in range(4):
        with world(4, rank):
            shards.append(slice_input_tensor(padded, dim=-1, padding=False))
    gathered = torch.cat(shards, dim=-1)[0]
    states = torch.zeros(1, gathered.shape[1], 2, 4)
    _, _, _, (inferred, _), _ = prepare_fa2_from_position_ids(states, states, states, gathered)
    expected = torch.cat([cu_seqlens, cu_seqlens[-1:] + pad]) if pad else cu_seqlens
    assert torch.equal(inferred, expected)
