"""Media items placed by a layout given as data (``mmrope_core.items``): the compiled primitives
and their numpy counterparts on generated layouts and batches (valid, corrupted, padded on either
side, with holes, packed), to the bit; what each status means; the kernel built on a layout."""

import contextlib
import dataclasses
import random

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, PlaceholderMismatchError, SegmentCutError, compiled
from mmrope_core.items import (
    BAD_MEDIA,
    EMPTY_SAMPLE,
    MISMATCH,
    PADDING_INSIDE,
    PLACED,
    GridMedia,
    ItemKernel,
    ItemKind,
    ItemLayout,
    SequenceMedia,
    TemporalRule,
)

compiled_only = pytest.mark.mmrope_applies(compiled.native is not None, "the compiled loops")

# markers, placeholders and text: ids the generated layouts use
OPEN_A, OPEN_B, OPEN_C, CLOSE_A, CLOSE_B, CLOSE_C = 901, 902, 903, 904, 905, 906
IMAGE, VIDEO, AUDIO = 911, 912, 913
TEXT = tuple(range(1, 9))
AUDIO_RULES = [((), 0, 0), (((1, 2), (2, 2)), 0, 0), (((1, 2), (1, 2), (1, 2)), 20, 13), (((0, 3),), 7, 2)]
SECONDS = (0.0, 0.04, 0.5, 1 / 3, 1.0, 1.3, 2.5, 4.7)


def random_layout(rng):
    """A layout of images, audios, silent videos and videos with their audio, placed by rules
    drawn at random."""
    merge = rng.choice((1, 2))
    steps, window, per_window = rng.choice(AUDIO_RULES)
    float32 = rng.random() < 0.5

    def placing():
        return {"markers": rng.choice(("count", "share")), "resume": rng.choice(("largest", "last"))}

    interleave = rng.choice(("time", "chunks", "groups"))
    pair_key = rng.choice(((OPEN_A, OPEN_B), (OPEN_C,)))
    kinds = [
        ItemKind("image", (OPEN_A, IMAGE), ("image",), (IMAGE,), (CLOSE_A,), **placing()),
        ItemKind("audio", (OPEN_B, AUDIO), ("audio",), (AUDIO,), (CLOSE_B,), **placing()),
        ItemKind("video", (OPEN_A, VIDEO), ("video",), (VIDEO,), rng.choice(((CLOSE_A,), ())), **placing()),
        ItemKind("video with its audio", pair_key, ("video", "audio"), (VIDEO, AUDIO),
                 rng.choice(((CLOSE_B, CLOSE_A), (CLOSE_C,))), begins_with=rng.choice((None, VIDEO)),
                 lead=rng.randint(0, len(pair_key)), interleave=interleave,
                 chunk=0 if interleave == "time" else rng.randint(1, 30), **placing()),
    ]
    rng.shuffle(kinds)
    layout = ItemLayout(
        media=(GridMedia("image", merge), GridMedia("video", merge, timed=True),
               SequenceMedia("audio", steps, window, per_window)),
        kinds=tuple(kinds),
        temporal=TemporalRule(rng.choice((0.0, 0.5, 1.0, 2.0, 13.0, 25.0, 2.7)),
                              rng.choice(("frame_first", "scale_first")), rng.choice(("float32", "float64")),
                              truncate=not float32 or rng.random() < 0.5),
        dtype=torch.float32 if float32 else torch.int64, padding=rng.choice((0, 1)),
        padding_in_largest=rng.random() < 0.3, text_only=rng.random() < 0.15, empty_samples=rng.random() < 0.5,
        exclusive=(("audio", "video with its audio"),) if rng.random() < 0.3 else ())
    return layout, merge


