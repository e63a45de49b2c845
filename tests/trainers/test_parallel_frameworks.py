"""The frameworks' own sequence- and context-parallel cuts, run on CPU against
``mmrope_core.parallel``: Megatron-core 0.16.1's ``get_batch_on_this_cp_rank`` ("zigzag-row") and
``get_thd_batch_on_this_cp_rank`` (Transformer Engine's partition), mcore-bridge 1.6.5's
``split_cp_inputs`` (ms-swift's Megatron and ring-attention paths: "zigzag", "contiguous") and
verl 0.9.1's Ulysses slicing ("contiguous"): for every size and rank the framework's index, read
off a row of ``arange``, is ``split_index``'s. Where a framework cuts M-RoPE positions wrong, the
test shows it beside mmrope's cut (``mmrope_core.integrations.megatron``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from parallel_cases import RANKS, arange_row, split_cp_inputs, world

from mmrope_core import SequenceSplitError
from mmrope_core.integrations import megatron as mmrope_megatron
from mmrope_core.parallel import split_index

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron-core warns that neither Transformer Engine nor Apex is installed
    from megatron.core import utils as megatron_utils
from verl.utils.ulysses import slice_input_tensor, ulysses_pad_and_slice_inputs

# segment lengths of a padded THD layout: every one a multiple of 2 * 8
PADDED_LENGTHS = (16, 48, 32, 160)


def padded_bounds(lengths=PADDED_LENGTHS) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


# -- each framework's index is split_index's ---------------------------------------------------


@pytest.mark.parametrize(("size", "rank"), RANKS)
def test_megatron_cores_row_cut_is_zigzag_row(size, rank):
    length = 16 * 12
    with world(size, rank) as group:
        by_group = megatron_utils.get_batch_on_this_cp_rank({"tokens": arange_row(length)}, cp_group=group)
        by_state = megatron_utils.get_batch_on_this_cp_rank({"tokens": arange_row(length)})  # parallel_state's group
    expected = split_index([0, length], scheme="zigzag-row", size=size, rank=rank)
    assert torch.equal(by_group["tokens"][0], expected)
    assert torch.equal(by_state["tokens"][0], expected)


@pytest.mark.parametrize(("size", "rank"), RANKS)
def test_mcore_bridges_split_cp_inputs_is_zigzag_and_contiguous(size, rank):
    bounds = padded_bounds()
    length = int(bounds[-1])
    with world(size, rank):
        zigzag = split_cp_inputs()(arange_row(length), bounds, 1)
        whole_row = split_cp_inputs()(arange_row(length), None, 1)
        contiguous = split_cp_inputs()(arange_row(length), bounds, 1, cp_partition_mode="contiguous")
    assert torch.equal(zigzag[0], split_index(bounds, scheme="zigzag", size=size, rank=rank))
    assert torch.equal(whole_row[0], split_index([0, length], scheme="zigzag-row", size=size, rank=rank))
    assert torch.equal(contiguous[0], split_index(bounds, scheme="contiguous", size=size, rank=rank))
    # Transformer Engine's partition (a CUDA op), as mmrope computes it without CUDA
    assert torch.equal(mmrope_megatron.thd_partitioned_indices(bounds, length, size, rank), zigzag[0])


@pytest.mark.parametrize(("size", "rank"), RANKS)
def test_verls_ulysses_slicing_is_contiguous(size, rank):
    length = 8 * 25
    with world(size, rank):
        sliced = slice_input_tensor(arange_row(length), dim=1, padding=False)
        ids, positions, pad = ulysses_pad_and_slice_inputs(arange_row(length - 3), arange_row(length - 3), sp_size=size)
    expected = split_index([0, length], scheme="contiguous", size=size, rank=rank)
    assert torch.equal(sliced[0], expected)
    # verl pads the row to a multiple of size itself: ids with 0, positions counting on from 0
    padded = split_index([0, length - 3 + pad], scheme="contiguous", size=size, rank=rank)
    real = padded < length - 3
    assert torch.equal(ids[0][real], padded[real]) and (ids[0][~real] == 0).all()
    assert torch.equal(positions[0][real], padded[real])


def test_megatron_cores_thd_cut_needs_transformer_engine():
    """``get_thd_batch_on_this_cp_rank`` calls ``tex.thd_get_partitioned_indices``, a CUDA op of
    Transformer Engine: without it Megatron-core refuses any CP size above 1 (and builds the
    ``PackedSeqParams`` alone at size 1); mmrope's replacement cuts it in torch."""
    assert megatron_utils.tex is None
    bounds = padded_bounds()
    batch = {"tokens": arange_row(int(bounds[-1]))}
    max_seqlen = torch.tensor([160])
    with pytest.raises(AssertionError, match="Transformer Engine"):
        megatron_utils.get_thd_batch_on_this_cp_rank(dict(batch), bounds, bounds, max_seqlen, cp_size=2, cp_rank=0)
    alone_batch, params = megatron_utils.get_thd_batch_on_this_cp_rank(dict(batch), bounds, bounds, max_seqlen,
                                                                        cp_size=1, cp_rank=0)
    mine, my_params = mmrope_megatron.get_thd_batch_on_this_cp_rank(batch, bounds, bounds, max_seqlen,
                                                                    cp_size=1, cp_rank=0)
    assert torch.equal(alone_batch["tokens"], mine["tokens"]) and params == my_params
    for size, rank in RANKS:
        cut, cut_params = mmrope_megatron.get_thd_batch_on_this_cp_rank(batch, bounds, bounds, max_seqlen,
                                                                        cp_size=size, cp_rank=rank)
        assert torch.equal(cut["tokens"][0], split_index(bounds, scheme="zigzag", size=size, rank=rank))
        assert cut_params.qkv_format == "thd" and cut_params.max_seqlen_q == 160
        assert cut_params.cu_seqlens_q_padded is bounds


