"""The compiled CPU loops (``mmrope_core._native``) against the torch and numpy passes they stand
in for, which devices other than the CPU still take: same positions, token types, change points
and mask readings, the same errors, whatever the number of threads."""

import multiprocessing
import random
import threading

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, _native
from mmrope_core.inputs import _read_cpu_mask, _read_device_mask, as_batch
from mmrope_core.arrays import change_points
from mmrope_core.mrope import TokenTypeMap
from mmrope_core.mrope._positions import _coded, _compact, _in_segments, _small_int
from mmrope_core.mrope._write import counted_on, written_from_runs
from mmrope_core.mrope._runs import grids_of_runs, scan
from test_mrope_kernel import KINDS, generated, media, random_packed_row


@pytest.fixture
def four_threads():
    """Calls that read ``torch.get_num_threads()`` share long batches among four threads, on
    machines of any size."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def matched_runs(types, mask, grids, cu_seqlens=None):
    """What ``place`` is handed for a batch: its code and mask, runs, spans and matched grids."""
    types = _small_int(types)
    code = _coded(types, mask)
    runs, spans = scan(code, padded=mask is not None)
    if spans is None:  # padding inside samples: the kernel places the compacted batch
        types, mask, _ = _compact(types, mask)
        code = _coded(types, mask)
        runs, spans = scan(code)
    if cu_seqlens is not None:
        runs, spans, _ = _in_segments(runs, code.shape, mask, cu_seqlens)
    return code, mask, runs, spans, grids_of_runs(runs, KINDS, grids, 2)


def both_ways(code, mask, runs, spans, matched, text_row):
    """Positions and deltas written from the runs (the CPU's way), and counted on in torch passes
    (other devices' way, run here on the CPU)."""
    written = written_from_runs(runs, spans, matched.grid, matched.scaled, 2, code.shape, text_row=text_row)
    counted = counted_on(code, mask, runs, spans, matched.grid, matched.scaled, 2, text_row=text_row)
    return written, counted


def assert_same(written, counted, where):
    (positions, deltas), (expected, expected_deltas) = written, counted
    assert torch.equal(positions, expected), where
    assert (deltas is None and expected_deltas is None) or torch.equal(deltas, expected_deltas), where


@pytest.mark.parametrize("text_row", [False, True])
@pytest.mark.parametrize("mask_style", ["padded", "none", "holes"])
def test_positions_written_from_runs_equal_the_torch_passes(mask_style, text_row):
    rng = random.Random(f"native rows {mask_style} {text_row}")
    for index in range(150):
        types, mask, grids = generated(rng, mask_style)
        assert_same(*both_ways(*matched_runs(types, mask, grids), text_row), f"batch {index}")


@pytest.mark.parametrize("text_row", [False, True])
def test_packed_positions_written_from_runs_equal_the_torch_passes(text_row):
    rng = random.Random(f"native packed {text_row}")
    for index in range(150):
        segments, grids = random_packed_row(rng, rng.randint(1, 6))
        row = torch.tensor([[t for segment in segments for t in segment]], dtype=torch.int8)
        cu_seqlens = torch.tensor([0, *map(len, segments)]).cumsum(0)
        assert_same(*both_ways(*matched_runs(row, None, media(*grids), cu_seqlens), text_row), f"row {index}")


def long_batch(rows, length):
    """Rows of ``length`` tokens, images and videos (scaled temporal ids) all along, every other
    row padded at its end."""
    rng = random.Random(f"long {rows} {length}")
    types = torch.zeros(rows, length, dtype=torch.int8)
    grids = {1: [], 2: []}
    for row in range(rows):
        column = rng.randint(0, 40)
        while column < length - 200:
            kind = rng.choice((1, 2))
            grid = (rng.randint(1, 3) if kind == 2 else 1, 2 * rng.randint(1, 5), 2 * rng.randint(1, 5))
            tokens = grid[0] * grid[1] * grid[2] // 4
            types[row, column : column + tokens] = kind
            grids[kind].append(grid)
            column += tokens + rng.randint(1, 60)
    mask = torch.ones(rows, length, dtype=torch.bool)
    for row in range(0, rows, 2):
        mask[row, length - rng.randint(1, 150) :] = False
    scales = [rng.choice((0.5, 1.0, 1.3)) for _ in grids[2]]
    return types, mask, media(grids[1], grids[2], scales)


@pytest.mark.parametrize("text_row", [False, True])
def test_rows_shared_among_threads_equal_the_torch_passes(text_row):
    batch = matched_runs(*long_batch(5, 40_000))
    counted = both_ways(*batch, text_row)[1]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            assert_same(both_ways(*batch, text_row)[0], counted, f"{threads} threads")
    finally:
        torch.set_num_threads(before)


def test_calls_from_several_threads_at_once_do_not_mix(four_threads):
    """The loops run without the GIL; each call writes only its own output."""
    batches = [matched_runs(*long_batch(3, 30_000 + 1000 * k)) for k in range(4)]
    expected = [both_ways(*batch, False)[1] for batch in batches]
    found = [[] for _ in batches]

    def work(k):
        code, _, runs, spans, matched = batches[k]
        for _ in range(5):
            found[k].append(written_from_runs(runs, spans, matched.grid, matched.scaled, 2, code.shape))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in range(len(batches)):
        for written in found[k]:
            assert_same(written, expected[k], f"batch {k}")


def positions_and_token_types(threads):
    """A long batch's positions, and the token types of long rows read by ``threads`` threads."""
    code, _, runs, spans, matched = matched_runs(*long_batch(4, 40_000))
    ids = torch.arange(4 * 70_000).reshape(4, 70_000) % 1000
    types = torch.empty(ids.shape, dtype=torch.int8)
    _native.token_types(ids.numpy(), 8, 4, 70_000, (7, 11), (1, 2), types.numpy(), threads)
    return written_from_runs(runs, spans, matched.grid, matched.scaled, 2, code.shape)[0], types


def in_a_data_loader_worker(threads):
    torch.set_num_threads(1)  # as torch's data-loader workers do first: torch's own pool does not survive a fork
    return positions_and_token_types(threads)


def test_a_forked_process_computes_positions_after_its_parent_did(four_threads):
    """Data-loader workers fork the trainer: the threads of a call are gone when it returns, so a
    child can start its own."""
    in_parent = positions_and_token_types(4)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        in_child = pool.apply_async(in_a_data_loader_worker, (4,)).get(timeout=120)
    assert all(torch.equal(child, parent) for child, parent in zip(in_child, in_parent))


def layout_arrays(**changes):
    """The arguments of ``_native.positions`` for a 2 x 6 batch: a sample per row, an image run of
    2 x 2 merged tokens in the first."""
    arrays = dict(first=[0, 6], count=[6, 6], start=[1], length=[4], sample=[0], height=[2], width=[2], frames=[1],
                  temporal=[0])
    arrays.update(changes)
    return [np.array(arrays[name], dtype=np.int64) for name in
            ("first", "count", "start", "length", "sample", "height", "width", "frames", "temporal")]


@pytest.mark.parametrize("changes, message", [
    ({}, None),
    (dict(first=[0, 3]), "sample 1 .* overlaps another"),
    (dict(count=[6, 7]), "sample 1 .* leaves its row"),
    (dict(first=[4, 6]), "sample 0 .* leaves its row"),
    (dict(start=[4]), "run 0 does not fit its sample 0"),
    (dict(length=[3]), "run 0 does not fit"),
    (dict(frames=[2]), "run 0 does not fit"),
    (dict(temporal=[]), "run 0 does not fit"),
    (dict(sample=[1]), "run 0 does not fit its sample 1"),
    (dict(sample=[2]), "run 0 belongs to no sample"),
    (dict(height=[2, 2]), "sizes do not fit"),
])
def test_positions_refuse_a_layout_that_does_not_hang_together(changes, message):
    out, deltas = np.empty((3, 2, 6), dtype=np.int64), np.empty(2, dtype=np.int64)
    arguments = (out, 2, 6, False, *layout_arrays(**changes), deltas, 1)
    if message is None:
        _native.positions(*arguments)
        assert out[2, 0].tolist() == [0, 1, 2, 1, 2, 3] and deltas.tolist() == [-2, 0]
    else:
        with pytest.raises(ValueError, match=message):
            _native.positions(*arguments)


def test_positions_refuse_outputs_they_cannot_write():
    out = np.empty((3, 2, 6), dtype=np.int64)
    out.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match="read-only"):
        _native.positions(out, 2, 6, False, *layout_arrays(), None, 1)


def by_comparison(ids, types):
    expected = torch.zeros(ids.shape, dtype=torch.int8)
    for token, media_type in types.items():
        expected[ids == token] = media_type
    return expected


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("tokens", [1, 3, 16, 20])
def test_token_types_equal_a_comparison_per_token(dtype, tokens, four_threads):
    """int64 and int32 ids are read by the compiled loop (up to its 16 tokens), others by numpy."""
    rng = random.Random(f"types {dtype} {tokens}")
    top = 250 if dtype == torch.uint8 else 30_000
    types = {token: rng.randint(1, 127) for token in rng.sample(range(top), tokens)}
    generator = torch.Generator().manual_seed(tokens)
    for shape in [(1, 1), (3, 17), (4, 70_001), (5,), (2, 3, 9)]:
        ids = torch.randint(0, top, shape, generator=generator).to(dtype)
        ids.view(-1)[:: 3] = torch.tensor(list(types))[torch.arange(ids.numel())[:: 3] % tokens].to(dtype)
        found = TokenTypeMap(types)(ids)
        assert found.dtype == torch.int8 and torch.equal(found, by_comparison(ids, types)), shape


def test_token_types_of_wide_or_strided_ids():
    """An int64 id beyond int32 is no token; a strided view is read as its values."""
    types = {7: 1, 2**31 - 1: 2}
    ids = torch.tensor([[7, 2**32 + 7, 2**31 - 1, -(2**32) + 7, 7 - 2**32, 3]])
    assert TokenTypeMap(types)(ids).tolist() == [[1, 0, 2, 0, 0, 0]]
    block = torch.randint(0, 10, (40, 30))
    assert torch.equal(TokenTypeMap({7: 1, 3: 2})(block.t()), by_comparison(block.t(), {7: 1, 3: 2}))
    assert torch.equal(TokenTypeMap({7: 1, 3: 2})(block[:, ::2]), by_comparison(block[:, ::2], {7: 1, 3: 2}))


def test_change_points_equal_numpy():
    rng = np.random.default_rng(11)
    for size in [*range(0, 40), 1000, 65_537]:
        for density in (0.0, 0.01, 0.5):
            values = np.zeros(size, dtype=np.int8)
            flips = rng.random(size) < density
            values[flips] = rng.integers(-128, 128, int(flips.sum()))
            expected = (values[1:] != values[:-1]).nonzero()[0]
            assert np.array_equal(change_points(values), expected), (size, density)
            assert np.array_equal(change_points(values.view(np.uint8)), expected)


def test_coded_types_hold_minus_one_at_masked_tokens():
    generator = torch.Generator().manual_seed(3)
    for shape in [(1, 1), (4, 33), (3, 70_000)]:
        types = torch.randint(0, 128, shape, generator=generator).to(torch.int8)
        mask = torch.rand(shape, generator=generator) < 0.7
        assert torch.equal(_coded(types, mask), torch.where(mask, types, -1).to(torch.int8))


def masks(dtype):
    """Masks of ``dtype``: padding on either side, every token valid, a row with none, a value
    other than 0 and 1 (several, in rows 1 and 3: the first is named), over short and long rows
    (the long ones read by several threads)."""
    bad_values = {torch.bool: [], torch.uint8: [2, 255], torch.int8: [-1, 2, -128]}.get(dtype, [-1, 2, 7, -(2**7)])
    for length in (9, 70_000):
        padded = torch.ones(4, length, dtype=dtype)
        padded[0, :3] = 0
        padded[2, -5:] = 0
        yield padded
        yield torch.ones(4, length, dtype=dtype)
        empty = padded.clone()
        empty[1] = 0
        yield empty
        for bad in bad_values:
            holding = padded.clone()
            holding[3, length // 2] = bad
            holding[1, length - 2] = bad
            yield holding


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("tokens_in_every_row", [False, True])
def test_masks_read_once_equal_the_torch_reading(dtype, tokens_in_every_row, four_threads):
    for mask in masks(dtype):
        before = mask.clone()
        outcomes = []
        for read in (_read_cpu_mask, _read_device_mask):
            try:
                outcomes.append(read(mask, tokens_in_every_row))
            except InvalidInputError as error:
                outcomes.append(str(error))
        compiled, passes = outcomes
        if isinstance(passes, str) or passes is None:
            assert compiled == passes
        else:
            assert compiled.dtype == torch.bool and torch.equal(compiled, passes)
        assert torch.equal(mask, before)


def test_a_mask_value_is_named_where_it_first_occurs(four_threads):
    mask = torch.ones(3, 200_000, dtype=torch.int64)
    mask[2, 5] = 3
    mask[1, 199_990] = -1
    with pytest.raises(InvalidInputError, match="sample 1, position 199990 holds -1"):
        as_batch(torch.zeros(3, 200_000, dtype=torch.int64), mask)
