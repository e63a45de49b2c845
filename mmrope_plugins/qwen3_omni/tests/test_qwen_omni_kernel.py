"""The batched Omni kernel against the installed thinker reference: stray markers, audio-only
batches, the engine's 4-row layout, packed rows, padding inside samples, and the inputs it
refuses."""

import collections
import copy
import dataclasses
import random

import pytest
import torch
from test_qwen_omni import (
    FAMILIES,
    WithoutLoops,
    as_processor_outputs,
    built,
    engines,
    generated,
    ids_of,
    omni_row,
    split,
    transformers_reference,
)

from mmrope_core import MmropeError, PlaceholderMismatchError, compiled
from mmrope_qwen3_omni.fast import FastRopeIndex

BATCHES = 40


@pytest.fixture(scope="module")
def manager():
    from mmrope_core import PluginManager

    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen3_omni"})


def same(got, want):
    return all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))


def reference_positions(name, ids, mask, kwargs):
    """The thinker's own get_rope_index (it needs a mask)."""
    return transformers_reference(name)(input_ids=ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                                        **kwargs)


def engine_layout(positions, mask, dtype):
    """(B, 4, L) from (3, B, L) reference positions: the text row, then the positions."""
    valid = torch.ones(positions.shape[1:], dtype=torch.bool) if mask is None else mask.bool()
    text = (valid.long().cumsum(1) - 1).masked_fill(~valid, 1)
    return torch.cat([text.unsqueeze(1), positions.transpose(0, 1)], dim=1).to(dtype)


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_stray_markers_in_generated_batches_are_text(manager, name, use_audio_in_video):
    """Start and end markers that open nothing: placed as the same batch with text in their place,
    which is what the reference gives wherever it runs on them."""
    fast, _ = engines(manager, name)
    ran = collections.Counter()
    for index in range(BATCHES):
        seed = f"strays/{name}/{use_audio_in_video}/{index}"
        ids, mask, kwargs = split(generated(name, random.Random(seed), use_audio_in_video, strays="markers"))
        text_ids, _, _ = split(generated(name, random.Random(seed), use_audio_in_video, strays="text"))
        want = reference_positions(name, text_ids, mask, kwargs)
        got = fast.get_rope_index(ids, mask, **kwargs)
        assert same(got, want), f"batch {index}"
        assert torch.equal(fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs),
                                                     {"use_audio_in_video": use_audio_in_video}),
                           engine_layout(want[0], mask, fast.position_dtype)), f"batch {index}"
        try:
            raw = reference_positions(name, ids, mask, kwargs)
        except (IndexError, ValueError, TypeError, RuntimeError):
            ran["failed"] += 1
            continue
        ran["ran"] += 1
        assert same(got, raw), f"batch {index}"
        ran["differs from the batch without strays"] += not torch.equal(ids, text_ids)
    assert ran["failed"] > 5 and ran["differs from the batch without strays"] > 5, ran


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_batches_without_grids_are_text_and_checked(manager, name):
    """No image or video grid: the reference places text positions (padding 1 on every row), even
    around audio; the audio must still fit its mask."""
    fast, _ = engines(manager, name)
    rng = random.Random(f"text only/{name}")
    audios = 0
    for index in range(BATCHES):
        ids, mask, kwargs = split(generated(name, rng, False, kinds=("audio",), ensure_grid=False,
                                            strays=rng.choice([None, "markers"])))
        audios += "audio_seqlens" in kwargs
        want = reference_positions(name, ids, mask, kwargs)
        assert same(fast.get_rope_index(ids, mask, **kwargs), want), f"batch {index}"
        assert torch.equal(fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs)),
                           engine_layout(want[0], mask, fast.position_dtype)), f"batch {index}"
        if "audio_seqlens" in kwargs:
            longer = kwargs["audio_seqlens"] + 400  # each audio needs more placeholders than it has
            with pytest.raises(PlaceholderMismatchError, match=r"audio 0: needs .* placeholder tokens, found"):
                fast.get_rope_index(ids, mask, **{**kwargs, "audio_seqlens": longer})
    assert audios > BATCHES // 2


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_compute_position_ids_is_the_text_row_over_the_reference(manager, name, use_audio_in_video):
    fast, _ = engines(manager, name)
    assert fast.binding.kernel.places_packed_rows  # and writes the four rows itself, with or without the loops
    rng = random.Random(f"4 rows/{name}/{use_audio_in_video}")
    for index in range(BATCHES):
        ids, mask, kwargs = split(generated(name, rng, use_audio_in_video))
        want = reference_positions(name, ids, mask, kwargs)
        got = fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs), {"use_audio_in_video": use_audio_in_video})
        assert torch.equal(got, engine_layout(want[0], mask, fast.position_dtype)), f"batch {index}"


