"""Sequence and context parallel: each scheme's index against the frameworks' documented
algorithms written out plainly, every token held by exactly one rank, a rank's batch cut as its
tokens are, and the collator's padded rows keeping each real token's ids, labels and positions."""

from __future__ import annotations

import itertools
import random
import re
import runpy
from pathlib import Path

import pytest
import torch

from mmrope_core import CollateError, RopeEngine, SequenceSplitError, UnknownKeywordError, get_plugin_manager
from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import SCHEMES, split_batch, split_index, split_packed_row

SIZES = (2, 4, 8)


def transformer_engine_zigzag(cu_seqlens, size, rank):
    """Transformer Engine's ``thd_get_partitioned_indices`` as its documentation states it: every
    sequence is cut into ``2 * size`` chunks; rank ``r`` holds chunks ``r`` and ``2 * size - 1 - r``
    of each sequence, sequence after sequence."""
    held = []
    for start, end in itertools.pairwise(cu_seqlens):
        chunk = (end - start) // (2 * size)
        for which in (rank, 2 * size - 1 - rank):
            held.extend(range(start + which * chunk, start + (which + 1) * chunk))
    return held


def megatron_row_zigzag(total, size, rank):
    """Megatron-core's ``get_batch_on_this_cp_rank``: the sequence dim viewed as ``2 * size``
    chunks, of which rank ``r`` keeps ``r`` and ``2 * size - 1 - r``."""
    chunks = torch.arange(total).view(2 * size, total // (2 * size))
    return chunks[[rank, 2 * size - 1 - rank]].flatten().tolist()


def ulysses_contiguous(total, size, rank):
    """Ulysses sequence parallel (verl, DeepSpeed): rank ``r`` holds the ``r``-th of ``size`` equal parts."""
    part = total // size
    return list(range(rank * part, (rank + 1) * part))


def padded_layout(lengths, multiple):
    """Boundaries of segments of these lengths, each padded up to ``multiple``."""
    padded = [-(-length // multiple) * multiple for length in lengths]
    return [0, *torch.tensor(padded).cumsum(0).tolist()]


def expected_index(scheme, cu_seqlens, size, rank):
    if scheme == "zigzag":
        return transformer_engine_zigzag(cu_seqlens, size, rank)
    if scheme == "zigzag-row":
        return megatron_row_zigzag(cu_seqlens[-1], size, rank)
    return ulysses_contiguous(cu_seqlens[-1], size, rank)


def layouts(scheme, size):
    """Rows this scheme can cut: several segments of random lengths (one of them empty), one segment."""
    rng = random.Random(size)
    lengths = [rng.randint(1, 40) for _ in range(5)] + [0]
    if scheme == "zigzag":
        return [padded_layout(lengths, 2 * size), padded_layout([7], 2 * size)]
    multiple = 2 * size if scheme == "zigzag-row" else size
    total = -(-sum(lengths) // multiple) * multiple
    cuts = sorted(rng.sample(range(1, total), 4))
    return [[0, *cuts, total], [0, multiple]]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("size", SIZES)
def test_each_ranks_index_is_the_frameworks_and_the_ranks_cover_the_row_once(scheme, size):
    for cu_seqlens in layouts(scheme, size):
        held = []
        for rank in range(size):
            index = split_index(torch.tensor(cu_seqlens, dtype=torch.int32), scheme=scheme, size=size, rank=rank)
            assert index.dtype == torch.int64 and index.dim() == 1
            assert index.tolist() == expected_index(scheme, cu_seqlens, size, rank)
            assert torch.equal(index, split_index(cu_seqlens, scheme=scheme, size=size, rank=rank))  # a list too
            held.append(index)
        # the frameworks gather the ranks' shards in rank order: every token exactly once
        assert sorted(torch.cat(held).tolist()) == list(range(cu_seqlens[-1]))


def test_size_one_keeps_the_row_in_order():
    """One rank holds the whole row, which the frameworks then leave uncut: no length needs padding."""
    for scheme in SCHEMES:
        assert split_index([0, 4, 6], scheme=scheme, size=1, rank=0).tolist() == [0, 1, 2, 3, 4, 5]
        assert split_index([0, 3, 8], scheme=scheme, size=1, rank=0).tolist() == list(range(8))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_collator_at_size_one_pads_nothing(scheme):
    engine, samples = engine_and_samples("Qwen2.5-VL")
    full = PackedCollator(engine, flash_attn_kwargs=True)(samples)
    alone = PackedCollator(engine, split=(scheme, 1, 0))(samples)
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(alone[key], full[key]), key
    assert torch.equal(alone["cu_seqlens_padded"], full["cu_seq_lens_q"])


def test_a_misspelt_keyword_names_the_one_meant():
    with pytest.raises(UnknownKeywordError, match="split_index\\(\\) got an unknown keyword argument 'schem'; did you "
                                                  "mean 'scheme'"):
        split_index([0, 4], schem="zigzag", size=2, rank=0)
    with pytest.raises(UnknownKeywordError, match="'world_size'"):
        split_batch({}, scheme="zigzag", world_size=2, rank=0)


def test_numpys_boundaries_are_read_as_integers():
    import numpy

    bounds = numpy.cumsum([0, 8, 4])
    expected = [0, 1, 6, 7, 8, 11]
    assert split_index(bounds, scheme="zigzag", size=2, rank=0).tolist() == expected
    assert split_index(list(bounds), scheme="zigzag", size=2, rank=0).tolist() == expected  # numpy.int64 each
    with pytest.raises(SequenceSplitError, match=re.escape("integer boundaries, got dtype torch.float64")):
        split_index(bounds.astype(float), scheme="zigzag", size=2, rank=0)


def test_the_index_stays_on_the_boundaries_device_and_leaves_them_unchanged():
    cu_seqlens = torch.tensor([0, 4, 12], dtype=torch.int32)
    index = split_index(cu_seqlens, scheme="zigzag", size=2, rank=1)
    assert index.tolist() == [1, 2, 6, 7, 8, 9] and index.device == cu_seqlens.device
    assert cu_seqlens.tolist() == [0, 4, 12] and cu_seqlens.dtype == torch.int32


@pytest.mark.parametrize("cu_seqlens, options, message", [
    ([0, 8, 13], {"scheme": "zigzag", "size": 2}, "segment 1 (tokens 8 to 13) has 5 tokens, which scheme 'zigzag' "
     "with size 2 cannot cut: it needs a multiple of 4; build the batch with PackedCollator(engine, split="),
    ([0, 4, 10], {"scheme": "zigzag-row", "size": 2}, "the row has 10 tokens, which scheme 'zigzag-row' with size 2 "
     "cannot cut: it needs a multiple of 4"),
    ([0, 3, 7], {"scheme": "contiguous", "size": 2}, "the row has 7 tokens, which scheme 'contiguous' with size 2 "
     "cannot cut: it needs a multiple of 2"),
    ([0, 4], {"scheme": "ring", "size": 2}, "scheme 'ring' is unknown; the schemes are 'zigzag', 'zigzag-row', "
     "'contiguous'"),
    ([0, 4], {"scheme": "zigzag", "size": 0}, "size must be a positive int (the number of ranks sharing a row), got 0"),
    ([0, 4], {"scheme": "zigzag", "size": 2.0}, "size must be a positive int"),
    ([0, 4], {"scheme": "zigzag", "size": 2, "rank": 2}, "rank must be an int in range(2) for size=2, got 2"),
    ([0, 4], {"scheme": "zigzag", "size": 2, "rank": -1}, "rank must be an int in range(2) for size=2, got -1"),
    (torch.tensor([[0, 4]]), {"scheme": "zigzag", "size": 2}, "cu_seqlens must be 1-D, [0, end of segment 0, ..., "
     "row length], got shape (1, 2)"),
    (torch.tensor([], dtype=torch.long), {"scheme": "zigzag", "size": 2}, "cu_seqlens must be 1-D"),
    ([4, 8], {"scheme": "zigzag", "size": 2}, "cu_seqlens must start at 0, got 4"),
    ([0, 8, 4], {"scheme": "zigzag", "size": 2}, "cu_seqlens must not decrease, but entry 2 is 4 after 8"),
    (torch.tensor([0.0, 4.0]), {"scheme": "zigzag", "size": 2}, "cu_seqlens must hold integer boundaries, got dtype "
     "torch.float32"),
    ([0, 4.0], {"scheme": "zigzag", "size": 2}, "cu_seqlens must hold integer boundaries, got [0, 4.0]"),
    ("0,4", {"scheme": "zigzag", "size": 2}, "cu_seqlens must be a 1-D tensor (or list) of segment boundaries, got str"),
    (torch.zeros(2, dtype=torch.long, device="meta"), {"scheme": "zigzag", "size": 2}, "meta device"),
])
def test_what_cannot_be_cut_is_refused_saying_why(cu_seqlens, options, message):
    with pytest.raises(SequenceSplitError, match=re.escape(message)):
        split_index(cu_seqlens, **{"rank": 0, **options})


# -- split_batch: a rank's batch cut as its tokens are ---------------------------------------------

def megatron_style_batch(lengths, multiple, generator):
    """A packed row of segments of ``lengths``, each padded to ``multiple``, with every kind of
    value a batch holds: per-token tensors, ``(4, 1, T)`` positions, media (one of them ``(1, T)``
    by chance, a media mask named as such) and both kinds of boundaries."""
    layout = torch.tensor(padded_layout(lengths, multiple))
    total = int(layout[-1])
    return {
        "input_ids": torch.randint(0, 1000, (1, total), generator=generator),
        "labels": torch.randint(0, 1000, (1, total), generator=generator),
        "mm_token_type_ids": torch.randint(0, 3, (1, total), generator=generator),
        "seq_idx": torch.arange(total, dtype=torch.int32)[None],
        "position_ids": torch.randint(0, 50, (4, 1, total), generator=generator),
        "pixel_values": torch.randn(6, total, generator=generator),
        "image_grid_thw": torch.tensor([[1, 2, 3]]),
        "feature_attention_mask": torch.ones(1, total, dtype=torch.long),
        "second_per_grid_ts": torch.ones(total),
        "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
        "cu_seqlens_padded": layout.to(torch.int32),
        "use_cache": False,
    }


PER_TOKEN = ("input_ids", "labels", "mm_token_type_ids", "seq_idx")


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("size", SIZES)
def test_the_ranks_batches_give_back_the_whole_batch(scheme, size):
    batch = megatron_style_batch([5, 16, 1, 9], 2 * size, torch.Generator().manual_seed(size))
    before = {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
    total = batch["input_ids"].shape[1]
    parts = [split_batch(batch, scheme=scheme, size=size, rank=rank) for rank in range(size)]
    index = torch.cat([split_index(batch["cu_seqlens_padded"], scheme=scheme, size=size, rank=rank)
                       for rank in range(size)])
    for key in (*PER_TOKEN, "position_ids"):
        whole = torch.empty_like(batch[key])
        whole[..., index] = torch.cat([part[key] for part in parts], dim=-1)
        assert torch.equal(whole, batch[key]), key
        assert all(part[key].shape[-1] == total // size for part in parts)
    for part in parts:
        for key in ("pixel_values", "image_grid_thw", "feature_attention_mask", "second_per_grid_ts",
                    "cu_seqlens", "cu_seqlens_padded", "use_cache"):
            assert part[key] is batch[key], key  # media and the row's boundaries: whole, on every rank
        # attention's boundaries, added from the row: each real segment, then its padding on its own
        lengths, layout = [5, 16, 1, 9], batch["cu_seqlens_padded"].tolist()
        ends = [bound for start, length, end in zip(layout, lengths, layout[1:]) for bound in (start + length, end)]
        assert part["cu_seq_lens_q"].tolist() == part["cu_seq_lens_k"].tolist() == sorted({0, *ends})
        steps = torch.tensor(sorted({0, *ends})).diff()
        assert part["max_length_q"] == part["max_length_k"] == int(steps.max())
    for key, value in before.items():  # the caller's batch is as it was
        assert batch[key] is not value and torch.equal(batch[key], value) if isinstance(value, torch.Tensor) \
            else batch[key] == value


def test_a_batch_of_transformers_naming_is_cut_on_its_attention_boundaries():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 1000, (1, 12), generator=generator)
    positions = torch.arange(12)[None]
    batch = {"input_ids": ids, "position_ids": positions, "cu_seq_lens_q": torch.tensor([0, 8, 12], dtype=torch.int32),
             "cu_seq_lens_k": torch.tensor([0, 8, 12], dtype=torch.int32), "max_length_q": 8, "max_length_k": 8,
             "inputs_embeds": torch.randn(1, 12, 3, generator=generator)}
    part = split_batch(batch, scheme="zigzag", size=2, rank=1)
    assert part["input_ids"].tolist() == [ids[0, [2, 3, 4, 5, 9, 10]].tolist()]
    assert part["position_ids"].tolist() == [[2, 3, 4, 5, 9, 10]]
    assert torch.equal(part["inputs_embeds"], batch["inputs_embeds"][:, [2, 3, 4, 5, 9, 10]])
    assert part["cu_seqlens_padded"].tolist() == [0, 8, 12] and part["cu_seq_lens_q"] is batch["cu_seq_lens_q"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("size", [2, 4])
def test_the_collators_shift_labels_give_each_ranks_share_of_the_rows_loss(scheme, size):
    """A model shifting a rank's ``labels`` itself would pair the last token of one chunk with the
    first of another; the collator's ``shift_labels`` (each token's target on the whole row, cut
    with it) give the ranks' losses (transformers' own causal-LM loss) that sum to the unsplit row's."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    engine, samples = engine_and_samples("Qwen2.5-VL")
    samples = [{**sample, "labels": sample["input_ids"].clone()} for sample in samples]
    unsplit = PackedCollator(engine)(samples)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    vocab = int(unsplit["input_ids"].max()) + 1
    logits = torch.randn(1, sum(lengths), vocab, generator=torch.Generator().manual_seed(0))
    total = ForCausalLMLoss(logits, unsplit["labels"], vocab, num_items_in_batch=1)
    ranks, shifted_by_the_model = [], []
    for rank in range(size):
        part = PackedCollator(engine, split=(scheme, size, rank))(samples)
        layout = part["cu_seqlens_padded"]
        index = split_index(layout, scheme=scheme, size=size, rank=rank)
        real = torch.cat([torch.arange(length) + int(start) for length, start in zip(lengths, layout)])
        # the padded row's logits: the unsplit row's at its real tokens, noise at the padding
        padded = torch.randn(1, int(layout[-1]), vocab).index_copy(1, real, logits)[:, index]
        ranks.append(ForCausalLMLoss(padded, part["labels"], vocab, num_items_in_batch=1,
                                     shift_labels=part["shift_labels"]))
        shifted_by_the_model.append(ForCausalLMLoss(padded, part["labels"], vocab, num_items_in_batch=1))
        assert part["labels"].shape == part["shift_labels"].shape == part["input_ids"].shape
    torch.testing.assert_close(sum(ranks), total)
    assert not torch.isclose(sum(shifted_by_the_model), total)
    whole = PackedCollator(engine, split=(scheme, size, None))(samples)
    assert whole["shift_labels"][0, :-1].tolist() == whole["labels"][0, 1:].tolist()
    assert (whole["shift_labels"][0, whole["cu_seq_lens_q"][1:].long() - 1] == -100).all()  # each run's last


@pytest.mark.parametrize("scheme, size, message", [
    ("zigzag", 4, "{tokens} tokens, {padded} once padded for split=('zigzag', 4, 0) (the padding counts"),
    ("contiguous", 8, "{tokens} tokens, {padded} once padded for split=('contiguous', 8, 0) (the padding counts"),
])
def test_max_length_bounds_the_padded_row(scheme, size, message):
    """Each rank's memory follows the padded row: ``max_length`` counts its padding."""
    engine, samples = engine_and_samples("Qwen2.5-VL")
    tokens = sum(sample["input_ids"].shape[1] for sample in samples)
    padded = int(PackedCollator(engine, split=(scheme, size, None))(samples)["cu_seqlens_padded"][-1])
    assert padded > tokens
    PackedCollator(engine, max_length=padded, split=(scheme, size, 0))(samples)
    with pytest.raises(CollateError, match=re.escape(message.format(tokens=tokens, padded=padded))):
        PackedCollator(engine, max_length=padded - 1, split=(scheme, size, 0))(samples)
    with pytest.raises(CollateError, match="once padded"):  # the row built for split_batch too
        PackedCollator(engine, max_length=padded - 1, split=(scheme, size, None))(samples)
    PackedCollator(engine, max_length=tokens)(samples)  # without split, the real tokens alone


def test_a_batch_of_rows_of_one_length_is_cut_row_by_row():
    """Megatron-core's micro-batch of ``B`` rows, every one cut alike; no varlen boundaries are
    added, which attention would read as the whole batch's."""
    tokens = torch.arange(32).view(2, 16)
    batch = {"tokens": tokens, "labels": tokens + 100, "loss_mask": torch.ones(2, 16),
             "position_ids": torch.arange(16).expand(3, 2, 16), "cu_seqlens": torch.tensor([0, 16])}
    for rank in range(2):
        part = split_batch(batch, scheme="zigzag-row", size=2, rank=rank)
        index = megatron_row_zigzag(16, 2, rank)
        assert torch.equal(part["tokens"], tokens[:, index]) and torch.equal(part["labels"], tokens[:, index] + 100)
        assert part["position_ids"].tolist() == [[index, index]] * 3
        assert part["cu_seqlens_padded"].tolist() == [0, 16] and "cu_seq_lens_q" not in part
    with pytest.raises(SequenceSplitError, match=re.escape("advantages has shape (2, 16), the row's")):
        split_batch({**batch, "advantages": torch.ones(2, 16)}, scheme="zigzag-row", size=2, rank=0)


@pytest.mark.parametrize("change, message", [
    (lambda batch: {k: v for k, v in batch.items() if not k.startswith("cu_")},
     "the batch holds no segment boundaries (cu_seqlens_padded, cu_seq_lens_q or cu_seqlens), and split_batch does "
     "not guess them from the positions"),
    (lambda batch: {**batch, "advantages": torch.ones(1, 16)},
     "advantages has shape (1, 16), the row's, but is not a per-token key split_batch knows"),
    (lambda batch: {**batch, "labels": torch.ones(1, 15, dtype=torch.long)},
     "labels has shape (1, 15), but the row's boundaries end at 16"),
    (lambda batch: {**batch, "cu_seqlens_padded": torch.tensor([0, 6, 16])},
     "segment 0 (tokens 0 to 6) has 6 tokens, which scheme 'zigzag' with size 2 cannot cut: it needs a multiple of 4"),
    (lambda batch: [batch], "split_batch takes a packed batch (a dict), got list"),
    (lambda batch: {**batch, "attention_mask": torch.ones(1, 1, 16, 16, dtype=torch.bool).tril()},
     "attention_mask has shape (1, 1, 16, 16), a mask of token pairs, which split_batch cannot cut per token"),
])
def test_a_batch_that_cannot_be_cut_is_refused_saying_why(change, message):
    batch = megatron_style_batch([5, 7], 4, torch.Generator().manual_seed(0))
    with pytest.raises(SequenceSplitError, match=re.escape(message)):
        split_batch(change(batch), scheme="zigzag", size=2, rank=0)


# -- PackedCollator(split=...) -----------------------------------------------------------------------

CASES = {case.name: case for _, cases in get_plugin_manager().results("example_cases") for case in cases}


def engine_and_samples(name):
    processor, config = CASES[name].build()
    engine = RopeEngine.from_processor(processor, config)
    return engine, [dict(engine.process(**call)) for call in CASES[name].samples(processor, random.Random(0))]


@pytest.mark.parametrize("name", ["LLaVA (llava)", "Qwen3-VL"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_ranks_batch_is_its_cut_of_the_padded_row(name, scheme):
    """1-D ``(1, T)`` and M-RoPE ``(4, 1, T)`` positions alike; the samples' videos, audio and
    every family are checked at the model in tests/models/test_parallel_rows.py."""
    engine, samples = engine_and_samples(name)
    before = [{key: value.clone() for key, value in sample.items()} for sample in samples]
    full = PackedCollator(engine, flash_attn_kwargs=True)(samples)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    for rank in range(4):
        part = PackedCollator(engine, split=(scheme, 4, rank))(samples)
        layout = part["cu_seqlens_padded"]
        index = split_index(layout, scheme=scheme, size=4, rank=rank)
        padded = torch.tensor(padded_layout(lengths, 8)) if scheme == "zigzag" else torch.tensor(
            [0, *full["cu_seq_lens_q"][1:-1].tolist(), -(-sum(lengths) // (8 if scheme == "zigzag-row" else 4)) *
             (8 if scheme == "zigzag-row" else 4)])
        assert layout.tolist() == padded.tolist() and layout.dtype == torch.int32
        # the rank's tokens that are real, read back from the unsplit row
        real = torch.cat([torch.arange(length) + int(start) for length, start in zip(lengths, layout)])
        unsplit = torch.full((int(layout[-1]),), -1).index_copy(0, real, torch.arange(sum(lengths)))[index]
        mine = unsplit >= 0
        assert mine.any()
        for key in ("input_ids", "labels", *(key for key in full if key.endswith("token_type_ids"))):
            assert torch.equal(part[key][0, mine], full[key][0, unsplit[mine]]), key
        assert torch.equal(part["position_ids"][..., mine], full["position_ids"][..., unsplit[mine]])
        assert (part["labels"][0, ~mine] == -100).all()
        assert (part["input_ids"][0, ~mine] == engine.processor.tokenizer.pad_token_id).all()
        assert part["position_ids"].shape[:-1] == full["position_ids"].shape[:-1]
        assert part["max_length_q"] == part["max_length_k"] == int(part["cu_seq_lens_q"].diff().max())
    for sample, original in zip(samples, before):
        assert all(torch.equal(sample[key], original[key]) for key in original)


@pytest.mark.parametrize("split, message", [
    ("zigzag", "split must be (scheme, size, rank), like ('zigzag', 2, rank), got 'zigzag'"),
    (("zigzag", 2), "split must be (scheme, size, rank)"),
    (("ulysses", 2, 0), "scheme 'ulysses' is unknown; the schemes are 'zigzag', 'zigzag-row', 'contiguous'"),
    (("zigzag", 0, 0), "size must be a positive int"),
    (("zigzag", 2, 2), "rank must be an int in range(2) for size=2, got 2"),
    (("zigzag", 2, True), "rank must be an int in range(2) for size=2, got True"),
])
def test_the_split_option_is_checked_when_the_collator_is_built(split, message):
    engine, _ = engine_and_samples("Qwen2-VL")
    with pytest.raises(SequenceSplitError, match=re.escape(message)):
        PackedCollator(engine, split=split)


def test_linear_attentions_segment_ids_keep_padding_apart():
    """``seq_idx`` (what causal-conv1d reads, where the model's layers need it) follows attention's
    segments: each sample's tokens, and each padding run on its own."""
    lengths = [3, 6]
    row = {"input_ids": torch.arange(9)[None], "labels": torch.arange(9)[None], "position_ids": torch.arange(9)[None],
           "seq_idx": torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]], dtype=torch.int32)}
    ranks = [split_packed_row(row, lengths, ("zigzag", 2, rank), pad_token_id=7,
                              token_keys=["input_ids", "labels", "position_ids"]) for rank in range(2)]
    assert ranks[0]["cu_seq_lens_q"].tolist() == [0, 3, 4, 10, 12]  # layout [0, 4, 12]
    # rank 0 holds slots 0, 3 | 4, 5, 10, 11 of the padded row; rank 1 slots 1, 2 | 6, 7, 8, 9
    assert [part["seq_idx"].tolist() for part in ranks] == [[[0, 1, 2, 2, 3, 3]], [[0, 0, 2, 2, 2, 2]]]
    assert [part["input_ids"].tolist() for part in ranks] == [[[0, 7, 3, 4, 7, 7]], [[1, 2, 5, 6, 7, 8]]]
    assert [part["labels"].tolist() for part in ranks] == [[[0, -100, 3, 4, -100, -100]], [[1, 2, 5, 6, 7, 8]]]
    assert [part["position_ids"].tolist() for part in ranks] == [[[0, 3, 3, 4, 9, 10]], [[1, 2, 5, 6, 7, 8]]]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_padded_row_uncut_is_cut_by_split_batch_into_the_collators_batches(scheme):
    engine, samples = engine_and_samples("Qwen2.5-VL")
    whole = PackedCollator(engine, split=(scheme, 4, None))(samples)
    assert whole["input_ids"].shape[1] == int(whole["cu_seqlens_padded"][-1])
    for rank in range(4):
        mine, theirs = split_batch(whole, scheme=scheme, size=4, rank=rank), PackedCollator(
            engine, split=(scheme, 4, rank))(samples)
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert torch.equal(mine[key], value) if isinstance(value, torch.Tensor) else mine[key] == value, key


def test_the_example_runs_as_a_script(capsys):
    runpy.run_path(str(Path(__file__).parents[1] / "examples" / "sequence_parallel.py"), run_name="__main__")
    assert "2 ranks of 24 tokens each" in capsys.readouterr().out
