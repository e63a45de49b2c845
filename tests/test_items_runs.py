"""Families of placeholder runs laid out as media items (``resume="spatial"``, ``whole_run``,
``GridMedia(per_frame=True)``): an :class:`ItemKernel` over such a layout against the runs
kernel of the same family, on generated batches padded on either side and packed, on the
compiled loops and in numpy; the batches one refuses, the other refuses too."""

import dataclasses
import itertools
import random

import numpy as np
import pytest
import torch
from test_items import AUDIO, IMAGE, VIDEO, as_call, bits, compiled_only, corrupted, random_layout, random_rows
from test_items_decoded import placed, random_generated
from test_mrope_kernel import random_segment

from mmrope_core import PlaceholderMismatchError, compiled
from mmrope_core.items import MISMATCH, PLACED, GridMedia, ItemKernel, ItemKind, ItemLayout, SequenceMedia
from mmrope_core.mrope import MropeFamily, MropeKernel
from mmrope_core.tiny import padded_batch

pytestmark = pytest.mark.differential

PAD = 0
TEXT = tuple(range(1, 9))
KEYS = {"image": "image_grid_thw", "video": "video_grid_thw"}
FAMILIES = pytest.mark.parametrize("per_frame", [False, True], ids=["qwen2-vl-like", "qwen3-vl-like"])
LOOPS = pytest.mark.parametrize("loops", [True, False], ids=["compiled", "numpy"])


def kernels(per_frame):
    """The runs kernel of a Qwen2-VL-like family (Qwen3-VL-like: a video frame a run) and the
    item kernel of its layout."""
    family = MropeFamily("Qwen3-VL-like" if per_frame else "Qwen2-VL-like", 2, IMAGE, VIDEO,
                         per_frame_video=per_frame, image_key=KEYS["image"], video_key=KEYS["video"])
    kinds = tuple(ItemKind(name, (token,), (name,), (token,), resume="spatial", whole_run=True)
                  for name, token in (("image", IMAGE), ("video", VIDEO)))
    layout = ItemLayout(media=(GridMedia("image", 2), GridMedia("video", 2, per_frame=per_frame)), kinds=kinds)
    return MropeKernel(family), ItemKernel(layout, KEYS)


