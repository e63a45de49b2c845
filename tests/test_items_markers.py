"""Kinds of media items that open only between markers (``ItemKind(inside=...)``): GLM-4V's videos
reuse the image placeholder between begin- and end-of-video markers. A layout of items places
them as the runs kernel places them (``MropeFamily(video_markers=...)``), to the bit, over
generated batches: padded on either side, packed rows whose segments leave markers open, stray
and unbalanced markers, and broken batches both refuse; on the compiled loops and in numpy."""

import random

import numpy as np
import pytest
import torch

from mmrope_core import PlaceholderMismatchError, compiled
from mmrope_core.items import MISMATCH, GridMedia, ItemKernel, ItemKind, ItemLayout, packed_segments
from mmrope_core.mrope import MropeFamily, MropeKernel
from mmrope_core.tiny import padded_batch

pytestmark = pytest.mark.differential

IMAGE, BEGIN, END, PAD = 151343, 151341, 151342, 151329
MERGE = 2
KEYS = {"image": "image_grid_thw", "video": "video_grid_thw"}
compiled_only = pytest.mark.mmrope_applies(compiled.native is not None, "the compiled loops")


def glm_layout(**changes):
    """Videos (a run of all their frames) between the markers, images everywhere else."""
    kinds = (ItemKind("video", key=(IMAGE,), media=("video",), placeholders=(IMAGE,), inside=(BEGIN, END)),
             ItemKind("image", key=(IMAGE,), media=("image",), placeholders=(IMAGE,)))
    return ItemLayout(**{"media": (GridMedia("image", MERGE), GridMedia("video", MERGE)), "kinds": kinds,
                         **changes})


def runs_kernel():
    family = MropeFamily("GLM-4V", MERGE, IMAGE, video_token_id=None, video_markers=(BEGIN, END),
                         image_key=KEYS["image"], video_key=KEYS["video"], resume_past_frames=True)
    return MropeKernel(family)