def holed(ids, mask, rng):
    """The batch with padding put inside its samples (a few masked tokens at random places)."""
    rows = []
    for row, valid in zip(ids.tolist(), mask.tolist()):
        for _ in range(rng.randint(1, 4)):
            column = rng.randrange(len(row) + 1)
            row.insert(column, rng.choice(row))
            valid.insert(column, 0)
        rows.append((row, valid))
    length = max(len(row) for row, _ in rows)
    out_ids, out_mask = torch.zeros(len(rows), length, dtype=torch.long), torch.zeros(len(rows), length, dtype=torch.long)
    for index, (row, valid) in enumerate(rows):
        out_ids[index, : len(row)], out_mask[index, : len(valid)] = torch.tensor(row), torch.tensor(valid)
    return out_ids, out_mask


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_padding_inside_samples(manager, name):
    fast, _ = engines(manager, name)
    rng = random.Random(f"holes/{name}")
    for index in range(BATCHES):
        ids, mask, kwargs = split(generated(name, rng, bool(index % 2)))
        ids, mask = holed(ids, mask, rng)
        want = reference_positions(name, ids, mask, kwargs)
        assert same(fast.get_rope_index(ids, mask, **kwargs), want), f"batch {index}"
        got = fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs), {"use_audio_in_video": bool(index % 2)})
        assert torch.equal(got, engine_layout(want[0], mask, fast.position_dtype)), f"batch {index}"


def packed_samples(name, rng, use_audio_in_video, count):
    """``count`` generated samples: each one's valid tokens (L,), its keyword arguments, and the
    reference's positions and delta for it alone."""
    samples = []
    for _ in range(count):
        ids, mask, kwargs = split(generated(name, rng, use_audio_in_video, max_batch=1, strays=rng.choice([None, "text"])))
        tokens = ids[0][mask[0].bool()]
        positions, delta = reference_positions(name, tokens[None], None, kwargs)
        samples.append((tokens, kwargs, positions[:, 0], delta[0]))
    return samples


