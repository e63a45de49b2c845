"""Grids whose frames carry their own time stamps (``GridMedia(stamped=True)``): positions against
a reference written token by token here, on generated batches (many items, padded on either
side, packed rows, a sequence merged by time), the compiled loops against numpy, and the typed
errors for stamps that cannot be placed."""

import math
import random

import numpy as np
import pytest
import torch

from mmrope_core import InvalidInputError, compiled
from mmrope_core.batching import BatchLayout, MediaKey
from mmrope_core.items import (
    BAD_MEDIA,
    PLACED,
    GridMedia,
    ItemKernel,
    ItemKind,
    ItemLayout,
    SequenceMedia,
    TemporalRule,
)
from mmrope_core.media import read_media

compiled_only = pytest.mark.mmrope_applies(compiled.native is not None, "the compiled loops")

OPEN, CLOSE, OPEN_CLIP, CLOSE_CLIP, PANEL, SOUND = 901, 902, 903, 904, 911, 912
TEXT = tuple(range(1, 9))
MERGE = 2
KEYS = {"panels": ("panel_grid_thw", "panel_times"), "sound": "sound_lengths"}
GAPS = (0.0, 0.0, 0.25, 1 / 3, 0.5, 0.7, 1.0, 1.3, 2.0, 4.7)


def stamped_kernel(rule, **options):
    """Panels alone, or panels with a sound merged by time, each between two markers."""
    layout = ItemLayout(
        media=(GridMedia("panels", MERGE, stamped=True), SequenceMedia("sound")),
        kinds=(ItemKind("panels", (OPEN,), ("panels",), (PANEL,), (CLOSE,)),
               ItemKind("clip", (OPEN_CLIP,), ("panels", "sound"), (PANEL, SOUND), (CLOSE_CLIP,), interleave="time")),
        temporal=rule, padding=options.pop("padding", 0), dtype=options.pop("dtype", torch.int64))
    return ItemKernel(layout, KEYS, **options)


def frame_time(rule, stamp):
    """A stamped frame's temporal id: the rule applied to its stamp as to ``frame * seconds``."""
    if rule.precision == "float32":
        return math.trunc(float(np.float32(stamp) * np.float32(rule.per_second)))
    return math.trunc(float(np.float32(stamp)) * rule.per_second)


def reference_sample(rng, rule):
    """One sample's tokens and positions, token by token, and its media: text counts on; an
    item's marker, then its panels frame by frame at (start + time, start + line, start + column)
    (a clip's sound token i at start + i, before each frame whose time it precedes), then its end
    marker one past the largest position, and text on from there."""
    tokens, positions, grids, stamps, sounds = [], [], [], [], []
    cursor = 0

    def text(count):
        nonlocal cursor
        for _ in range(count):
            tokens.append(rng.choice(TEXT))
            positions.append((cursor,) * 3)
            cursor += 1

    for _ in range(rng.randint(0, 4)):
        text(rng.randint(0, 3))
        frames, lines, columns = rng.randint(1, 4), rng.randint(1, 2), rng.randint(1, 2)
        times = list(np.cumsum([rng.choice(GAPS) if rng.random() < 0.8 else rng.uniform(0, 6) for _ in range(frames)]))
        times = [float(np.float32(value)) for value in times]
        grids.append((frames, MERGE * lines, MERGE * columns))
        stamps += times
        clip = rng.random() < 0.5
        tokens.append(OPEN_CLIP if clip else OPEN)
        positions.append((cursor,) * 3)
        start = cursor + 1
        block = []
        heard, sound = 0, rng.randint(1, 8) if clip else 0
        for stamp in times:
            time = start + frame_time(rule, stamp)
            while heard < sound and start + heard < time:
                block.append((SOUND, (start + heard,) * 3))
                heard += 1
            block += [(PANEL, (time, start + line, start + column)) for line in range(lines) for column in range(columns)]
        block += [(SOUND, (start + index,) * 3) for index in range(heard, sound)]
        if clip:
            sounds.append(sound)
        tokens += [token for token, _ in block]
        positions += [position for _, position in block]
        largest = max(max(position) for _, position in block)
        tokens.append(CLOSE_CLIP if clip else CLOSE)
        positions.append((largest + 1,) * 3)
        cursor = largest + 2
    text(rng.randint(0 if tokens else 1, 3))
    delta = max(max(position) for position in positions) + 1 - len(tokens)
    return tokens, positions, delta, grids, stamps, sounds