def random_rows(rng, layout, merge, media):
    """Rows of text and items as the layout reads them; their media appended to ``media``."""
    kinds = {kind.name: kind for kind in layout.kinds}
    audio = layout.media[2]
    rows = []
    for _ in range(rng.randint(1, 5)):
        row = [rng.choice(TEXT) for _ in range(rng.randint(0, 4))]
        for _ in range(rng.randint(0, 4)):
            kind = kinds[rng.choice(list(kinds))]
            content = []
            for name, placeholder in zip(kind.media, kind.placeholders):
                if name == "audio":
                    length = rng.randint(1, 200)
                    while int(audio.tokens(np.int64(length))) < 1:
                        length = rng.randint(1, 200)
                    media["audio"].append(length)
                    content += [placeholder] * int(audio.tokens(np.int64(length)))
                else:
                    grid = (rng.randint(1, 4) if name == "video" else 1, merge * rng.randint(1, 3),
                            merge * rng.randint(1, 3))
                    media[name].append(grid)
                    if name == "video":
                        media["seconds"].append(rng.choice(SECONDS) if rng.random() < 0.8 else rng.uniform(0, 3))
                    content += [placeholder] * (grid[0] * grid[1] * grid[2] // merge**2)
            head, tail = content[:1], content[1:]
            rng.shuffle(tail)  # any order inside an item; the first stays
            row += list(kind.key[: kind.opening]) + head + tail + list(kind.closing)
            row += [rng.choice(TEXT) for _ in range(rng.randint(0, 3))]
        rows.append(row)
    return rows


def corrupted(rng, rows, media):
    """A mistake a trainer's data makes: a token dropped or changed, a stray marker, media left over."""
    what = rng.choice(("drop", "change", "stray", "extra grid", "no grid", "bad grid", "bad seconds", "long audio"))
    row = rng.choice(rows)
    if what == "drop" and row:
        del row[rng.randrange(len(row))]
    elif what == "change" and row:
        row[rng.randrange(len(row))] = rng.choice((IMAGE, VIDEO, AUDIO, CLOSE_A, 5))
    elif what == "stray":
        row.insert(rng.randint(0, len(row)), rng.choice((OPEN_A, OPEN_B, OPEN_C, CLOSE_A, IMAGE)))
    elif what == "extra grid":
        media["image"].append((1, 2, 2))
    elif what == "no grid" and media["video"]:
        media["video"].pop()
        media["seconds"].pop()
    elif what == "bad grid" and media["image"]:
        media["image"][0] = (1, 3, 5)
    elif what == "bad seconds" and media["seconds"]:
        media["seconds"][0] = rng.choice((float("nan"), -1.0, 2.0**30))
    elif what == "long audio" and media["audio"]:
        media["audio"][0] = rng.choice((2**60, -3))


def as_call(rng, layout, rows, media, packed, holes=True):
    """The arguments of ``ItemLayout.place`` for the rows: one a row (padded on either side,
    with holes, or no mask) or packed back to back in one row."""
    if packed:
        flat = [token for row in rows for token in row]
        ids = np.array([flat or [1]], dtype=np.int64)
        count = np.array([len(row) for row in rows] if flat else [1], dtype=np.int64)
        first = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        mask = None
    else:
        length = max(map(len, rows)) + rng.randint(0, 3) or 1
        ids = np.full((len(rows), length), 7, dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=bool)
        left = rng.random() < 0.5
        for index, row in enumerate(rows):
            at = length - len(row) if left else 0
            ids[index, at : at + len(row)] = row
            mask[index, at : at + len(row)] = True
        if holes and rng.random() < 0.1:
            b, column = rng.randrange(len(rows)), rng.randrange(length)
            mask[b, column] = False  # padding inside, maybe
        first = count = None
        if holes and rng.random() < 0.15:
            mask = None
    grids = [np.array(media[name], dtype=np.int64).reshape(-1, 3) if media[name] else None for name in ("image", "video")]
    lengths = np.array(media["audio"], dtype=np.int64) if media["audio"] else None
    seconds = np.array(media["seconds"], dtype=np.float32) if grids[1] is not None else None
    if seconds is not None and seconds.size != len(grids[1]):
        seconds = np.resize(seconds, len(grids[1])).astype(np.float32)
    return ids, mask, first, count, (grids[0], grids[1], lengths), (None, seconds, None)


def placed(layout, ids, mask, first, count, media, seconds, enabled, text_row, threads=1, loops=True):
    """Status, positions and deltas of ``layout.place``, with or without the compiled loops."""
    rows = 4 if text_row else 3
    samples = ids.shape[0] if first is None else first.size
    dtype = np.float32 if layout.float32 else np.int64
    out = np.full((ids.shape[0], 4, ids.shape[1]) if text_row else (rows, *ids.shape), -7, dtype=dtype)
    deltas = np.full((samples, 1), -7, dtype=dtype)
    with contextlib.nullcontext() if loops else compiled.switched_off():
        status = layout.place(out, text_row, ids, mask, first, count, media, seconds, deltas, enabled, threads)
    return status, out, deltas


def bits(array):
    return array.view(np.uint8)


@compiled_only
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("text_row", [False, True])
def test_the_compiled_loops_place_as_numpy_does(packed, text_row):
    rng = random.Random(f"items {packed} {text_row}")
    statuses = set()
    for index in range(300):
        layout, merge = random_layout(rng)
        media = {"image": [], "video": [], "audio": [], "seconds": []}
        rows = random_rows(rng, layout, merge, media)
        if rng.random() < 0.4:
            corrupted(rng, rows, media)
        call = as_call(rng, layout, rows, media, packed)
        enabled = layout.enabled() if rng.random() < 0.8 else rng.randrange(16)
        status, out, deltas = placed(layout, *call, enabled, text_row)
        want_status, want, want_deltas = placed(layout, *call, enabled, text_row, loops=False)
        assert status == want_status, f"batch {index}"
        statuses.add(status)
        if status == PLACED:
            assert np.array_equal(bits(out), bits(want)) and np.array_equal(bits(deltas), bits(want_deltas)), index
        loops_found = layout.find(*call, enabled)
        with compiled.switched_off():
            assert layout.find(*call, enabled) == loops_found, f"batch {index}"
    assert statuses >= {PLACED, MISMATCH, BAD_MEDIA} | ({PADDING_INSIDE} if not packed else set())


@compiled_only
def test_rows_shared_among_threads_are_placed_as_by_one():
    rng = random.Random("items threads")
    layout, merge = random_layout(rng)
    layout = layout.replace(text_only=False, exclusive=(), empty_samples=True)
    media = {"image": [], "video": [], "audio": [], "seconds": []}
    rows = []
    while sum(map(len, rows)) < 400_000:
        rows += random_rows(rng, layout, merge, media)
    call = as_call(random.Random(0), layout, rows, media, packed=False, holes=False)
    one = placed(layout, *call, layout.enabled(), False, threads=1)
    assert one[0] == PLACED
    for threads in (2, 3, 8):
        many = placed(layout, *call, layout.enabled(), False, threads=threads)
        assert many[0] == PLACED and np.array_equal(bits(many[1]), bits(one[1])) and np.array_equal(many[2], one[2])


def small_layout(**changes):
    """Images between two markers, 2 x 2 merged."""
    kind = ItemKind("image", (OPEN_A, IMAGE), ("image",), (IMAGE,), (CLOSE_A,))
    return ItemLayout(**{"media": (GridMedia("image", 2),), "kinds": (kind,), **changes})


@pytest.mark.parametrize("loops", [True, False])
def test_each_status_says_what_keeps_a_batch_from_being_placed(loops):
    if loops and compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    layout = small_layout()
    image = np.array([[5, OPEN_A, IMAGE, CLOSE_A, 6]], dtype=np.int64)
    grid = (np.array([[1, 2, 2]], dtype=np.int64),)

    def status(ids, mask=None, grid=grid, empty=False):
        chosen = layout.replace(empty_samples=empty)
        return placed(chosen, ids, mask, None, None, grid, (None,), 1, False, loops=loops)

    written, out, deltas = status(image)
    assert written == PLACED
    assert out[:, 0].tolist() == [[0, 1, 2, 3, 4]] * 3 and deltas.tolist() == [[0]]
    assert status(image, grid=(np.array([[1, 4, 4]], dtype=np.int64),))[0] == MISMATCH  # 4 tokens, 1 given
    assert status(image, grid=(np.array([[1, 3, 2]], dtype=np.int64),))[0] == BAD_MEDIA  # not divisible
    assert status(image, grid=(None,))[0] == MISMATCH  # an image without its grid
    assert status(np.array([[5, IMAGE, 6]]), grid=(None,))[0] == MISMATCH  # a placeholder outside an item
    holes = np.array([[True, False, True, True, True]])
    assert status(image, holes)[0] == PADDING_INSIDE
    empty = np.array([[True] * 5, [False] * 5])
    assert status(np.repeat(image, 2, axis=0), empty, grid=(np.repeat(grid[0], 1, axis=0),))[0] == EMPTY_SAMPLE
    assert status(np.repeat(image, 2, axis=0), empty, empty=True)[0] == PLACED
    with pytest.raises(ValueError, match="sizes do not fit"):
        status(image, np.ones((1, 4), dtype=bool))


def test_a_refusal_says_where_and_what():
    layout = small_layout()
    grid = (np.array([[1, 4, 4]], dtype=np.int64),)
    found = layout.refusal(np.array([[5, OPEN_A, IMAGE, IMAGE, CLOSE_A]]), None, None, None, grid, (None,), 1)
    assert (found.status, found.sample, found.token) == (MISMATCH, 0, 1)
    assert "sample 0, image at token 1: needs 6 tokens, but the sample ends 4 tokens on" in found.message
    found = layout.refusal(np.array([[OPEN_A, IMAGE, CLOSE_A, IMAGE]]), None, None, None,
                           (np.array([[1, 2, 2]]),), (None,), 1)
    assert (found.status, found.token) == (MISMATCH, 3) and "placeholder outside any item" in found.message
    found = layout.refusal(np.array([[5, 6]]), None, None, None, (np.array([[1, 2, 2]]),), (None,), 1)
    assert found.sample == 1 and "gives 1 image but its samples hold 0" in found.message


@pytest.mark.parametrize("changes, message", [
    ({"kinds": (ItemKind("x", (1,), ("nothing",), (2,)),)}, "no medium is called 'nothing'"),
    ({"dtype": torch.int32}, "dtype must be torch.int64 or torch.float32"),
    ({"temporal": TemporalRule(truncate=False)}, "int64 positions need truncated temporal ids"),
    ({"exclusive": (("image", "sound"),)}, "pairs of kind names"),
])
def test_a_layout_checks_itself(changes, message):
    with pytest.raises(ValueError, match=message):
        small_layout(**changes)


@pytest.mark.parametrize("build, message", [
    (lambda: ItemKind("x", (1, 2), ("a", "b"), (3, 4)), "two media are interleaved"),
    (lambda: ItemKind("x", (1, 2), ("a",), (3,), lead=3), "lead must be an int from 0 to its 2 opening markers"),
    (lambda: ItemKind("x", (), ("a",), (3,)), "key must be a tuple of 1 to 4"),
    (lambda: SequenceMedia("a", steps=((1, 0),)), "stride from 1"),
    (lambda: GridMedia("a", merge=0), "merge must be an int"),
    (lambda: TemporalRule(-1.0), "not negative"),
])
def test_its_parts_check_themselves(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def clip_kernel():
    """A kernel of clips: a video and its audio between two markers, merged by time."""
    layout = ItemLayout(
        media=(GridMedia("video", 2, timed=True), SequenceMedia("audio")),
        kinds=(ItemKind("clip", (OPEN_C,), ("video", "audio"), (VIDEO, AUDIO), (CLOSE_C,), interleave="time"),),
        temporal=TemporalRule(2.0))
    return ItemKernel(layout, {"video": ("video_grid_thw", "second_per_grids"), "audio": "audio_seqlens"})


def clip(frames, audio):
    return [OPEN_C] + [VIDEO] * frames + [AUDIO] * audio + [CLOSE_C]


@pytest.mark.parametrize("loops", [True, False])
def test_a_kernel_of_a_layout_places_every_layout_the_engine_hands_it(loops, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    kernel = clip_kernel()
    samples = [[5, 6, *clip(2, 3), 7], [*clip(1, 4), 8, *clip(3, 1)]]
    media = {"video_grid_thw": torch.tensor([[2, 2, 2], [1, 2, 2], [3, 2, 2]]),
             "second_per_grids": torch.tensor([1.0, 0.5, 2.0]), "audio_seqlens": torch.tensor([3, 4, 1])}
    alone = []
    videos = iter(media["video_grid_thw"].split(1))
    seconds, audio = iter(media["second_per_grids"].split(1)), iter(media["audio_seqlens"].split(1))
    for row in samples:
        items = row.count(OPEN_C)
        one = {"video_grid_thw": torch.cat([next(videos) for _ in range(items)]),
               "second_per_grids": torch.cat([next(seconds) for _ in range(items)]),
               "audio_seqlens": torch.cat([next(audio) for _ in range(items)])}
        alone.append(kernel.rope_index(torch.tensor([row]), **one))
    # text, a clip's start marker, frame 0 at 3 with the audio at 3, 4 (time 0 on the frame first), frame 1
    # at 3 + 2 = 5 after the audio's 3 and 4; 5 then 6 for the audio's last and the end marker
    assert alone[0][0][0, 0].tolist() == [0, 1, 2, 3, 3, 4, 5, 5, 6, 7]
    length = max(map(len, samples)) + 2
    ids = torch.zeros(2, length, dtype=torch.long)
    mask = torch.zeros(2, length, dtype=torch.long)
    for index, row in enumerate(samples):
        ids[index, length - len(row):] = torch.tensor(row)
        mask[index, length - len(row):] = 1
    positions, deltas = kernel.rope_index(ids, mask, **media)
    four = kernel.position_ids(ids, mask, **media)
    packed, packed_deltas = kernel.rope_index(torch.tensor([samples[0] + samples[1]]),
                                              cu_seqlens=torch.tensor([0, len(samples[0]), sum(map(len, samples))]),
                                              **media)
    for index, row in enumerate(samples):
        want, want_delta = alone[index]
        assert torch.equal(positions[:, index, length - len(row):], want[:, 0])
        assert torch.equal(four[index, 1:, length - len(row):], want[:, 0])
        assert torch.equal(four[index, 0, length - len(row):], torch.arange(len(row)))
        assert torch.equal(deltas[index], want_delta[0]) and torch.equal(packed_deltas[index], want_delta[0])
    assert torch.equal(packed[:, 0], torch.cat([alone[0][0][:, 0], alone[1][0][:, 0]], dim=1))
    holes = mask.clone()
    holes[0, length - len(samples[0]) + 1] = 0  # padding inside a sample: placed without that token (text)
    rows = kernel.rope_index(ids, holes, **media)[0]
    kept = torch.tensor([samples[0][0], *samples[0][2:]])
    assert torch.equal(rows[:, 0, holes[0].bool()], kernel.rope_index(kept[None], **alone_media(media))[0][:, 0])
    with pytest.raises(SegmentCutError, match="segment 1 starts inside"):
        kernel.rope_index(torch.tensor([samples[0] + samples[1]]), cu_seqlens=torch.tensor([0, 5, 24]), **media)
    with pytest.raises(PlaceholderMismatchError, match="clip at token 2: its video needs 2 placeholder tokens, found 1"):
        kernel.rope_index(torch.tensor([[5, 6, *clip(1, 4), 7]]), **alone_media(media))
    with pytest.raises(InvalidInputError, match="videos need second_per_grids"):
        kernel.rope_index(ids, mask, video_grid_thw=media["video_grid_thw"], audio_seqlens=media["audio_seqlens"])
    with pytest.raises(InvalidInputError, match="get_rope_index got 'image_grid_thw', which this kernel does not"):
        kernel.rope_index(ids, mask, image_grid_thw=None, **media)


def alone_media(media):
    """The media of the first sample, a clip."""
    return {key: value[:1] for key, value in media.items()}


def test_a_layout_pickles_without_its_compiled_form():
    import pickle

    layout = small_layout()
    ids = np.array([[OPEN_A, IMAGE, CLOSE_A]])
    assert placed(layout, ids, None, None, None, (np.array([[1, 2, 2]]),), (None,), 1, False)[0] == PLACED
    again = pickle.loads(pickle.dumps(layout))
    assert again == layout and dataclasses.replace(layout) == layout
    assert placed(again, ids, None, None, None, (np.array([[1, 2, 2]]),), (None,), 1, False)[0] == PLACED