def media_of(samples):
    media = {}
    for _, kwargs, _, _ in samples:
        for key, value in kwargs.items():
            media[key] = torch.cat([media[key], value]) if isinstance(value, torch.Tensor) and key in media else value
    return media


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_packed_rows_equal_each_sample_alone(manager, name, use_audio_in_video):
    """One packed row (cu_seqlens) and rows of segments with padding (segment_ids), placed by the
    kernel where the segments lie (or by the engine, unpacked, for a kernel that does not place
    packed rows): each segment is the reference's sample alone."""
    fast, _ = engines(manager, name)
    calls = []  # for each call of the kernel, whether it was given the packed row
    kernel = copy.copy(fast.binding.kernel)
    rope_index = kernel.rope_index

    def counted(*args, **kwargs):
        calls.append(kwargs.get("cu_seqlens") is not None)
        return rope_index(*args, **kwargs)

    kernel.rope_index = counted
    placed = copy.copy(fast)
    placed.binding = dataclasses.replace(fast.binding, kernel=kernel)
    dtype = fast.position_dtype
    rng = random.Random(f"packed/{name}/{use_audio_in_video}")
    for index in range(BATCHES // 2):
        samples = packed_samples(name, rng, use_audio_in_video, rng.randint(2, 5))
        media = media_of(samples)
        row = torch.cat([tokens for tokens, _, _, _ in samples])[None]
        lengths = torch.tensor([tokens.numel() for tokens, _, _, _ in samples])
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        want = torch.cat([positions for _, _, positions, _ in samples], dim=1)
        count = len(calls)
        positions, deltas = placed.get_rope_index(row, cu_seqlens=cu_seqlens, **media)
        assert calls[count:] == [kernel.places_packed_rows], f"batch {index}"
        assert positions.dtype == want.dtype and torch.equal(positions[:, 0], want), f"batch {index}"
        assert torch.equal(deltas, torch.stack([delta for _, _, _, delta in samples])), f"batch {index}"
        text = torch.cat([torch.arange(n) for n in lengths.tolist()])
        got = fast.compute_position_ids(row, None, as_processor_outputs(media), {"use_audio_in_video": use_audio_in_video},
                                        cu_seqlens=cu_seqlens)
        assert torch.equal(got[0], torch.cat([text[None], want]).to(dtype)), f"batch {index}"
        # the same segments in two rows with padding after each
        split_at = rng.randint(1, len(samples) - 1)
        width = max(int(lengths[:split_at].sum()), int(lengths[split_at:].sum())) + 3
        ids = torch.zeros(2, width, dtype=torch.long)
        segment_ids = torch.zeros(2, width, dtype=torch.long)
        for r, part in enumerate((samples[:split_at], samples[split_at:])):
            column = 0
            for k, (tokens, _, _, _) in enumerate(part, start=1):
                ids[r, column : column + tokens.numel()] = tokens
                segment_ids[r, column : column + tokens.numel()] = k
                column += tokens.numel()
        positions, deltas = fast.get_rope_index(ids, segment_ids=segment_ids, **media)
        assert torch.equal(positions[:, segment_ids > 0], want), f"batch {index}"
        assert positions[:, segment_ids == 0].eq(0).all()
        got = fast.compute_position_ids(ids, None, as_processor_outputs(media), {"use_audio_in_video": use_audio_in_video},
                                        segment_ids=segment_ids)
        assert torch.equal(got.transpose(0, 1)[:, segment_ids > 0], torch.cat([text[None], want]).to(dtype))


def test_a_media_item_cut_by_a_segment_boundary(manager):
    """A kernel placing the packed row sees the cut; unpacked, the first part is an item
    missing its placeholders in a sample of its own."""
    fast, _ = engines(manager, "Qwen3-Omni")
    placed = fast.binding.kernel.places_packed_rows
    first, second = omni_row("Qwen3-Omni", "tt[ii"), omni_row("Qwen3-Omni", "ii]t")
    row, cu_seqlens = torch.cat([first, second], dim=1), torch.tensor([0, 5, 9])
    grids = {"image_grid_thw": torch.tensor([[1, 4, 4]])}
    cut = r"segment 1 starts inside a placeholder run that segment 0 began \(row 0, token {}\)"
    alone = r"sample k below is segment k.*sample 0, {} 0: needs {} placeholder tokens, found {}"
    with pytest.raises(PlaceholderMismatchError, match=cut.format(5) if placed else alone.format("image", 4, 2)):
        fast.get_rope_index(row, cu_seqlens=cu_seqlens, **grids)
    audio = omni_row("Qwen3-Omni", "ttAt")
    row = torch.cat([audio[:, :6], audio[:, 6:], first], dim=1)
    with pytest.raises(PlaceholderMismatchError, match=cut.format(6) if placed else alone.format("audio", 13, 3)):
        fast.get_rope_index(row, cu_seqlens=torch.tensor([0, 6, audio.shape[1], row.shape[1]]),
                            audio_seqlens=torch.tensor([100]), **grids)


def test_errors_inside_a_packed_row_speak_of_the_segment_as_the_sample(manager):
    fast, _ = engines(manager, "Qwen2.5-Omni")
    segments = [omni_row("Qwen2.5-Omni", "t[iiii]t"), omni_row("Qwen2.5-Omni", "tt[iii]")]
    row = torch.cat(segments, dim=1)
    with pytest.raises(PlaceholderMismatchError, match=r"sample k below is segment k.*sample 1, image 1: needs 4 "
                                                       r"placeholder tokens, found 3"):
        fast.get_rope_index(row, cu_seqlens=torch.tensor([0, 8, 15]), image_grid_thw=torch.tensor([[1, 4, 4]] * 2))


def mutated(name, rng, use_audio_in_video):
    """A generated batch with one thing broken, or not: a token replaced or removed, an audio
    length, a grid or the flag changed, a key dropped, a timing made impossible."""
    ids, mask, kwargs = split(generated(name, rng, use_audio_in_video))
    ids, kwargs = ids.clone(), dict(kwargs)
    token = ids_of(built(name)[0])
    row, column = rng.randrange(ids.shape[0]), rng.randrange(ids.shape[1])
    what = rng.choice(["token", "token", "remove", "audio", "grid", "drop", "flag", "seconds"])
    if what == "token":
        ids[row, column] = rng.choice(list(token.values()) + [ids[row, column].item()])
    elif what == "remove":
        ids[row, column:-1] = ids[row, column + 1 :].clone()
    elif what == "audio" and "audio_seqlens" in kwargs:
        frames = kwargs["audio_seqlens"].clone()
        frames[rng.randrange(frames.numel())] += rng.choice([-40, -8, 8, 40])
        kwargs["audio_seqlens"] = frames.clamp(min=0)
    elif what == "grid" and "image_grid_thw" in kwargs:
        grid = kwargs["image_grid_thw"].clone()
        grid[rng.randrange(grid.shape[0]), rng.randrange(3)] += rng.choice([-2, -1, 1, 2])
        kwargs["image_grid_thw"] = grid
    elif what == "drop":
        kwargs.pop(rng.choice(["image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids"]), None)
    elif what == "flag":
        kwargs["use_audio_in_video"] = not use_audio_in_video
    elif what == "seconds" and "second_per_grids" in kwargs:
        seconds = kwargs["second_per_grids"].clone()
        seconds[0] = rng.choice([-1.0, float("nan"), float("inf"), 0.0])
        kwargs["second_per_grids"] = seconds
    return ids, mask, kwargs


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_the_kernel_refuses_what_the_item_reader_refuses(manager, name):
    """Broken batches: the kernel raises exactly the error the reference implementation's input
    check raises (the item-by-item reader), and places what it lets through as the thinker's own
    ``get_rope_index`` does."""
    fast, reference = engines(manager, name)
    outcomes = collections.Counter()
    for index in range(4 * BATCHES):
        rng = random.Random(f"broken/{name}/{index}")
        ids, mask, kwargs = mutated(name, rng, bool(index % 2))
        results = []
        for engine in (fast, reference):
            try:
                results.append(engine.get_rope_index(ids, mask, **kwargs))
            except MmropeError as exc:
                results.append(exc)
        got, want = results
        if isinstance(want, MmropeError) and want.__cause__ is not None and not isinstance(want.__cause__, MmropeError):
            # the check let it through, the installed reference failed: a stray start marker
            assert not isinstance(got, MmropeError), f"batch {index}: {got}"
            outcomes["reference failed"] += 1
        elif isinstance(want, MmropeError):
            assert type(got) is type(want) and str(got) == str(want), f"batch {index}: {got} / {want}"
            outcomes["refused"] += 1
        else:
            own = reference_positions(name, ids, mask, kwargs)
            assert not isinstance(got, MmropeError) and same(got, want) and same(got, own), f"batch {index}: {got}"
            outcomes["placed"] += 1
    assert outcomes["refused"] > BATCHES and outcomes["placed"] > BATCHES // 4, outcomes


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_int32_input_ids(manager, name):
    """The positions of the same ids as int64 (with media, the Qwen2.5-Omni reference itself fails
    on int32 ids: it writes int64 positions into an int32 tensor)."""
    fast, _ = engines(manager, name)
    rng = random.Random(f"int32/{name}")
    for index in range(BATCHES // 4):
        ids, mask, kwargs = split(generated(name, rng, bool(index % 2)))
        assert same(fast.binding.kernel.rope_index(ids.int(), mask, **kwargs), reference_positions(name, ids, mask, kwargs))


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_a_batch_shared_out_among_threads(manager, name):
    """Over 2**17 positions a thread, the kernel writes the samples on several threads: each
    sample is the reference's, whatever the thread count."""
    fast, _ = engines(manager, name)
    rng = random.Random(f"threads/{name}")
    rows, pieces = [], []
    for _ in range(6):
        row = []
        while len(row) < 20000:
            ids, mask, kwargs = split(generated(name, rng, True, max_batch=1))
            row += ids[0][mask[0].bool()].tolist()
            pieces.append(kwargs)
        rows.append(row)
    length = max(map(len, rows))
    ids, mask = torch.zeros(len(rows), length, dtype=torch.long), torch.zeros(len(rows), length, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)], mask[index, : len(row)] = torch.tensor(row), 1
    kwargs = media_of([(None, piece, None, None) for piece in pieces])
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 4):
            torch.set_num_threads(count)
            results.append(fast.get_rope_index(ids, mask, **kwargs))
    finally:
        torch.set_num_threads(threads)
    want = reference_positions(name, ids, mask, kwargs)
    assert same(results[0], want) and same(results[1], want)