def batch_media(samples):
    grids = [grid for sample in samples for grid in sample[3]]
    return {"panel_grid_thw": torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
            "panel_times": torch.tensor([stamp for sample in samples for stamp in sample[4]], dtype=torch.float32),
            "sound_lengths": torch.tensor([sound for sample in samples for sound in sample[5]], dtype=torch.long)}


RULES = [TemporalRule(2.0), TemporalRule(25.0, "frame_first", "float32"), TemporalRule(0.5, "scale_first", "float32"),
         TemporalRule(13.0, "frame_first", "float64"), TemporalRule(2.7)]


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_stamped_frames_are_placed_as_the_reference_places_them(loops, seed, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    elif compiled.native is None:
        pytest.skip("the compiled loops are not loaded")
    rng = random.Random(seed)
    rule = RULES[seed % len(RULES)]
    kernel = stamped_kernel(rule)
    samples = [reference_sample(rng, rule) for _ in range(rng.randint(1, 6))]
    media = batch_media(samples)
    length = max(len(sample[0]) for sample in samples) + rng.randint(0, 3)
    for side in ("left", "right"):
        ids = torch.zeros(len(samples), length, dtype=torch.long)
        mask = torch.zeros_like(ids)
        want = torch.zeros(3, len(samples), length, dtype=torch.long)
        for row, (tokens, positions, *_) in enumerate(samples):
            span = slice(length - len(tokens), length) if side == "left" else slice(0, len(tokens))
            ids[row, span], mask[row, span] = torch.tensor(tokens), 1
            want[:, row, span] = torch.tensor(positions).t()
        got, deltas = kernel.rope_index(ids, mask, **media)
        assert torch.equal(got, want), side
        assert deltas[:, 0].tolist() == [sample[2] for sample in samples]
        four = kernel.position_ids(ids, mask, **media)
        assert torch.equal(four[:, 1:], want.transpose(0, 1))
        assert torch.equal(four[:, 0], torch.where(mask.bool(), mask.cumsum(1) - 1, 1))
    row = torch.tensor([[token for sample in samples for token in sample[0]]])
    bounds = torch.tensor([0, *np.cumsum([len(sample[0]) for sample in samples])])
    packed, packed_deltas = kernel.rope_index(row, cu_seqlens=bounds, **media)
    assert torch.equal(packed[:, 0], torch.cat([torch.tensor(sample[1]).t() for sample in samples], dim=1))
    assert packed_deltas[:, 0].tolist() == [sample[2] for sample in samples]


@compiled_only
@pytest.mark.parametrize("interleave", ["time", "chunks", "groups"])
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_loops_place_stamped_frames_as_numpy_does(seed, interleave):
    """Generated batches, some with stamps corrupted, in int64 with runs of generated tokens
    decoded, or in float32 keeping fractions; sounds merged by time, chunks or groups."""
    rng = random.Random(f"{seed} {interleave}")
    float32 = seed % 2 == 1
    rule = RULES[seed % len(RULES)]
    rule = TemporalRule(rule.per_second * 1.37, rule.order, rule.precision, truncate=False) if float32 else rule
    samples = [reference_sample(rng, rule) for _ in range(rng.randint(1, 5))]
    media = batch_media(samples)
    layout = stamped_kernel(rule, dtype=torch.float32 if float32 else torch.int64).layout
    clip = ItemKind("clip", (OPEN_CLIP,), ("panels", "sound"), (PANEL, SOUND), (CLOSE_CLIP,), interleave=interleave,
                    chunk=0 if interleave == "time" else rng.randint(1, 5))
    layout = layout.replace(kinds=(layout.kinds[0], clip))
    length = max(len(sample[0]) for sample in samples)
    ids = np.zeros((len(samples), length), np.int64)
    mask = np.zeros_like(ids, dtype=bool)
    for row, sample in enumerate(samples):
        ids[row, : len(sample[0])], mask[row, : len(sample[0])] = sample[0], True
    generated = None if float32 else mask & (np.arange(length) >= np.maximum(mask.sum(1, keepdims=True) - 2, 1))
    dtype = np.float32 if float32 else np.int64
    stamps = media["panel_times"].numpy()
    for corrupt in (None, -1.0, np.nan, np.inf, "fall"):
        given, frames = stamps.copy(), media["panel_grid_thw"][:, 0].tolist()
        long = [sum(frames[:grid]) for grid in range(len(frames)) if frames[grid] > 1]
        if corrupt == "fall" and long:  # a grid's second frame before its first
            given[long[0]], given[long[0] + 1] = 1.0, 0.5
        elif corrupt != "fall" and corrupt is not None and given.size:
            given[rng.randrange(given.size)] = corrupt
        refused = not np.array_equal(given, stamps, equal_nan=True)
        results = []
        for native in (compiled.native, None):
            out, deltas = np.empty((3, *ids.shape), dtype), np.empty((len(samples), 1), dtype)
            arguments = (out, False, ids, mask, None, None, (media["panel_grid_thw"].numpy(),
                         media["sound_lengths"].numpy()), (given, None), deltas, layout.enabled())
            saved, compiled.native = compiled.native, native
            try:
                status = layout.place(*arguments, generated=generated)
            finally:
                compiled.native = saved
            results.append((status, out if status == PLACED else None, deltas if status == PLACED else None))
        assert results[0][0] == results[1][0] == (BAD_MEDIA if refused else PLACED)
        if results[0][0] == PLACED:
            assert np.array_equal(results[0][1], results[1][1]) and np.array_equal(results[0][2], results[1][2])


def clips():
    """Two panels items: three frames, then two."""
    ids = torch.tensor([[5, OPEN, PANEL, PANEL, PANEL, CLOSE, OPEN, PANEL, PANEL, CLOSE]])
    return ids, {"panel_grid_thw": torch.tensor([[3, 2, 2], [2, 2, 2]]),
                 "panel_times": torch.tensor([0.0, 0.5, 2.0, 0.0, 1.0])}


@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize(("stamps", "message"), [
    ([0.0, 0.5, 2.0, 0.0], "panel_times has 4 time stamps for the 5 frames of the 2 grids of panel_grid_thw"),
    ([0.0, 0.5, 2.0, -1.0, 1.0], r"panel_times \(grid 1 of panel_grid_thw, frame 0\): the time stamp -1.0 is negative"),
    ([0.0, 0.5, 0.25, 0.0, 1.0], r"\(grid 0 of panel_grid_thw, frame 2\): the time stamp 0.25 comes before the frame"),
    ([0.0, float("nan"), 2.0, 0.0, 1.0], r"\(grid 0 of panel_grid_thw, frame 1\): the time stamp nan is not finite"),
    ([0.0, 0.5, 2.0, 0.0, 2.0**21], r"\(grid 1 of panel_grid_thw, frame 1\).*lies beyond 1.04858e\+06 seconds"),
    (torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool), "panel_times must hold real numbers"),
    (torch.zeros(5, dtype=torch.complex64), "panel_times must hold real numbers"),
    ("0.5", "panel_times must be a tensor or list of time stamps"),
])
def test_stamps_that_cannot_be_placed_are_refused_saying_which_and_how(loops, stamps, message, monkeypatch):
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    kernel = stamped_kernel(TemporalRule(2.0))
    ids, media = clips()
    given = stamps if isinstance(stamps, (torch.Tensor, str)) else torch.tensor(stamps)
    with pytest.raises(InvalidInputError, match=message):
        kernel.rope_index(ids, **{**media, "panel_times": given})
    layout = BatchLayout(media={"panel_grid_thw": MediaKey(role="grid"),
                                "panel_times": MediaKey(role="stamps", grid="panel_grid_thw")})
    with pytest.raises(InvalidInputError, match=message):
        read_media({**media, "panel_times": given}, layout.media, tokens=ids.numel())
    unchanged = media["panel_times"].clone()
    kernel.rope_index(ids, **media)
    assert torch.equal(media["panel_times"], unchanged)


