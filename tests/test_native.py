"""The compiled CPU loops (``mmrope_core._native``) against the numpy and torch passes they stand
in for: same positions, token types, change points and mask readings, the same errors, whatever
the number of threads; and the item primitives called directly (layouts as the extension takes
them, statuses, arrays it refuses, forks)."""

import contextlib
import multiprocessing
import random
import threading

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, _native, compiled
from mmrope_core.inputs import _read_cpu_mask, _read_device_mask, as_batch
from mmrope_core.arrays import change_points
from mmrope_core.mrope import MropeFamily, MropeKernel, TemporalRule, TokenTypeMap, mrope_positions
from mmrope_core.mrope._positions import _coded
from test_mrope_kernel import KINDS, media


compiled_only = pytest.mark.mmrope_applies(compiled.native is not None, "the compiled loops")


@pytest.fixture
def four_threads():
    """Calls that read ``torch.get_num_threads()`` share long batches among four threads, on
    machines of any size."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


@contextlib.contextmanager
def loops(on):
    """The compiled loops switched on or off for the calls inside."""
    before = compiled.native
    if not on:
        compiled.native = None
    try:
        yield
    finally:
        compiled.native = before


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


def long_positions(batch):
    types, mask, grids = batch
    return mrope_positions(types, mask, KINDS, grids, spatial_merge_size=2)


@compiled_only
def test_calls_from_several_threads_at_once_do_not_mix(four_threads):
    """The loops run without the GIL; each call writes only its own output."""
    batches = [long_batch(3, 30_000 + 1000 * k) for k in range(4)]
    with loops(False):
        expected = [long_positions(batch) for batch in batches]
    found = [[] for _ in batches]

    def work(k):
        for _ in range(5):
            found[k].append(long_positions(batches[k]))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for k in range(len(batches)):
        for written in found[k]:
            assert all(torch.equal(a, b) for a, b in zip(written, expected[k])), f"batch {k}"


def positions_and_token_types(threads):
    """A long batch's positions, and the token types of long rows read by ``threads`` threads."""
    positions = long_positions(long_batch(4, 40_000))[0]
    ids = torch.arange(4 * 70_000).reshape(4, 70_000) % 1000
    types = torch.empty(ids.shape, dtype=torch.int8)
    _native.token_types(ids.numpy(), 8, 4, 70_000, (7, 11), (1, 2), types.numpy(), threads)
    return positions, types


def in_a_data_loader_worker(threads):
    torch.set_num_threads(1)  # as torch's data-loader workers do first: torch's own pool does not survive a fork
    return positions_and_token_types(threads)


@compiled_only
def test_a_forked_process_computes_positions_after_its_parent_did(four_threads):
    """Data-loader workers fork the trainer: the threads of a call are gone when it returns, so a
    child can start its own."""
    in_parent = positions_and_token_types(4)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        in_child = pool.apply_async(in_a_data_loader_worker, (4,)).get(timeout=120)
    assert all(torch.equal(child, parent) for child, parent in zip(in_child, in_parent))


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


# -- the kernel of placeholder runs, with the compiled loops and without -------------------------------

IMAGE, VIDEO, BEGIN, END, PAD = 151655, 151656, 151652, 151653, 151643


def timed(per_second, **rule):
    """A rule at ``per_second``: by default in the seconds' dtype, as transformers forms it."""
    return TemporalRule(per_second, **{"precision": "seconds", **rule})


def keyed(*args, **kwargs):
    """A family reading the processors' keys: its images', and where it has them its videos' and
    their seconds'."""
    video = len(args) > 3 or "video_markers" in kwargs
    timed = video and kwargs.get("temporal") is not None
    return MropeFamily(*args, **kwargs, image_key="image_grid_thw", video_key="video_grid_thw" if video else None,
                       seconds_key="second_per_grid_ts" if timed else None)


