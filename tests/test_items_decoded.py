"""Positions written as int64, truncated (``ItemLayout(truncated=True)``), and runs of generated
tokens placed where a rollout engine decodes them (``generated``): the compiled loops against
numpy (``mmrope_core.rollout.decoded_positions`` over the float positions) to the bit, on
generated layouts and batches; a kernel that reads ``generated_mask``."""

import contextlib
import random

import numpy as np
import pytest
import torch
from test_items import CLOSE_C, OPEN_C, as_call, bits, clip, clip_kernel, compiled_only, random_layout, random_rows

from mmrope_core import InvalidInputError, compiled
from mmrope_core.items import PLACED, ItemKernel
from mmrope_core.rollout import decoded_positions


def random_generated(rng, ids, mask, first, count):
    """Runs of generated tokens anywhere in a sample but its first token (inside media items too)."""
    flags = np.zeros(ids.shape, dtype=bool)
    flat = flags.reshape(-1)
    if first is None:
        rows = [np.flatnonzero(mask[b]) + b * ids.shape[1] if mask is not None else np.arange(ids.shape[1]) +
                b * ids.shape[1] for b in range(ids.shape[0])]
    else:
        rows = [np.arange(begin, begin + size) for begin, size in zip(first.tolist(), count.tolist())]
    for tokens in rows:
        at = 1
        while at < tokens.size:
            at += rng.randint(0, 12)
            run = rng.randint(1, 8)
            flat[tokens[at : at + run]] = True
            at += run + 1
    return flags


def placed(layout, call, enabled, text_row, generated, loops=True, threads=1):
    ids, mask, first, count, media, seconds = call
    samples = ids.shape[0] if first is None else first.size
    dtype = np.int64 if layout.out_dtype == torch.int64 else np.float32
    out = np.full((ids.shape[0], 4, ids.shape[1]) if text_row else (3, *ids.shape), -7, dtype=dtype)
    deltas = np.full((samples, 1), -7, dtype=dtype)
    with contextlib.nullcontext() if loops else compiled.switched_off():
        status = layout.place(out, text_row, ids, mask, first, count, media, seconds, deltas, enabled, threads,
                              generated)
    return status, out, deltas


@compiled_only
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("text_row", [False, True])
def test_truncated_positions_and_decoded_runs_are_placed_as_numpy_places_them(packed, text_row):
    rng = random.Random(f"decoded items {packed} {text_row}")
    decoded = 0
    for index in range(300):
        layout, merge = random_layout(rng)
        if layout.float32:
            layout = layout.replace(truncated=rng.random() < 0.8)
        media = {"image": [], "video": [], "audio": [], "seconds": []}
        rows = random_rows(rng, layout, merge, media)
        call = as_call(rng, layout, rows, media, packed)
        generated = random_generated(rng, *call[:4]) if layout.out_dtype == torch.int64 else None
        status, out, deltas = placed(layout, call, layout.enabled(), text_row, generated)
        want_status, want, want_deltas = placed(layout, call, layout.enabled(), text_row, generated, loops=False)
        assert status == want_status, index
        if status != PLACED:
            continue
        assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(deltas), bits(want_deltas)), index
        decoded += generated is not None and generated.any()
        if layout.truncated:  # without generated tokens: the float positions, truncated toward zero
            floats = placed(layout.replace(truncated=False), call, layout.enabled(), text_row, None)
            truncated = placed(layout, call, layout.enabled(), text_row, None)
            assert np.array_equal(truncated[1], floats[1].astype(np.int64)), index
            assert np.array_equal(truncated[2], floats[2].astype(np.int64)), index
    assert decoded > 100


@compiled_only
def test_rows_shared_among_threads_are_decoded_as_by_one():
    rng = random.Random("decoded items threads")
    layout, merge = random_layout(rng)
    layout = layout.replace(dtype=torch.float32, truncated=True, text_only=False, exclusive=(), empty_samples=True)
    media = {"image": [], "video": [], "audio": [], "seconds": []}
    rows = []
    while sum(map(len, rows)) < 400_000:
        rows += random_rows(rng, layout, merge, media)
    call = as_call(random.Random(0), layout, rows, media, packed=False, holes=False)
    generated = random_generated(rng, *call[:4])
    one = placed(layout, call, layout.enabled(), False, generated)
    many = placed(layout, call, layout.enabled(), False, generated, threads=8)
    assert one[0] == many[0] == PLACED and np.array_equal(one[1], many[1]) and np.array_equal(one[2], many[2])