def test_stamped_media_declare_their_stamps():
    ids, media = clips()
    with pytest.raises(InvalidInputError, match="the panels medium needs panel_times"):
        stamped_kernel(TemporalRule(2.0)).rope_index(ids, panel_grid_thw=media["panel_grid_thw"])
    with pytest.raises(ValueError, match="and of its time stamps, as a pair"):
        ItemKernel(stamped_kernel(TemporalRule(2.0)).layout, {"panels": "panel_grid_thw", "sound": "sound_lengths"})
    with pytest.raises(ValueError, match=r"timed .* or stamped .* not both"):
        GridMedia("panels", timed=True, stamped=True)
    with pytest.raises(TypeError, match=r"MediaKey\(role='stamps'\) needs grid"):
        MediaKey(role="stamps")
    read = read_media({**media, "panel_times": [0, 0.5, 2, 0, 1]}, {
        "panel_grid_thw": MediaKey(role="grid"), "panel_times": MediaKey(role="stamps", grid="panel_grid_thw")})
    assert read["panel_times"].dtype == torch.float32
    assert stamped_kernel(TemporalRule(2.0)).keys == ("panel_grid_thw", "panel_times", "sound_lengths")


@pytest.mark.parametrize("loops", [True, False])
def test_the_fuzzer_corrupts_declared_stamps_and_each_is_placed_or_refused_typed(loops, monkeypatch):
    from mmrope_core.testing._fuzzer import _RandomChoices
    from mmrope_core.testing._mutations import Case, applicable

    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    ids, media = clips()
    keys = {"panel_grid_thw": MediaKey(role="grid"), "panel_times": MediaKey(role="stamps", grid="panel_grid_thw")}
    mutations = [mutation for mutation in applicable(Case("Panels", "rope_index", ids, None, dict(media), {},
                                                          media=keys)) if mutation.__name__.startswith("_stamps")]
    assert len(mutations) == 2
    choices, kernel, refused = _RandomChoices(random.Random(3)), stamped_kernel(TemporalRule(2.0)), set()
    for _ in range(60):
        case = Case("Panels", "rope_index", ids, None, dict(media), {}, media=keys)
        name = choices.choice(mutations)(case, choices)
        try:
            read_media(case.inputs, keys, tokens=ids.numel())
        except InvalidInputError:
            refused.add(name.split(" ")[-1])
            with pytest.raises(InvalidInputError):  # the kernel refuses it alike
                kernel.rope_index(ids, **case.inputs)
        else:
            kernel.rope_index(ids, **case.inputs)
    assert {"nan", "inf", "-1.0", "str", "complex", "meta"} <= refused, refused