FAMILIES = {
    "qwen2": keyed("Qwen2-VL", 2, IMAGE, VIDEO),
    "qwen2.5": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(2.0)),
    "qwen2.5 int": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(4)),
    "qwen2.5 odd rate": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(1.3)),
    "qwen2.5 whole": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(2.0, whole_seconds=True)),
    "qwen2.5 whole int": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(4, whole_seconds=True)),
    "qwen3": keyed("Qwen3-VL", 2, IMAGE, VIDEO, per_frame_video=True),
    "glm": keyed("GLM-4V", 2, IMAGE, per_frame_video=True, video_markers=(BEGIN, END)),
    "images only": keyed("PaddleOCR-VL", 2, IMAGE),
    # vLLM's rules: text resumes past a video's last frame; temporal ids in float64
    "qwen2 vllm": keyed("Qwen2-VL", 2, IMAGE, VIDEO, resume_past_frames=True),
    "qwen2.5 vllm": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(2.0, precision="float64"),
                                resume_past_frames=True),
    "qwen2.5 vllm odd rate": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(1.3, precision="float64"),
                                         resume_past_frames=True),
    # SGLang's: frame * seconds, then * tokens per second
    "qwen2.5 sglang": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(2.0, order="frame_first"),
                                  resume_past_frames=True),
    "qwen2.5 sglang odd rate": keyed("Qwen2.5-VL", 2, IMAGE, VIDEO, temporal=timed(1.3, order="frame_first"),
                                           resume_past_frames=True),
    "float32 rule": keyed("My-VL", 2, IMAGE, VIDEO, temporal=timed(1.3, precision="float32")),
}


def random_sample(rng, family, grids, seconds, open_end=False):
    """One sample's token ids laid out as the family's processor lays them out: text, images and
    videos (one run, a run per frame after a timestamp, or frames of image tokens between video
    markers); with ``open_end`` a video at its end may lack its end marker (a truncated sample)."""
    text = lambda low, high: [rng.randrange(10, 60) for _ in range(rng.randint(low, high))]  # noqa: E731
    row = text(0, 3)
    for _ in range(rng.randint(0, 4)):
        video = family.has_video and rng.random() < 0.4
        t, h, w = (rng.randint(1, 4) if video else 1), 2 * rng.randint(1, 4), 2 * rng.randint(1, 4)
        per_frame = h * w // 4
        if not video:
            row += [IMAGE] * per_frame
            grids[0].append((1, h, w))
        else:
            grids[1].append((t, h, w))
            seconds.append(rng.choice((0.5, 1.0, 1.3, 2.0, 1 / 3, 0.04, rng.uniform(0.05, 2.5))))
            if family.video_markers:
                row += [BEGIN] + [token for _ in range(t) for token in [IMAGE] * per_frame + text(1, 2)] + [END]
            elif family.per_frame_video:
                row += [token for _ in range(t) for token in text(1, 2) + [VIDEO] * per_frame]
            else:
                row += [VIDEO] * (t * per_frame)
        row += text(1, 3)  # runs of one kind need text between them
    if open_end and row[-1:] == [END] and rng.random() < 0.5:
        row.pop()
    return row or [11]


def random_inputs(rng, family, *, ids_dtype=torch.int64, seconds_dtype=torch.float32, packed=False):
    """A batch padded on either side (or without a mask: the padding is text), or one packed row
    with ``cu_seqlens``; ids, mask and the other keyword arguments of ``rope_index``."""
    grids, seconds = ([], []), []
    rows = [random_sample(rng, family, grids, seconds, open_end=True) for _ in range(rng.randint(1, 6))]
    inputs = {}
    if packed:
        ids = torch.tensor([[token for row in rows for token in row]], dtype=ids_dtype)
        inputs["cu_seqlens"] = torch.tensor([0, *map(len, rows)]).cumsum(0)
        mask = None
    else:
        length = max(map(len, rows)) + rng.randint(0, 3)
        ids = torch.full((len(rows), length), PAD, dtype=ids_dtype)
        mask = torch.zeros(len(rows), length, dtype=torch.bool)
        left = rng.random() < 0.5
        for index, row in enumerate(rows):
            span = slice(length - len(row), length) if left else slice(0, len(row))
            ids[index, span] = torch.tensor(row, dtype=ids_dtype)
            mask[index, span] = True
        if rng.random() < 0.2:
            mask = None  # the padding is text
    if grids[0]:
        inputs["image_grid_thw"] = torch.tensor(grids[0])
    if grids[1]:
        inputs["video_grid_thw"] = torch.tensor(grids[1])
        if family.temporal is not None and rng.random() < 0.9:
            inputs["second_per_grid_ts"] = torch.tensor(seconds, dtype=seconds_dtype)
    return ids, mask, inputs


