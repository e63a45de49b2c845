"""Sequence and context parallel: each scheme's index against the frameworks' documented
algorithms written out plainly, every token held by exactly one rank, a rank's batch cut as its
tokens are, and the collator's padded rows keeping each real token's ids, labels and positions."""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch

from mmrope_core import SequenceSplitError
from mmrope_core.parallel import SCHEMES, split_index

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
    for scheme in SCHEMES:
        assert split_index([0, 4, 6], scheme=scheme, size=1, rank=0).tolist() == [0, 1, 2, 3, 4, 5]


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