# -- the frameworks' failures with M-RoPE positions, beside mmrope's cut -------------------------


def test_megatron_core_cuts_padded_positions_on_the_batch_dim():
    """A padded ``(3, 4, S)`` batch at CP size 2: Megatron-core keeps two whole samples' positions
    and halves the tokens, without an error; mmrope's replacement cuts the positions as the tokens."""
    length = 24
    tokens = torch.arange(4 * length).view(4, length)
    positions = torch.stack([tokens, tokens + 1000, tokens + 2000])  # (3, B, S): each value names its token
    for rank in range(2):
        with world(2, rank) as group:
            theirs = megatron_utils.get_batch_on_this_cp_rank({"tokens": tokens.clone(), "position_ids": positions.clone()},
                                                              cp_group=group)
            mine = mmrope_megatron.get_batch_on_this_cp_rank({"tokens": tokens, "position_ids": positions},
                                                             cp_group=group)
        assert theirs["tokens"].shape == (4, length // 2) and theirs["position_ids"].shape == (3, 2, length)
        index = split_index([0, length], scheme="zigzag-row", size=2, rank=rank)
        assert torch.equal(mine["tokens"], theirs["tokens"]) and torch.equal(mine["tokens"], tokens[:, index])
        assert torch.equal(mine["position_ids"], positions[..., index])
        assert torch.equal(mine["position_ids"][0], mine["tokens"])  # each token keeps its own positions


def test_megatron_core_refuses_a_packed_row_of_positions():
    length = 32
    positions = torch.arange(length).expand(3, 1, length)
    with world(2, 0) as group:
        with pytest.raises(RuntimeError):
            megatron_utils.get_batch_on_this_cp_rank({"position_ids": positions.clone()}, cp_group=group)
        mine = mmrope_megatron.get_batch_on_this_cp_rank({"position_ids": positions}, cp_group=group)
    assert torch.equal(mine["position_ids"], positions[..., split_index([0, length], scheme="zigzag-row", size=2, rank=0)])


def test_verl_returns_empty_positions_for_a_four_row_packed_row():
    """verl's ``ulysses_pad_and_slice_inputs`` slices positions on dim 1: for ``(4, 1, T)`` it
    returns an empty ``(4, 0, T)`` tensor, silently; cut on the last dim (as mmrope cuts them and
    as verl's own vision path slices them) each rank gets its tokens' positions."""
    length = 40
    positions = torch.arange(length).expand(4, 1, length)
    for rank in range(2):
        with world(2, rank):
            _, theirs, _ = ulysses_pad_and_slice_inputs(arange_row(length), positions, sp_size=2)
            last_dim = slice_input_tensor(positions, dim=-1, padding=False)
        assert theirs.shape == (4, 0, length)
        assert torch.equal(last_dim, positions[..., split_index([0, length], scheme="contiguous", size=2, rank=rank)])


@pytest.mark.parametrize(("size", "rank"), RANKS)
def test_the_replacement_cuts_everything_else_as_megatron_core(size, rank):
    """Tokens, labels, the loss mask, a 4-D attention mask and a tensor of another length: the
    replacement's cut is Megatron-core's own; ``position_ids`` is cut on its last dim; the caller's batch is unchanged."""
    batch_size, length = 2, 16 * 3
    tokens = torch.arange(batch_size * length).view(batch_size, length)
    batch = {"tokens": tokens, "labels": tokens + 1, "loss_mask": (tokens % 3 != 0).float(),
             "attention_mask": torch.ones(batch_size, 1, length, length, dtype=torch.bool).tril(),
             "position_ids": torch.stack([tokens % length] * 4), "absent": None,
             "twice_as_long": torch.arange(batch_size * 2 * length).view(batch_size, 2 * length)}
    before = {key: None if value is None else value.clone() for key, value in batch.items()}
    with world(size, rank) as group:
        theirs = megatron_utils.get_batch_on_this_cp_rank({key: batch[key] for key in batch if key != "position_ids"},
                                                          cp_group=group)
        mine = mmrope_megatron.get_batch_on_this_cp_rank(batch, cp_group=group)
    for key, value in theirs.items():
        assert value is None if key == "absent" else torch.equal(mine[key], value), key
    index = split_index([0, length], scheme="zigzag-row", size=size, rank=rank)
    assert torch.equal(mine["position_ids"], batch["position_ids"][..., index])
    assert all(value is None if before[key] is None else torch.equal(value, before[key]) for key, value in batch.items())


def test_the_replacements_refuse_rows_they_cannot_cut():
    bounds = padded_bounds((16, 20))  # 20 is no multiple of 2 * 4
    batch = {"tokens": arange_row(36), "position_ids": arange_row(36).expand(4, 1, 36)}
    with pytest.raises(SequenceSplitError, match="segment 1"):
        mmrope_megatron.get_thd_batch_on_this_cp_rank(batch, bounds, bounds, torch.tensor([20]), cp_size=4, cp_rank=0)
    with pytest.raises(SequenceSplitError, match="row holds 35 tokens"):
        mmrope_megatron.thd_partitioned_indices(bounds, 35, 2, 0)
    with pytest.raises(SequenceSplitError, match="the row has 36 tokens"):
        mmrope_megatron.get_batch_on_this_cp_rank(batch, cp_size=5, cp_rank=0)
    with pytest.raises(SequenceSplitError, match="rank"):
        mmrope_megatron.get_batch_on_this_cp_rank(batch, cp_size=2, cp_rank=2)
    assert batch["tokens"].shape == (1, 36)


# -- verl's Qwen3.5 linear attention: the boundaries its patch hands GatedDeltaNet ----------------


def test_verls_qwen3_5_linear_attention_takes_the_boundaries_but_needs_flash_linear_attention():
    """verl's ``qwen3_5_gated_delta_net_forward`` (which its monkey patch puts on GatedDeltaNet) on
    a packed row with the samples' ``cu_seqlens``, as verl's FSDP engine hands them: its conv1d
    fallback keeps the samples apart, but transformers' torch chunk rule, used without
    flash-linear-attention, ignores the boundaries, so the state runs from one sample into the
    next; a Ulysses rank's part needs flash-linear-attention's context-parallel module."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from verl.models.transformers.qwen3_5 import qwen3_5_gated_delta_net_forward

    config = Qwen3_5TextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=2,
                               linear_key_head_dim=16, linear_value_head_dim=16, num_hidden_layers=1,
                               layer_types=["linear_attention"])
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers: no fast path without the GPU kernels
        layer = modeling_qwen3_5.Qwen3_5GatedDeltaNet(config, 0).eval()
    assert layer.chunk_gated_delta_rule is modeling_qwen3_5.torch_chunk_gated_delta_rule
    layer.A_log.data.fill_(-10.0)  # a state that barely decays: what one sample leaves reaches the next
    hidden, bounds = torch.randn(1, 20, 64), torch.tensor([0, 8, 20])
    with torch.no_grad():
        packed = qwen3_5_gated_delta_net_forward(layer, hidden, cu_seqlens=bounds, cu_seqlens_cpu=bounds)
        alone = [modeling_qwen3_5.Qwen3_5GatedDeltaNet.forward(layer, hidden[:, start:end])
                 for start, end in ((0, 8), (8, 20))]
    torch.testing.assert_close(packed[:, :8], alone[0])
    assert (packed[:, 8:] - alone[1]).abs().max() > 0.1  # the second sample reads the first's state
    with world(2, 0), pytest.raises(ModuleNotFoundError, match="fla"), torch.no_grad():
        qwen3_5_gated_delta_net_forward(layer, hidden[:, :10], cu_seqlens=bounds, cu_seqlens_cpu=bounds)