def outcome(call, *args, **kwargs):
    """What a call gives: its results, or its error's type and message."""
    try:
        return call(*args, **kwargs)
    except Exception as error:  # the two paths must fail alike
        return type(error), str(error)


def assert_same_outcome(found, expected, where):
    if isinstance(expected, tuple) and isinstance(expected[0], type):
        assert found == expected, where
        return
    found, expected = (found, expected) if isinstance(found, tuple) else ((found,), (expected,))
    for got, want in zip(found, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), where


def assert_both_paths_agree(family, ids, mask, inputs, where):
    """The kernel gives the same results, or raises the same error, with the compiled loops and
    without them."""
    kernel = MropeKernel(family)
    for method in ("rope_index", "position_ids"):
        with loops(True):
            compiled_outcome = outcome(getattr(kernel, method), ids, mask, **inputs)
        with loops(False):
            numpy_outcome = outcome(getattr(kernel, method), ids, mask, **inputs)
        assert_same_outcome(compiled_outcome, numpy_outcome, f"{where}, {method}")




@compiled_only
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_the_compiled_loops_equal_the_numpy_path(name, ids_dtype):
    family = FAMILIES[name]
    rng = random.Random(f"loops {name} {ids_dtype}")
    for index in range(120):
        seconds_dtype = rng.choice((torch.float32, torch.float64))
        ids, mask, inputs = random_inputs(rng, family, ids_dtype=ids_dtype, seconds_dtype=seconds_dtype)
        assert_both_paths_agree(family, ids, mask, inputs, f"batch {index}")


@compiled_only
@pytest.mark.parametrize("name", FAMILIES)
def test_the_compiled_loops_equal_the_numpy_path_on_packed_rows(name):
    """Segments back to back in one row, videos in float32 and float64 seconds; GLM segments that
    leave a video open do not turn the next segment's images into video."""
    family = FAMILIES[name]
    rng = random.Random(f"packed {name}")
    for index in range(120):
        ids, _, inputs = random_inputs(rng, family, packed=True,
                                       seconds_dtype=rng.choice((torch.float32, torch.float64)))
        assert_both_paths_agree(family, ids, None, inputs, f"row {index}")


@compiled_only
def test_glm_markers_are_counted_from_each_row_and_segment_start():
    """An end marker missing in one sample leaves the images after it, in that row or segment
    only, as video frames: a mismatch there, none elsewhere."""
    family = FAMILIES["glm"]
    frame = [IMAGE] * 4
    opened = [11, BEGIN] + frame + [12]
    images = [11] + frame + [12]
    video, image = torch.tensor([[1, 4, 4]]), torch.tensor([[1, 4, 4]])
    ids = torch.tensor([opened + images])
    # in one row the image after the open video is its second frame
    assert_both_paths_agree(family, ids, None, {"video_grid_thw": torch.tensor([[2, 4, 4]])}, "one row")
    assert_both_paths_agree(family, ids, None, {"image_grid_thw": image, "video_grid_thw": video}, "one row, mismatch")
    packed = {"image_grid_thw": image, "video_grid_thw": video, "cu_seqlens": torch.tensor([0, 7, 13])}
    assert_both_paths_agree(family, ids, None, packed, "two segments")
    batch = torch.tensor([opened, images + [PAD]])
    assert_both_paths_agree(family, batch, batch != PAD, {"image_grid_thw": image, "video_grid_thw": video}, "two rows")


