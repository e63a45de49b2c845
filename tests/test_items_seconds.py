"""Timed grids placed by a layout of media items (``mmrope_core.items``) under every temporal rule
the run kernel's families take, to the bit as :class:`MropeKernel` places them: seconds in each
dtype (and none: one whole second), whole, fractional and zero positions per second, many frames,
padding on either side, packed rows; with and without the compiled loops."""

import dataclasses
import random

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, compiled
from mmrope_core.items import PLACED, GridMedia, ItemKernel, ItemKind, ItemLayout, TemporalRule
from mmrope_core.mrope import MropeFamily, MropeKernel
from mmrope_qwen_vl.families import ROLLOUT_RULES
from mmrope_transformers.fast import TEMPORAL_RULES

pytestmark = pytest.mark.differential

IMAGE, VIDEO = 911, 912
TEXT = tuple(range(1, 9))
RULES = tuple(dict.fromkeys((*TEMPORAL_RULES, *(rule.temporal for rule in ROLLOUT_RULES.values()))))
PER_SECOND = (2, 25, 2.0, 2.5, 0.3, 0.7, 0)
# seconds whose products with frames and per_second fall on or near whole numbers, where
# float32 and float64 arithmetic and the order of the products truncate differently
SECONDS = (0.0, 0.04, 0.1, 0.2, 0.3, 1 / 3, 0.5, 2 / 3, 0.7, 1.0, 1.3, 2.0, 2.5, 4.7, 10.0, 1000.3)
DTYPES = ("float32", "float64", "int64", "int32", "list", "untimed")


def kernels(rule, merge, timed):
    """The run kernel of a timed family and the item kernel of the same rule: images and videos,
    each a run of its placeholders, text resuming one past the largest position."""
    family = MropeFamily("Timed", merge, IMAGE, VIDEO, temporal=rule, resume_past_frames=True,
                         image_key="images", video_key="videos", seconds_key="seconds")
    layout = ItemLayout(
        media=(GridMedia("image", merge), GridMedia("video", merge, timed=timed)),
        kinds=(ItemKind("image", (IMAGE,), ("image",), (IMAGE,)),
               ItemKind("video", key=(VIDEO,), media=("video",), placeholders=(VIDEO,), resume="largest")),
        temporal=rule)
    keys = {"image": "images", "video": ("videos", "seconds") if timed else "videos"}
    return MropeKernel(family), ItemKernel(layout, keys)