def sample(rng, per_frame, images, videos):
    """A sample's token ids from :func:`random_segment`'s token types (videos of more frames than
    lines or columns), each video frame after a time stamp's text where frames are runs of their
    own; its grids appended to ``images`` and ``videos``."""
    grids = ([], [], [])
    types = random_segment(rng, *grids)
    images += grids[0]
    videos += grids[1]
    ids, frames_of = [], iter(grids[1])
    at = 0
    while at < len(types):
        if types[at] != 2:
            ids.append(IMAGE if types[at] == 1 else rng.choice(TEXT))
            at += 1
            continue
        frames, height, width = next(frames_of)
        for _ in range(frames):
            ids += [rng.choice(TEXT) for _ in range(rng.randint(1, 2) if per_frame else 0)]
            ids += [VIDEO] * (height * width // 4)
        at += frames * height * width // 4
    return ids


def media_of(images, videos):
    return {key: torch.tensor(grids) for key, grids in zip(KEYS.values(), (images, videos)) if grids}


def batch(rng, per_frame):
    """Rows of samples, and their media."""
    images, videos = [], []
    rows = [sample(rng, per_frame, images, videos) for _ in range(rng.randint(1, 5))]
    return rows, images, videos


def same(runs, items, ids, mask, media, **packed):
    want, want_deltas = runs.rope_index(ids, mask, **media, **packed)
    got, got_deltas = items.rope_index(ids, mask, **media, **packed)
    assert torch.equal(got, want) and torch.equal(got_deltas, want_deltas)
    assert torch.equal(items.position_ids(ids, mask, **media, **packed), runs.position_ids(ids, mask, **media, **packed))


@FAMILIES
@LOOPS
def test_an_item_layout_places_runs_as_the_runs_kernel(per_frame, loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    runs, items = kernels(per_frame)
    rng = random.Random(f"runs as items {per_frame}")
    for _ in range(150):
        rows, images, videos = batch(rng, per_frame)
        media = media_of(images, videos)
        ids, mask = padded_batch(rows, PAD, left=rng.random() < 0.5, length=max(map(len, rows)) + rng.randint(0, 3))
        same(runs, items, ids, mask, media)
        if any(a[-1] in (IMAGE, VIDEO) and a[-1] == b[0] for a, b in itertools.pairwise(rows)):
            continue  # a segment boundary inside a run: the runs kernel refuses it
        cu_seqlens = torch.tensor([0, *map(len, rows)]).cumsum(0)
        same(runs, items, torch.tensor([[token for row in rows for token in row]]), None, media, cu_seqlens=cu_seqlens)


def with_run_options(rng, layout):
    """``layout`` with its images a frame an item or not, and each kind's placeholders a whole
    run, each kind of one grid resuming past its lines and columns, or not."""
    image, *others = layout.media
    kinds = []
    for kind in layout.kinds:
        grid = kind.media[0] != "audio" and len(kind.media) == 1
        kinds.append(dataclasses.replace(kind, whole_run=rng.random() < 0.5,
                                         resume="spatial" if grid and rng.random() < 0.6 else kind.resume))
    return layout.replace(media=(dataclasses.replace(image, per_frame=rng.random() < 0.6), *others), kinds=tuple(kinds))


def as_frames(rng, grids):
    """Grids of one frame, those side by side of one size joined at random: a grid's frames,
    each an item of a per-frame medium, as the ones apart were."""
    joined = []
    for grid in grids:
        if joined and joined[-1][1:] == tuple(grid[1:]) and rng.random() < 0.7:
            joined[-1] = (joined[-1][0] + grid[0], *joined[-1][1:])
        else:
            joined.append(tuple(grid))
    return joined


@compiled_only
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("text_row", [False, True])
def test_the_compiled_loops_place_the_run_options_as_numpy_does(packed, text_row):
    rng = random.Random(f"run options {packed} {text_row}")
    statuses, decoded = set(), 0
    for index in range(300):
        layout, merge = random_layout(rng)
        layout = with_run_options(rng, layout)
        media = {"image": [], "video": [], "audio": [], "seconds": []}
        rows = random_rows(rng, layout, merge, media)
        if rng.random() < 0.3:
            corrupted(rng, rows, media)
        placeholders = [(row, at) for row in rows for at, token in enumerate(row) if token in (IMAGE, VIDEO, AUDIO)]
        if placeholders and rng.random() < 0.2:  # a run longer than its media
            row, at = rng.choice(placeholders)
            row.insert(at, row[at])
        if layout.media[0].per_frame:
            media["image"] = as_frames(rng, media["image"])
        call = as_call(rng, layout, rows, media, packed)
        generated = random_generated(rng, *call[:4]) if layout.out_dtype == torch.int64 and rng.random() < 0.5 else None
        status, out, deltas = placed(layout, call, layout.enabled(), text_row, generated)
        want_status, want, want_deltas = placed(layout, call, layout.enabled(), text_row, generated, loops=False)
        assert status == want_status, f"batch {index}"
        statuses.add(status)
        if status == PLACED:
            assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(deltas), bits(want_deltas)), index
            decoded += generated is not None and generated.any()
        found = layout.find(*call, layout.enabled())
        with compiled.switched_off():
            assert layout.find(*call, layout.enabled()) == found, f"batch {index}"
    assert statuses >= {PLACED, MISMATCH} and decoded > 20


def corrupted_runs(rng, per_frame, rows, images, videos):
    """A mistake: two runs of one placeholder with the text between them dropped, a placeholder
    dropped or added, a grid left over; False where the batch has no place for it."""
    what = rng.choice(("touching", "fewer", "more", "left over"))
    row = rng.choice(rows)
    if what == "left over":
        (videos if rng.random() < 0.5 else images).append((rng.randint(1, 3), 2, 4))
        return True
    placeholders = [at for at, token in enumerate(row) if token in (IMAGE, VIDEO)]
    if what in ("fewer", "more") and placeholders:
        at = rng.choice(placeholders)
        row.insert(at, row[at]) if what == "more" else row.pop(at)
        return True
    # text with the same placeholder on both sides: a run of it, whole or not
    gaps = [(begin, end) for begin in range(1, len(row)) for end in range(begin + 1, len(row))
            if row[begin - 1] in (IMAGE, VIDEO) and row[end] == row[begin - 1]
            and all(token in TEXT for token in row[begin:end])]
    if what == "touching" and gaps:
        begin, end = rng.choice(gaps)
        del row[begin:end]
        return True
    return False


@FAMILIES
@LOOPS
def test_a_batch_the_runs_kernel_refuses_is_refused_with_a_message(per_frame, loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    runs, items = kernels(per_frame)
    rng = random.Random(f"refused runs {per_frame}")
    refused = 0
    while refused < 100:
        rows, images, videos = batch(rng, per_frame)
        if not corrupted_runs(rng, per_frame, rows, images, videos) or not all(rows):
            continue
        media = media_of(images, videos)
        ids, mask = padded_batch(rows, PAD, left=rng.random() < 0.5)
        with pytest.raises(PlaceholderMismatchError):
            runs.rope_index(ids, mask, **media)
        with pytest.raises(PlaceholderMismatchError, match=r"sample|batch gives"):
            items.rope_index(ids, mask, **media)
        refused += 1


@LOOPS
def test_each_refusal_says_what_and_where(loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    _, items = kernels(True)
    frame = [VIDEO] * 2  # a frame of a (t, 2, 4) grid
    with pytest.raises(PlaceholderMismatchError, match="sample 0, video at token 1: token 3, right after the 2 "
                                                       "placeholder tokens its media take, is one of its placeholders"):
        items.rope_index(torch.tensor([[5, *frame, *frame, 6]]), video_grid_thw=torch.tensor([[2, 2, 4]]))
    with pytest.raises(PlaceholderMismatchError, match="gives 3 video frames but its samples hold 2"):
        items.rope_index(torch.tensor([[5, *frame, 6, *frame]]), video_grid_thw=torch.tensor([[3, 2, 4]]))
    with pytest.raises(PlaceholderMismatchError, match="takes video frame 2 of the batch, but 2 video frames are"):
        items.rope_index(torch.tensor([[5, *frame, 6, *frame, 7, *frame]]), video_grid_thw=torch.tensor([[2, 2, 4]]))
    with pytest.raises(PlaceholderMismatchError, match="takes video frame 0 of the batch, but 0 video frames are"):
        items.rope_index(torch.tensor([[5, *frame, 6, 7]]), cu_seqlens=torch.tensor([0, 2, 5]))  # no grids at all


@pytest.mark.parametrize("build, message", [
    (lambda: GridMedia("video", 2, timed=True, per_frame=True), "not timed nor stamped"),
    (lambda: GridMedia("video", 2, stamped=True, per_frame=True), "not timed nor stamped"),
    (lambda: ItemKind("audio", (IMAGE,), ("audio",), (IMAGE,), resume="past"), "resume 'largest', 'last' or"),
    (lambda: ItemKind("image", (IMAGE,), ("image",), (IMAGE,), whole_run=1), "whole_run must be a bool"),
    (lambda: ItemLayout((SequenceMedia("audio"),), (ItemKind("audio", (IMAGE,), ("audio",), (IMAGE,),
                                                             resume="spatial"),)), "past one grid's lines"),
])
def test_the_run_options_check_themselves(build, message):
    with pytest.raises(ValueError, match=message):
        build()