@compiled_only
@pytest.mark.parametrize("case", [
    "padding inside", "truncated image", "grid too many", "grid of odd size", "int16 ids", "strided ids",
    "int32 grid", "float16 seconds", "seconds as a list", "negative seconds", "nan seconds", "seconds too few",
    "packed batch of two rows", "packed with a mask", "bounds not reaching the end", "a run cut by a segment",
])
def test_unusual_inputs_give_the_same_outcome_on_both_paths(case):
    """Each is placed alike, or refused with the same typed error."""
    image, video, pad = 1001, 1002, 1000  # ids that int16 holds
    family = keyed("Qwen2.5-VL", 2, image, video, temporal=timed(2.0))
    ids = torch.tensor([[11, 12] + [image] * 4 + [13] + [video] * 8 + [14, pad]])
    mask = ids != pad
    inputs = {"image_grid_thw": torch.tensor([[1, 4, 4]]), "video_grid_thw": torch.tensor([[2, 4, 4]]),
              "second_per_grid_ts": torch.tensor([0.7])}
    assert_both_paths_agree(family, ids, mask, inputs, "the common case")
    graded = {**inputs, "second_per_grid_ts": torch.tensor([0.7], requires_grad=True)}
    assert_both_paths_agree(family, ids, mask, graded, "seconds that require grad")
    if case == "padding inside":
        mask[0, 1] = False
    elif case == "truncated image":
        ids[0, 2] = 15
    elif case == "grid too many":
        inputs["image_grid_thw"] = torch.tensor([[1, 4, 4], [1, 2, 2]])
    elif case == "grid of odd size":
        inputs["image_grid_thw"] = torch.tensor([[1, 1, 16]])
    elif case == "int16 ids":
        ids = ids.to(torch.int16)
    elif case == "strided ids":
        ids, mask = ids.repeat_interleave(2, 1)[:, ::2], mask.repeat_interleave(2, 1)[:, ::2]
    elif case == "int32 grid":
        inputs["image_grid_thw"] = inputs["image_grid_thw"].to(torch.int32)
    elif case == "float16 seconds":
        inputs["second_per_grid_ts"] = torch.tensor([0.7], dtype=torch.float16)
    elif case == "seconds as a list":
        inputs["second_per_grid_ts"] = [0.7]
    elif case == "negative seconds":
        inputs["second_per_grid_ts"] = torch.tensor([-0.5])
    elif case == "nan seconds":
        inputs["second_per_grid_ts"] = torch.tensor([float("nan")])
    elif case == "seconds too few":
        inputs["second_per_grid_ts"] = torch.tensor([], dtype=torch.float32)
    elif case == "packed batch of two rows":
        ids, mask = torch.cat([ids, ids]), None
        inputs["cu_seqlens"] = torch.tensor([0, ids.shape[1]])
    elif case == "packed with a mask":
        inputs["cu_seqlens"] = torch.tensor([0, ids.shape[1]])
    elif case == "bounds not reaching the end":
        mask, inputs["cu_seqlens"] = None, torch.tensor([0, 5])
    elif case == "a run cut by a segment":
        mask, inputs["cu_seqlens"] = None, torch.tensor([0, 4, ids.shape[1]])
    assert_both_paths_agree(family, ids, mask, inputs, case)


@compiled_only
@pytest.mark.parametrize("text_row", [False, True])
def test_the_kernel_shares_long_rows_among_threads(text_row):
    family = FAMILIES["qwen2.5"]
    rng = random.Random(f"threads {text_row}")
    rows, grids, seconds = [], ([], []), []
    for _ in range(5):
        row = []
        while len(row) < 38_000:
            row += random_sample(rng, family, grids, seconds)
        rows.append(row)
    length = max(map(len, rows)) + 7
    ids = torch.full((5, length), PAD)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row)
    mask = ids != PAD
    inputs = {"image_grid_thw": torch.tensor(grids[0]), "video_grid_thw": torch.tensor(grids[1]),
              "second_per_grid_ts": torch.tensor(seconds, dtype=torch.float32)}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            assert_both_paths_agree(family, ids, mask, inputs, f"{threads} threads")
    finally:
        torch.set_num_threads(before)


@compiled_only
@pytest.mark.parametrize("name", ["qwen2.5", "qwen2.5 int", "qwen2.5 odd rate", "qwen2.5 whole", "qwen2.5 sglang",
                                  "qwen2.5 sglang odd rate", "float32 rule"])