def test_a_padded_batch_shared_out_by_rows_gives_each_row_its_frames_stamps():
    from types import SimpleNamespace

    from mmrope_core import CollateError
    from mmrope_core.integrations._rows import each_row_alone

    kernel = stamped_kernel(TemporalRule(2.0))
    layout = BatchLayout(media={"panel_grid_thw": MediaKey(role="grid", medium="image"),
                                "panel_times": MediaKey(role="stamps", grid="panel_grid_thw"),
                                "sound_lengths": MediaKey(role="audio_lengths")})
    engine = SimpleNamespace(batch_layout=layout, get_rope_index=lambda ids, mask, generated_mask=None, **share:
                             kernel.rope_index(ids, mask, **share))
    ids, media = clips()
    first, second = ids[:, :6], torch.cat([ids[:, :1], ids[:, 6:]], dim=1)
    batch = torch.zeros(2, 6, dtype=torch.long)
    batch[0], batch[1, :5] = first[0], second[0]
    mask = (torch.arange(6) < torch.tensor([[6], [5]])).long()
    positions, deltas = each_row_alone(engine, batch, mask, media, [{"image": 1}, {"image": 1}])
    alone = kernel.rope_index(second, panel_grid_thw=media["panel_grid_thw"][1:], panel_times=media["panel_times"][3:])
    assert torch.equal(positions[:, 1, :5], alone[0][:, 0]) and torch.equal(deltas[1], alone[1][0])
    with pytest.raises(CollateError, match="'panel_times' holds 4 time stamps for the batch's 5 frames"):
        each_row_alone(engine, batch, mask, {**media, "panel_times": media["panel_times"][:4]},
                       [{"image": 1}, {"image": 1}])
