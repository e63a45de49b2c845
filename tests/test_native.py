"""The compiled CPU loops (``mmrope_core._native``) against the torch and numpy passes they stand
in for, which devices other than the CPU still take: same positions, token types, change points
and mask readings, the same errors, whatever the number of threads."""

import random
import threading

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, _native
from mmrope_core.inputs import _read_cpu_mask, _read_device_mask, as_batch
from mmrope_core.mrope import TokenTypeMap, _coded, _compact, _in_segments, _small_int
from mmrope_core.mrope._place import RunLayout, _count_on, _steps, _write_rows
from mmrope_core.mrope._runs import change_points, grids_of_runs, scan
from test_mrope_kernel import KINDS, generated, media, random_packed_row


@pytest.fixture
def four_threads():
    """Calls that read ``torch.get_num_threads()`` share long batches among four threads, on
    machines of any size."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def step_table(types, mask, grids, *, text_row, cu_seqlens=None):
    """What ``place`` is handed for a batch: the code, the mask and the steps."""
    types = _small_int(types)
    code = _coded(types, mask)
    runs, spans = scan(code, padded=mask is not None)
    if spans is None:  # padding inside samples: the kernel places the compacted batch
        types, mask, _ = _compact(types, mask)
        code = _coded(types, mask)
        runs, spans = scan(code)
    if cu_seqlens is not None:
        runs, spans = _in_segments(runs, code.shape, mask, cu_seqlens)
    matched = grids_of_runs(runs, KINDS, grids, 2)
    layout = RunLayout.of(runs, matched.grid, matched.scaled, spans, 2)
    index, steps = _steps(runs, layout, spans, code.shape[1], text_row)
    return code, mask, index, steps


def both_ways(code, mask, index, steps, text_row):
    batch, length = code.shape
    shape = (batch, 4, length) if text_row else (3, batch, length)
    compiled, passes = torch.full(shape, -7), torch.full(shape, -7)
    _write_rows(compiled, code, mask, index, steps, text_row)
    _count_on(passes, code, mask, index, steps, text_row)
    return compiled, passes


@pytest.mark.parametrize("text_row", [False, True])
@pytest.mark.parametrize("mask_style", ["padded", "none", "holes"])
def test_rows_written_once_equal_the_torch_passes(mask_style, text_row):
    rng = random.Random(f"native rows {mask_style} {text_row}")
    for index in range(150):
        types, mask, grids = generated(rng, mask_style)
        compiled, passes = both_ways(*step_table(types, mask, grids, text_row=text_row), text_row)
        assert torch.equal(compiled, passes), f"batch {index}"


@pytest.mark.parametrize("text_row", [False, True])
def test_packed_rows_written_once_equal_the_torch_passes(text_row):
    rng = random.Random(f"native packed {text_row}")
    for index in range(150):
        segments, grids = random_packed_row(rng, rng.randint(1, 6))
        row = torch.tensor([[t for segment in segments for t in segment]], dtype=torch.int8)
        cu_seqlens = torch.tensor([0, *map(len, segments)]).cumsum(0)
        table = step_table(row, None, media(*grids), text_row=text_row, cu_seqlens=cu_seqlens)
        compiled, passes = both_ways(*table, text_row)
        assert torch.equal(compiled, passes), f"row {index}"


def long_batch(rows, length):
    """Rows of ``length`` tokens, each a generated sample's types repeated along the row."""
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
def test_rows_shared_among_threads_equal_one_thread(text_row):
    code, mask, index, steps = step_table(*long_batch(5, 40_000), text_row=text_row)
    order = index.argsort(kind="stable")
    results = []
    for threads in (1, 2, 3, 8):
        out = torch.full((5, 4, 40_000) if text_row else (3, 5, 40_000), -7)
        _native.place(code.numpy(), out.numpy(), index[order], np.ascontiguousarray(steps[:, order]), 5, 40_000,
                      text_row, threads)
        results.append(out)
    _, passes = both_ways(code, mask, index, steps, text_row)
    assert all(torch.equal(result, passes) for result in results)


def test_calls_from_several_threads_at_once_do_not_mix(four_threads):
    """The loops run without the GIL; each call writes only its own output."""
    batches = [step_table(*long_batch(3, 30_000 + 1000 * k), text_row=False) for k in range(4)]
    expected = [both_ways(*batch, False)[1] for batch in batches]
    found = [[] for _ in batches]

    def work(k):
        for _ in range(5):
            out = torch.empty_like(expected[k])
            _write_rows(out, *batches[k], False)
            found[k].append(out)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(out, expected[k]) for k in range(len(batches)) for out in found[k])


@pytest.mark.parametrize("problem, message", [
    ("short out", "sizes do not fit"),
    ("steps of another count", "sizes do not fit"),
    ("index decreasing", "not increasing"),
    ("index past the batch", "not increasing within 0 to 12"),
    ("out read-only", "read-only"),
])
def test_place_refuses_arguments_that_do_not_fit(problem, message):
    code = np.zeros((2, 6), dtype=np.int8)
    out = np.empty((3, 2, 6), dtype=np.int64)
    index = np.array([0, 6])
    steps = np.zeros((3, 2), dtype=np.int64)
    if problem == "short out":
        out = out[:2]
    elif problem == "steps of another count":
        steps = np.zeros((3, 3), dtype=np.int64)
    elif problem == "index decreasing":
        index = np.array([6, 0])
    elif problem == "index past the batch":
        index = np.array([0, 12])
    else:
        out.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match=message):
        _native.place(code, out, index, steps, 2, 6, False, 1)


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