@pytest.mark.parametrize("seconds_dtype", [torch.float32, torch.float64])
def test_the_kernel_rounds_temporal_ids_in_the_scales_dtype(name, seconds_dtype):
    """Seconds per grid of real frame rates, where frame * scale truncates differently in float32
    than in float64 for some frames: each video's temporal ids are rounded in the dtype numpy
    (and torch) multiply in."""
    family = FAMILIES[name]
    seconds = [2 / fps for fps in range(1, 61)] + [0.7, 0.35, 1.3, 0.9, 2.2]  # two frames a grid
    frames = 16
    scale = family.temporal.per_second * np.array(seconds, dtype=np.float32)
    ids_32 = (np.arange(frames, dtype=np.float32)[:, None] * scale).astype(np.int64)
    ids_64 = (np.arange(frames, dtype=np.float64)[:, None] * scale.astype(np.float64)).astype(np.int64)
    if family.temporal == timed(family.temporal.per_second):  # (whole seconds: a float64 scale, or int64 for a whole rate)
        assert (ids_32 != ids_64).any(), "no scale here tells float32 from float64"
    row = [11] + [VIDEO] * (frames * 4) + [12]
    ids = torch.tensor([row] * len(seconds))
    inputs = {"video_grid_thw": torch.tensor([[frames, 4, 4]] * len(seconds)),
              "second_per_grid_ts": torch.tensor(seconds, dtype=seconds_dtype)}
    assert_both_paths_agree(family, ids, None, inputs, f"{seconds_dtype} seconds")


# -- the item primitives, called directly: layouts as the extension takes them ---------------------

ITEM_OPEN, ITEM_IMAGE, ITEM_CLOSE = 103, 100, 104
# one grid medium merged 2 x 2; images between two markers; int64 positions, whole-second temporal ids
ITEM_MEDIA = ((0, 2, False, (), 0, 0),)
ITEM_KIND = ((ITEM_OPEN, ITEM_IMAGE), 1, (0,), (ITEM_IMAGE,), (ITEM_CLOSE,), None, False, 1, 0, 0, False, 0)
ITEM_TEMPORAL, ITEM_VALUES = (1.0, False, 1, True, False, False), (False, 1.0, False, False, True)


def placed(layout, ids, mask=None, grid=None, out=None):
    batch, length = ids.shape
    out = np.empty((3, batch, length), np.int64) if out is None else out
    deltas = np.empty((batch, 1), np.int64)
    status = compiled.native.place_items(layout, out, False, batch, length, ids, mask, None, None, (grid,), (None,),
                                         deltas, 1, 1)
    return status, out, deltas


@compiled_only
def test_place_items_writes_or_says_why_not():
    layout = compiled.native.compile_layout(ITEM_MEDIA, (ITEM_KIND,), ITEM_TEMPORAL, ITEM_VALUES)
    status, out, deltas = placed(layout, np.ones((2, 4), np.int64), np.ones((2, 4), bool))
    assert status == 0 and (out == np.arange(4)).all() and (deltas == 0).all()
    holes = np.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool)
    assert placed(layout, np.ones((2, 4), np.int64), holes)[0] == 2
    image = np.array([[1, ITEM_OPEN, ITEM_IMAGE, ITEM_CLOSE]], np.int64)
    status, out, deltas = placed(layout, image, grid=np.array([[1, 2, 2]], np.int64))
    assert status == 0 and out[:, 0].tolist() == [[0, 1, 2, 3]] * 3 and deltas.tolist() == [[0]]
    assert placed(layout, image, grid=np.array([[1, 4, 4]], np.int64))[0] == 1
    assert placed(layout, image, grid=np.array([[1, 2, 3]], np.int64))[0] == 3
    assert placed(layout, np.ones((2, 4), np.int64), np.array([[1, 1, 1, 1], [0, 0, 0, 0]], bool))[0] == 4
    status, sample, token, items = compiled.native.find_items(layout, 1, 4, image, None, None, None,
                                                              (np.array([[1, 2, 2]], np.int64),), (None,), 1)
    assert (status, sample, token) == (0, -1, 0)
    assert np.frombuffer(items, np.int64).tolist() == [0, 1, 3, 0, 0, -1]