def random_sample(rng, grids):
    """A sample's tokens, its grids appended to ``grids`` (image's, video's), and how many begin
    markers it leaves open: text, videos between markers, and stray markers (an end before any
    begin, a begin never ended), so that placeholders are video tokens wherever more begin than
    end markers precede them. A run of placeholders is always followed by a token of another kind."""
    text = lambda low, high: [rng.randrange(10, 60) for _ in range(rng.randint(low, high))]  # noqa: E731
    row, opened = text(0, 2), 0

    def media():
        video = opened > 0
        t, h, w = rng.randint(1, 4) if video else 1, MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3)
        grids[video].append((t, h, w))
        return [IMAGE] * (t * h * w // MERGE**2)

    for _ in range(rng.randint(0, 6)):
        event = rng.choices(("video", "media", "begin", "end"), (4, 4, 1, 1))[0]
        if event == "video":
            opened += 1
            row += [BEGIN] + text(0, 2) + media() + text(0, 2) + [END]
            opened -= 1
        elif event == "media":
            row += media() + text(1, 2)
        else:
            row += [BEGIN if event == "begin" else END] + text(0, 2)
            opened += 1 if event == "begin" else -1
    return row or [11], max(opened, 0)


def broken(rng, rows, grids):
    """A mistake of a trainer's data that never joins two runs of placeholders: a grid added,
    dropped or grown, a placeholder dropped or made text, a stray marker."""
    what = rng.choice(("extra grid", "no grid", "grown grid", "drop", "to text", "stray"))
    row = rng.choice(rows)
    placeholders = [index for index, token in enumerate(row) if token == IMAGE]
    if what == "extra grid":
        grids[rng.randrange(2)].append((1, MERGE, MERGE))
    elif what in ("no grid", "grown grid") and grids[0] + grids[1]:
        kind = grids[0] if grids[0] and (not grids[1] or rng.random() < 0.5) else grids[1]
        at = rng.randrange(len(kind))
        if what == "no grid":
            del kind[at]
        else:
            t, h, w = kind[at]
            kind[at] = (t, h + MERGE, w)
    elif what == "drop" and placeholders:
        del row[rng.choice(placeholders)]
    elif what == "to text" and placeholders:
        row[rng.choice(placeholders)] = rng.choice((12, BEGIN, END))
    else:
        row.insert(rng.randint(0, len(row)), rng.choice((BEGIN, END)))


def random_batch(rng, packed):
    """A batch of samples (one packed row with ``cu_seqlens``, or rows padded on either side or
    without a mask), its keyword arguments, and whether a segment of a packed row leaves a marker
    open before one with placeholders."""
    grids, rows, left_open = ([], []), [], False
    for _ in range(rng.randint(1, 5)):
        row, opened = random_sample(rng, grids)
        left_open |= bool(rows) and rows[-1][1] > 0 and IMAGE in row
        rows.append((row, opened))
    rows = [row for row, _ in rows]
    broke = rng.random() < 0.4
    if broke:
        broken(rng, rows, grids)
    inputs = {key: torch.tensor(grid) for key, grid in zip(KEYS.values(), grids) if grid}
    if packed:
        ids, mask = torch.tensor([[token for row in rows for token in row]]), None
        inputs["cu_seqlens"] = torch.tensor([0, *map(len, rows)]).cumsum(0)
    else:
        ids, mask = padded_batch(rows, PAD, left=rng.random() < 0.5, length=max(map(len, rows)) + rng.randint(0, 3))
        if rng.random() < 0.2:
            mask = None  # the padding is text
    return ids, mask, inputs, broke, left_open and packed


def outcome(call, *args, **kwargs):
    """What a call gives: its results, or the type of its error."""
    try:
        return call(*args, **kwargs)
    except Exception as error:  # both kernels must refuse alike
        return type(error)


@pytest.mark.parametrize("loops", [True, False], ids=["compiled loops", "numpy"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_videos_between_markers_are_placed_as_the_runs_kernel_places_them(loops, packed, monkeypatch):
    if loops and compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    items, runs = ItemKernel(glm_layout(), KEYS), runs_kernel()
    rng = random.Random(f"markers {packed}")
    seen = {"placed": 0, "refused": 0, "videos": 0, "left open": 0}
    for index in range(400):
        ids, mask, inputs, broke, left_open = random_batch(rng, packed)
        want = outcome(runs.rope_index, ids, mask, **inputs)
        found = outcome(items.rope_index, ids, mask, **inputs)
        if isinstance(want, type):
            assert want is PlaceholderMismatchError and found is PlaceholderMismatchError, f"batch {index}"
            seen["refused"] += 1
            continue
        assert not isinstance(found, type), f"batch {index}: refused what the runs kernel places"
        assert torch.equal(found[0], want[0]) and torch.equal(found[1], want[1]), f"batch {index}"
        text_row = items.position_ids(ids, mask, **inputs)
        assert torch.equal(text_row, runs.position_ids(ids, mask, **inputs)), f"batch {index}"
        seen["placed"] += 1
        seen["videos"] += "video_grid_thw" in inputs and not broke
        seen["left open"] += left_open
    assert seen["placed"] > 150 and seen["refused"] > 50 and seen["videos"] > 100
    assert seen["left open"] > 10 or not packed


@compiled_only
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_compiled_loops_read_markers_as_numpy_does(packed):
    kernel = ItemKernel(glm_layout(), KEYS)
    rng = random.Random(f"markers read {packed}")
    for index in range(300):
        ids, mask, inputs, _, _ = random_batch(rng, packed)
        cu_seqlens = inputs.pop("cu_seqlens", None)
        first, count = packed_segments(cu_seqlens, tuple(ids.shape), None) if packed else (None, None)
        call = (ids.numpy(), None if mask is None else mask.bool().numpy(), first, count, *kernel.media_arrays(inputs),
                kernel.layout.enabled())
        loops_found = kernel.layout.find(*call)
        with compiled.switched_off():
            assert kernel.layout.find(*call) == loops_found, f"batch {index}"


@pytest.mark.parametrize("loops", [True, False], ids=["compiled loops", "numpy"])
def test_a_marker_opens_videos_only_after_it_in_its_sample(loops, monkeypatch):
    if loops and compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    layout = glm_layout()
    image, video = np.array([[1, 2, 2]]), np.array([[2, 2, 2]])

    def found(ids, images, videos, first=None, count=None):
        found = layout.find(np.array([ids]), None, first, count, (images, videos), (None, None), layout.enabled())
        return [(item.sample, item.start, layout.kinds[item.kind].name) for item in found.items] or found.status

    # markers count on from the sample's first token: an end before a begin cancels it; two begins need two ends
    assert found([END, BEGIN, IMAGE, BEGIN, IMAGE, IMAGE, END], image, video) == [(0, 2, "image"), (0, 4, "video")]
    assert found([BEGIN, BEGIN, 5, END, IMAGE, IMAGE, END, IMAGE], image, video) == [(0, 4, "video"),
                                                                                     (0, 7, "image")]
    # a packed segment that leaves its marker open does not open the next one's videos
    assert found([BEGIN, IMAGE, IMAGE, IMAGE], image, video, np.array([0, 3]), np.array([3, 1])) == [
        (0, 1, "video"), (1, 0, "image")]
    assert found([BEGIN, IMAGE, IMAGE, BEGIN], None, np.concatenate([video, video]), np.array([0, 3]),
                 np.array([3, 1])) == MISMATCH  # one video, and a sample of a marker alone


def test_a_refusal_names_the_markers_a_kind_opens_between():
    layout = glm_layout(kinds=glm_layout().kinds[:1])  # videos only
    found = layout.refusal(np.array([[5, END, IMAGE, BEGIN, IMAGE, IMAGE, END]]), None, None, None,
                           (None, np.array([[2, 2, 2]])), (None, None), layout.enabled())
    assert (found.status, found.sample, found.token) == (MISMATCH, 0, 2)
    assert (f"token 2 is a placeholder outside any item (a video opens only where more {BEGIN} than {END} markers "
            f"precede it in its sample; 0 and 1 do here)") in found.message
    with pytest.raises(PlaceholderMismatchError, match="video at token 2: takes video 1 of the batch, but 1 video"):
        ItemKernel(glm_layout(), KEYS).rope_index(torch.tensor([[BEGIN, IMAGE, IMAGE, 5, IMAGE, IMAGE, END]]),
                                                  video_grid_thw=torch.tensor([[1, 2, 2]]))


@pytest.mark.parametrize("build, message", [
    (lambda: ItemKind("v", (IMAGE,), ("video",), (IMAGE,), inside=(BEGIN, BEGIN)), "two distinct text tokens"),
    (lambda: ItemKind("v", (IMAGE,), ("video",), (IMAGE,), inside=(BEGIN,)), "inside must be a tuple of 2 to 2"),
    (lambda: ItemKind("v", (IMAGE,), ("video",), (IMAGE,), inside=(IMAGE, END)), "none of its key, placeholders"),
    (lambda: ItemKind("v", (IMAGE,), ("video",), (IMAGE,), inside=[BEGIN, END]), "inside must be a tuple"),
    (lambda: glm_layout(kinds=(*glm_layout().kinds, ItemKind("clip", (END,), ("image",), (7,)))),
     "inside markers .* must be text, not a token of any kind's items"),
])
def test_markers_are_checked_when_a_kind_is_built(build, message):
    with pytest.raises(ValueError, match=message):
        build()