def both_kernels(manager, name, position_dtype=None):
    """The batched kernel on the compiled loops and in numpy, under the audio rule the bound kernel uses."""
    processor, _ = built(name)
    bound = engines(manager, name)[0].binding.kernel
    token = ids_of(processor)
    markers = {"vision_end": token["vision_eos"], "audio_end": token["audio_eos"]}
    kernel = FastRopeIndex(bound.family, bound.config, markers, bound.audio_rule, position_dtype=position_dtype)
    return kernel, WithoutLoops(kernel)


def outcome(method, *args, **kwargs):
    """What ``method`` returns, or the exception it raises (the errors must be the same too)."""
    try:
        return method(*args, **kwargs)
    except Exception as exc:
        return exc


def same_outcome(got, want):
    if isinstance(want, Exception) or isinstance(got, Exception):
        return type(got) is type(want) and str(got) == str(want)
    return same(got, want) if isinstance(want, tuple) else got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_the_numpy_path_is_the_compiled_one(manager, monkeypatch, name, use_audio_in_video):
    """Without the compiled loops the batched kernel gives the positions, four rows and errors it
    gives with them: stray markers, batches without grids, padding inside samples, int32 ids,
    a sample without tokens (the engine refuses it first), broken batches. The compiled loops run here even where MMROPE_DISABLE_COMPILED switched them
    off for the engines, so both modes compare the two."""
    from mmrope_core import _native

    monkeypatch.setattr(compiled, "native", _native)
    kernels = {dtype: both_kernels(manager, name, dtype) for dtype in (None, torch.int64)}
    ran = collections.Counter()
    for index in range(BATCHES):
        rng = random.Random(f"numpy/{name}/{use_audio_in_video}/{index}")
        what = rng.choice(["strays", "text only", "holes", "int32", "empty", "broken", "broken"])
        if what == "broken":
            ids, mask, kwargs = mutated(name, rng, use_audio_in_video)
        else:
            limits = {"kinds": ("audio",), "ensure_grid": False} if what == "text only" else {}
            ids, mask, kwargs = split(generated(name, rng, use_audio_in_video, strays=rng.choice([None, "markers"]),
                                                **limits))
        if what == "holes":
            ids, mask = holed(ids, mask, rng)
        if what == "int32":
            ids = ids.int()
        if what == "empty":
            mask = mask.clone()
            mask[rng.randrange(mask.shape[0])] = 0
        fast, in_numpy = kernels[None]
        want = outcome(fast.rope_index, ids, mask, **kwargs)
        assert same_outcome(outcome(in_numpy.rope_index, ids, mask, **kwargs), want), f"{what} batch {index}"
        ran["refused" if isinstance(want, Exception) else "placed"] += 1
        for fast, in_numpy in kernels.values():
            want_rows = outcome(fast.position_ids, ids, mask, **kwargs)
            assert same_outcome(outcome(in_numpy.position_ids, ids, mask, **kwargs), want_rows), \
                f"{what} batch {index}, {fast.position_dtype}"
    assert ran["refused"] > BATCHES // 10 and ran["placed"] > BATCHES // 2, ran