@compiled_only
@pytest.mark.parametrize("media, kinds, temporal, values, message", [
    (((0, 0, False, (), 0, 0),), (), ITEM_TEMPORAL, ITEM_VALUES, "a medium out of range"),
    (((1, 1, False, ((1, 0),), 0, 0),), (), ITEM_TEMPORAL, ITEM_VALUES, "a medium out of range"),
    (ITEM_MEDIA, (ITEM_KIND[:2] + ((1,),) + ITEM_KIND[3:],), ITEM_TEMPORAL, ITEM_VALUES, "a kind out of range"),
    (ITEM_MEDIA, (ITEM_KIND[:7] + (2,) + ITEM_KIND[8:],), ITEM_TEMPORAL, ITEM_VALUES, "a kind out of range"),
    (ITEM_MEDIA, (ITEM_KIND,), (1.0, False, 3, True, False, False), ITEM_VALUES, "a rule out of range"),
    (ITEM_MEDIA, (ITEM_KIND,), (float("inf"), False, 1, True, False, False), ITEM_VALUES, "a rule out of range"),
    (ITEM_MEDIA, (ITEM_KIND,), (1.0, False, 1, False, False, False), ITEM_VALUES, "a rule out of range"),
    (ITEM_MEDIA, (ITEM_KIND,), (2.0**24, False, 2, True, False, True), ITEM_VALUES, "a rule out of range"),
    ((ITEM_MEDIA[0] + (True,),), (), (1.0, False, 2, True, False, False), ITEM_VALUES, "stamps are scaled in float"),
    (ITEM_MEDIA, ((tuple(range(5)),) + ITEM_KIND[1:],), ITEM_TEMPORAL, ITEM_VALUES, "a key is a tuple of at most 4"),
])
def test_compile_layout_refuses_a_layout_out_of_range(media, kinds, temporal, values, message):
    with pytest.raises(ValueError, match=message):
        compiled.native.compile_layout(media, kinds, temporal, values)


@compiled_only
def test_place_items_refuses_arrays_that_do_not_fit_or_cannot_be_written():
    layout = compiled.native.compile_layout(ITEM_MEDIA, (ITEM_KIND,), ITEM_TEMPORAL, ITEM_VALUES)
    with pytest.raises(ValueError, match="sizes do not fit"):
        placed(layout, np.ones((2, 4), np.int64), np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="do not fit"):
        placed(layout, np.ones((2, 4), np.int64), out=np.empty((3, 2, 5), np.int64))
    read_only = np.empty((3, 1, 4), np.int64)
    read_only.flags.writeable = False
    with pytest.raises((ValueError, BufferError), match="read-only"):
        placed(layout, np.ones((1, 4), np.int64), out=read_only)
    with pytest.raises(ValueError, match="PyCapsule"):
        placed(object(), np.ones((1, 4), np.int64))


def placing_in_a_child(_):
    layout = compiled.native.compile_layout(ITEM_MEDIA, (ITEM_KIND,), ITEM_TEMPORAL, ITEM_VALUES)
    ids = np.tile(np.array([1, ITEM_OPEN, ITEM_IMAGE, ITEM_CLOSE], np.int64), (64, 2048))
    grid = np.tile(np.array([[1, 2, 2]], np.int64), (64 * 2048, 1))
    batch, length = ids.shape
    out, deltas = np.empty((3, batch, length), np.int64), np.empty(batch, np.int64)
    status = compiled.native.place_items(layout, out, False, batch, length, ids, None, None, None, (grid,), (None,),
                                         deltas, 1, 8)
    return status, int(out[:, -1, -1].sum())


@compiled_only
def test_a_forked_process_places_items_on_threads_of_its_own():
    """Data-loader workers fork the trainer: the threads of a call are gone when it returns."""
    in_parent = placing_in_a_child(None)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(placing_in_a_child, (None,)).get(timeout=120) == in_parent