def test_decoded_runs_start_where_the_rule_says_inside_a_block_too():
    """A run starting inside a video's block takes the largest position of the block's tokens
    before it (transformers' 2 frames 1 s apart at 2 positions a second: temporal ids 0 and 2)."""
    kernel = clip_kernel()
    layout = kernel.layout.replace(dtype=torch.float32, truncated=True)
    row = np.array([[5, *clip(2, 3), 7, 8]], dtype=np.int64)
    media = (np.array([[2, 2, 2]], dtype=np.int64), np.array([3], dtype=np.int64))
    seconds = (np.array([1.0], dtype=np.float32), None)
    for start in range(1, row.shape[1]):
        generated = np.zeros(row.shape, dtype=bool)
        generated[0, start:] = True
        for loops in (True, False):
            if loops and not compiled.available():
                continue
            with contextlib.nullcontext() if loops else compiled.switched_off():
                out, deltas = np.empty((3, *row.shape), np.int64), np.empty((1, 1), np.int64)
                prefill, prefill_deltas = np.empty((3, *row.shape), np.float32), np.empty((1, 1), np.float32)
                assert layout.place(out, False, row, None, None, None, media, seconds, deltas, 1, 1, generated) == PLACED
                assert layout.replace(truncated=False).place(prefill, False, row, None, None, None, media, seconds,
                                                             prefill_deltas, 1) == PLACED
            largest = prefill[:, 0, :start].max()
            delta = int(np.float32(largest + 1) - np.float32(start))
            assert out[:, 0, start:].tolist() == [list(range(start + delta, row.shape[1] + delta))] * 3, (start, loops)
            assert np.array_equal(out[:, 0, :start], prefill[:, 0, :start].astype(np.int64)) and deltas[0, 0] == delta