def random_samples(rng, merge):
    """Samples of text, images and videos (some of many frames), and their grids."""
    samples, images, videos = [], [], []
    for _ in range(rng.randint(1, 4)):
        row = [rng.choice(TEXT) for _ in range(rng.randint(0, 3))]
        for _ in range(rng.randint(not row, 4)):
            h, w = merge * rng.randint(1, 3), merge * rng.randint(1, 3)
            if rng.random() < 0.3:
                images.append([1, h, w])
                row += [IMAGE] * (h * w // merge**2)
            else:
                t = rng.randint(1, 300) if rng.random() < 0.2 else rng.randint(1, 12)
                videos.append([t, h, w])
                row += [VIDEO] * (t * h * w // merge**2)
            row += [rng.choice(TEXT) for _ in range(rng.randint(1, 3))]
        samples.append(row)
    return samples, images, videos


def random_seconds(rng, dtype, videos):
    """Seconds per video in ``dtype``: a tensor, a list (float32, as processors give it), or None."""
    if dtype == "untimed":
        return None
    if dtype in ("int64", "int32"):
        values = [rng.choice((0, 1, 2, 3, 7, 60, rng.randint(0, 5000))) for _ in range(videos)]
        return torch.tensor(values, dtype=getattr(torch, dtype))
    values = [rng.choice(SECONDS) if rng.random() < 0.7 else rng.uniform(0, 100) for _ in range(videos)]
    return values if dtype == "list" else torch.tensor(values, dtype=getattr(torch, dtype))


def calls(rng, samples, images, videos, seconds):
    """The batch as the engine hands it: padded on the left or right (with extra padding), or
    packed in one row with its segments' bounds."""
    media = {"images": torch.tensor(images, dtype=torch.int64).reshape(-1, 3),
             "videos": torch.tensor(videos, dtype=torch.int64).reshape(-1, 3)}
    if seconds is not None:
        media["seconds"] = seconds
    length = max(map(len, samples)) + rng.randint(0, 2)
    ids = torch.zeros(len(samples), length, dtype=torch.int64)
    mask = torch.zeros(len(samples), length, dtype=torch.int64)
    left = rng.random() < 0.5
    for index, row in enumerate(samples):
        at = length - len(row) if left else 0
        ids[index, at:at + len(row)] = torch.tensor(row, dtype=torch.int64)
        mask[index, at:at + len(row)] = 1
    yield (ids, mask), media
    bounds = torch.tensor([0, *torch.tensor(list(map(len, samples))).cumsum(0).tolist()])
    yield (torch.tensor([[token for row in samples for token in row]]),), {**media, "cu_seqlens": bounds}


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("rule", RULES, ids=str)
def test_temporal_ids_are_the_run_kernels_under_every_rule(rule, loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    elif compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    rng = random.Random(f"seconds {rule} {loops}")
    placed = 0
    for per_second in PER_SECOND:
        for merge in (1, 2):
            timed_rule = dataclasses.replace(rule, per_second=per_second)
            runs, timed = kernels(timed_rule, merge, timed=True)
            _, untimed = kernels(timed_rule, merge, timed=False)
            for dtype in DTYPES * 3:
                samples, images, videos = random_samples(rng, merge)
                seconds = random_seconds(rng, dtype, len(videos))
                items = untimed if seconds is None else timed
                for args, media in calls(rng, samples, images, videos, seconds):
                    want, want_deltas = runs.rope_index(*args, **media)
                    positions, deltas = items.rope_index(*args, **media)
                    where = f"{timed_rule}, {dtype} seconds {seconds}, {args[0].tolist()}"
                    assert torch.equal(positions, want) and torch.equal(deltas, want_deltas), where
                    assert torch.equal(items.position_ids(*args, **media), runs.position_ids(*args, **media)), where
                    placed += 1
    assert placed == len(PER_SECOND) * 2 * len(DTYPES) * 3 * 2


BAD_SECONDS = {
    "negative": ([-1.0], torch.float64), "nan": ([float("nan")], torch.float32), "inf": ([float("inf")], torch.float64),
    "huge": ([2.0**21], torch.float32), "huge int": ([2**40], torch.int64), "huge list": ([1e300], None),
    "negative int": ([-3], torch.int64), "wrong count": ([1.0, 2.0], torch.float64),
}


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("bad", BAD_SECONDS)
def test_bad_seconds_are_refused_as_the_run_kernel_refuses_them(bad, loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    values, dtype = BAD_SECONDS[bad]
    seconds = values if dtype is None else torch.tensor(values, dtype=dtype)
    ids = torch.tensor([[1, VIDEO, VIDEO, 2]])
    media = {"images": None, "videos": torch.tensor([[2, 2, 2]]), "seconds": seconds}
    for rule in RULES:
        runs, items = kernels(dataclasses.replace(rule, per_second=2), 2, timed=True)
        with pytest.raises(InvalidInputError) as refused:
            runs.check(ids, **media)  # the runs kernel's typed error
        with pytest.raises(type(refused.value)):
            items.rope_index(ids, **media)
        with pytest.raises(type(refused.value)):
            items.position_ids(ids, **media)


def test_a_layout_refuses_only_the_rules_it_cannot_compute():
    stamped = (GridMedia("video", 2, stamped=True),)
    kind = ItemKind("video", (VIDEO,), ("video",), (VIDEO,))
    for rule in (TemporalRule(precision="seconds"), TemporalRule(whole_seconds=True)):
        with pytest.raises(ValueError, match="not a layout with stamped media"):
            ItemLayout(stamped, (kind,), temporal=rule)
    timed = (GridMedia("video", 2, timed=True),)
    with pytest.raises(ValueError, match="below 2\\*\\*24"):
        ItemLayout(timed, (kind,), temporal=TemporalRule(2**24, precision="seconds"))
    layout = ItemLayout(timed, (kind,), temporal=TemporalRule(2**24))  # float64: any per_second
    out, deltas = np.empty((3, 1, 2), np.int64), np.empty((1, 1), np.int64)
    assert layout.place(out, False, np.array([[1, VIDEO]]), None, None, None, (np.array([[1, 2, 2]]),),
                        (np.array([0.5]),), deltas, 1) == PLACED


@pytest.mark.parametrize("loops", [True, False])
def test_a_layout_reads_seconds_in_three_dtypes_only(loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    elif compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    _, items = kernels(TemporalRule(2, precision="seconds"), 2, timed=True)
    ids = np.array([[1, VIDEO, VIDEO, 2]])
    media = (None, np.array([[2, 2, 2]]))
    for dtype in (np.float32, np.float64, np.int64):
        out, deltas = np.empty((3, 1, 4), np.int64), np.empty((1, 1), np.int64)
        assert items.layout.place(out, False, ids, None, None, None, media, (None, np.array([3], dtype)), deltas,
                                  items.layout.enabled()) == PLACED
        assert out[0, 0].tolist() == [0, 1, 7, 8]  # frame 1 at 1 + 2 * 3
    with pytest.raises(ValueError, match="seconds: float32, float64 or int64"):
        items.layout.place(out, False, ids, None, None, None, media, (None, np.array([3], np.float16)), deltas,
                           items.layout.enabled())