@pytest.mark.parametrize("loops", [True, False])
def test_a_kernel_that_reads_generated_mask_places_each_sample_as_alone(loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    base = clip_kernel()
    layout = base.layout.replace(dtype=torch.float32, truncated=True)
    keys = {"video": ("video_grid_thw", "second_per_grids"), "audio": "audio_seqlens"}
    kernel = ItemKernel(layout, keys, reads_generated_mask=True)
    assert kernel.position_dtype == torch.int64
    samples = [[5, 6, *clip(2, 3), 7, 8, 9, 10], [*clip(1, 4), 8, 9, 9, *clip(3, 1), 6, 6]]
    flags = [[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1], [0] * 8 + [1, 1] + [0] * 6 + [1, 1]]
    seconds = torch.tensor([0.5, 1 / 3, 1.3])
    media = {"video_grid_thw": torch.tensor([[2, 2, 2], [1, 2, 2], [3, 2, 2]]), "second_per_grids": seconds,
             "audio_seqlens": torch.tensor([3, 4, 1])}
    counts = [1, 2]
    alone = []
    for k, (row, flag) in enumerate(zip(samples, flags)):
        part = slice(sum(counts[:k]), sum(counts[: k + 1]))
        one = {key: value[part] for key, value in media.items()}
        positions, deltas = kernel.rope_index(torch.tensor([row]), generated_mask=torch.tensor([flag]).bool(), **one)
        prefill, prefill_deltas = clip_float(layout).rope_index(torch.tensor([row]), **one)
        want, want_deltas = decoded_positions(prefill, torch.tensor([flag]).bool(), None, None, prefill_deltas)
        assert torch.equal(positions, want) and torch.equal(deltas, want_deltas), k
        alone.append((positions[:, 0], deltas[0]))
    length = max(map(len, samples)) + 2
    for left in (False, True):
        ids, mask = torch.zeros(2, length, dtype=torch.long), torch.zeros(2, length, dtype=torch.bool)
        generated = torch.zeros(2, length, dtype=torch.bool)
        spans = []
        for k, (row, flag) in enumerate(zip(samples, flags)):
            span = slice(length - len(row), length) if left else slice(0, len(row))
            ids[k, span], mask[k, span], generated[k, span] = torch.tensor(row), True, torch.tensor(flag).bool()
            spans.append(span)
        positions, deltas = kernel.rope_index(ids, mask, generated_mask=generated, **media)
        four = kernel.position_ids(ids, mask, generated_mask=generated, **media)
        for k, span in enumerate(spans):
            assert torch.equal(positions[:, k, span], alone[k][0]) and torch.equal(deltas[k], alone[k][1]), (left, k)
            assert torch.equal(four[k, 1:, span], alone[k][0]) and four.dtype == torch.int64
        holes = mask.clone()
        holes[0, spans[0].start + 1] = False  # padding inside: the sample placed without that token (text)
        inside, _ = kernel.rope_index(ids, holes, generated_mask=generated & holes, **media)
        kept = torch.tensor([samples[0][0], *samples[0][2:]])
        want, _ = kernel.rope_index(kept[None], generated_mask=torch.tensor([flags[0][:1] + flags[0][2:]]).bool(),
                                    **{key: value[:1] for key, value in media.items()})
        assert torch.equal(inside[:, 0, holes[0]], want[:, 0])
    joined = torch.tensor([samples[0] + samples[1]])
    bounds = torch.tensor([0, len(samples[0]), len(samples[0]) + len(samples[1])])
    packed, packed_deltas = kernel.rope_index(joined, cu_seqlens=bounds,
                                              generated_mask=torch.tensor([flags[0] + flags[1]]).bool(), **media)
    assert torch.equal(packed[:, 0], torch.cat([alone[0][0], alone[1][0]], dim=1))
    assert packed_deltas.tolist() == [alone[0][1].tolist(), alone[1][1].tolist()]
    with pytest.raises(InvalidInputError, match=r"generated_mask has shape \(1, 3\) but input_ids has"):
        kernel.rope_index(joined, generated_mask=torch.zeros(1, 3, dtype=torch.bool), **media)
    # checked as the engine checks it: a rollout generates after its prompt, never padding
    second = torch.zeros_like(joined, dtype=torch.bool)
    second[0, bounds[1]] = True
    with pytest.raises(InvalidInputError, match="marks the first token of segment 1 as generated"):
        kernel.rope_index(joined, cu_seqlens=bounds, generated_mask=second, **media)
    with pytest.raises(InvalidInputError, match="marks sample 0, token 1 as generated, but it is padding"):
        kernel.rope_index(ids, holes, generated_mask=~holes & (torch.arange(ids.shape[1]) == 1), **media)
    with pytest.raises(InvalidInputError, match="got 'generated_mask', which this kernel does not take"):
        base.rope_index(joined, cu_seqlens=bounds, generated_mask=torch.zeros_like(joined).bool(), **media)


def clip_float(layout):
    return ItemKernel(layout.replace(truncated=False), {"video": ("video_grid_thw", "second_per_grids"),
                                                        "audio": "audio_seqlens"})


def test_generated_tokens_are_placed_in_int64_positions_only():
    layout = clip_kernel().layout
    with pytest.raises(ValueError, match="truncated is a bool, True only with dtype=torch.float32"):
        layout.replace(truncated=True)
    floats = layout.replace(dtype=torch.float32)
    with pytest.raises(ValueError, match="the layout must write int64"):
        ItemKernel(floats, {"video": ("video_grid_thw", "second_per_grids"), "audio": "audio_seqlens"},
                   reads_generated_mask=True)
    row = np.array([[OPEN_C, CLOSE_C]], dtype=np.int64)
    with pytest.raises(ValueError, match="generated tokens are placed in int64 positions only"):
        floats.place(np.empty((3, 1, 2), np.float32), False, row, None, None, None, (None, None), (None, None),
                     np.empty((1, 1), np.float32), 1, 1, np.zeros((1, 2), dtype=bool))
