"""The public kernel API for plugin authors: the token types it accepts, and the (B, 4, L) layout
it places in one pass."""

import random

import pytest
import torch

from mmrope_core import InvalidInputError, PlaceholderMismatchError, compiled
from mmrope_core.mrope import MediaGrids, MediaKind, check_placeholders, mrope_position_ids, mrope_positions

GRIDS = {1: MediaGrids(torch.tensor([[1, 4, 4]]))}


def kinds(type_id):
    return (MediaKind(type_id, "image", "<image>", "image_grid_thw"),)


@pytest.mark.parametrize("bad, dtype", [(-1, torch.int64), (128, torch.int64), (255, torch.int16),
                                        (-128, torch.int8), (-1, torch.int8), (300, torch.int32)])
@pytest.mark.parametrize("check", [mrope_positions, check_placeholders])
def test_token_types_outside_0_to_127_are_refused(bad, dtype, check):
    types = torch.zeros(2, 12, dtype=dtype)
    types[1, 3:7] = bad
    mask = torch.ones(2, 12, dtype=torch.bool)
    with pytest.raises(InvalidInputError, match=f"0 for text and 1 to 127 .* found {bad}"):
        check(types, mask, kinds(1), GRIDS, spatial_merge_size=2)


@pytest.mark.parametrize("mask", [None, torch.tensor([[False, True, True, True, True, True, True, True, True]])])
def test_media_type_127_is_placed_like_any_other(mask):
    types = torch.zeros(1, 9, dtype=torch.int8)
    types[0, 3:7] = 1
    as_one = mrope_positions(types, mask, kinds(1), GRIDS, spatial_merge_size=2)
    as_127 = mrope_positions(types * 127, mask, kinds(127), {127: GRIDS[1]}, spatial_merge_size=2)
    assert torch.equal(as_one[0], as_127[0]) and torch.equal(as_one[1], as_127[1])


KINDS = (MediaKind(1, "image", "<image>", "image_grid_thw"), MediaKind(2, "video", "<video>", "video_grid_thw"))


def generated(rng, mask_style):
    """Samples of text, images and videos (scaled temporal ids) padded on one side, media at the
    row edges or not. ``none``: no mask (the padding is text); ``holes``: padding inside samples
    too, and a row of padding alone."""
    rows, grids = [], {1: [], 2: []}
    for _ in range(rng.randint(1, 6)):
        row = [0] * rng.randint(0, 3)
        kinds = [rng.choice((1, 2)) for _ in range(rng.randint(0, 4))]
        for kind, following in zip(kinds, kinds[1:] + [None]):
            grid = (rng.randint(1, 4) if kind == 2 else 1, 2 * rng.randint(1, 4), 2 * rng.randint(1, 4))
            grids[kind].append(grid)
            # runs of one kind need text between them; runs of two kinds may touch
            row += [kind] * (grid[0] * grid[1] * grid[2] // 4) + [0] * rng.randint(kind == following, 3)
        rows.append(row or [0])
    length = max(map(len, rows)) + rng.randint(0, 3)
    types = torch.zeros(len(rows), length, dtype=torch.int64)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    left = rng.random() < 0.5
    for index, row in enumerate(rows):
        span = slice(length - len(row), length) if left else slice(0, len(row))
        types[index, span] = torch.tensor(row)
        mask[index, span] = True
    if mask_style == "none":
        mask = None  # the padding becomes text
    elif mask_style == "holes":
        # each text run keeps its first token, so that runs of one kind stay apart
        text = (types == 0) & mask
        after_text = torch.zeros_like(text)
        after_text[:, 1:] = text[:, 1:] & text[:, :-1]
        coin = torch.rand(types.shape, generator=torch.Generator().manual_seed(rng.randrange(2**31))) < 0.3
        mask = torch.cat([mask & ~(after_text & coin), torch.zeros(1, length, dtype=torch.bool)])
        types = torch.cat([types, torch.zeros(1, length, dtype=types.dtype)])
    media = {kind: MediaGrids(torch.tensor(found)) for kind, found in grids.items() if found}
    if 2 in media:
        media[2] = MediaGrids(media[2].grid, torch.tensor([rng.choice((0.5, 1.0, 1.3, 2.0)) for _ in grids[2]]))
    return types, mask, media


@pytest.mark.parametrize("mask_style", ["padded", "none", "holes"])
def test_position_ids_are_the_text_row_over_the_positions(mask_style):
    """Row 0 counts each sample's valid tokens from 0 and holds 1 at padding; rows 1 to 3 are
    what mrope_positions returns, for every layout of padding."""
    rng = random.Random(mask_style)
    for _ in range(150):
        types, mask, media = generated(rng, mask_style)
        positions, _ = mrope_positions(types, mask, KINDS, media, spatial_merge_size=2)
        layout = mrope_position_ids(types, mask, KINDS, media, spatial_merge_size=2)
        valid = mask if mask is not None else torch.ones(types.shape, dtype=torch.bool)
        text_row = (valid.long().cumsum(1) - 1).masked_fill(~valid, 1)
        assert layout.shape == (types.shape[0], 4, types.shape[1]) and layout.dtype == torch.int64
        assert torch.equal(layout[:, 0], text_row)
        assert torch.equal(layout[:, 1:], positions.transpose(0, 1))


@pytest.mark.parametrize(
    "types, mask, cu_seqlens, error, message",
    [
        (torch.zeros(2, 4, dtype=torch.int8), None, [0, 4], InvalidInputError, r"one packed \(1, L\) row without a mask"),
        (torch.zeros(1, 4, dtype=torch.int8), torch.ones(1, 4, dtype=torch.bool), [0, 4], InvalidInputError, "with a mask"),
        (torch.zeros(1, 4, dtype=torch.int8), None, [0, 3], InvalidInputError, "increase from 0 to the row length 4"),
        (torch.zeros(1, 4, dtype=torch.int8), None, [0, 2, 2, 4], InvalidInputError, "increase from 0"),
        (torch.tensor([[0, 1, 1, 1, 1, 0]], dtype=torch.int8), None, [0, 3, 6], PlaceholderMismatchError,
         r"segment 1 starts inside a placeholder run that segment 0 began \(token 3\)"),
    ],
)
def test_a_packed_row_the_kernel_cannot_place_is_refused(types, mask, cu_seqlens, error, message):
    with pytest.raises(error, match=message):
        mrope_positions(types, mask, kinds(1), GRIDS, spatial_merge_size=2, cu_seqlens=torch.tensor(cu_seqlens))


def test_packed_segments_restart_where_they_lie():
    """Segments back to back in one row, each beginning or ending with a run, equal each alone."""
    image, video = torch.tensor([[1, 4, 4]]), torch.tensor([[2, 2, 4]])
    pieces = [[1] * 4 + [0, 0], [2] * 4, [0] + [1] * 4, [2] * 4 + [0]]  # media of two kinds meet at the last boundary
    grids = {1: MediaGrids(torch.cat([image, image])), 2: MediaGrids(torch.cat([video, video]))}
    row = torch.tensor([[t for piece in pieces for t in piece]], dtype=torch.int8)
    cu_seqlens = torch.tensor([0, *map(len, pieces)]).cumsum(0)
    positions, deltas = mrope_positions(row, None, KINDS, grids, spatial_merge_size=2, cu_seqlens=cu_seqlens)
    alone = [({1: MediaGrids(image)}, None), ({2: MediaGrids(video)}, None), ({1: MediaGrids(image)}, None),
             ({2: MediaGrids(video)}, None)]
    for k, (piece, (piece_grids, _)) in enumerate(zip(pieces, alone)):
        want, want_delta = mrope_positions(torch.tensor([piece], dtype=torch.int8), None, KINDS, piece_grids,
                                           spatial_merge_size=2)
        assert torch.equal(positions[:, 0, int(cu_seqlens[k]) : int(cu_seqlens[k + 1])], want[:, 0]), f"segment {k}"
        assert torch.equal(deltas[k], want_delta[0]), f"segment {k}"


def random_packed_row(rng, count):
    """``count`` segments of :func:`random_segment`, none beginning with a run of the kind the
    previous one ends with, and their grids."""
    segments, grids = [], ([], [], [])
    while len(segments) < count:
        drawn = ([], [], [])
        segment = random_segment(rng, *drawn)
        if not (segments and segments[-1][-1] and segments[-1][-1] == segment[0]):
            segments.append(segment)
            for kept, more in zip(grids, drawn):
                kept += more
    return segments, grids


def random_segment(rng, image_grids, video_grids, scales):
    """Token types of one sample: text and media runs, never two runs of one kind side by side."""
    types, previous = [], 0
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice([0, 1, 2])
        if kind == 0 or kind == previous:
            types += [0] * rng.randint(1, 4)
            kind = 0
        elif kind == 1:
            a, b = rng.randint(1, 3), rng.randint(1, 3)
            image_grids.append((1, 2 * a, 2 * b))
            types += [1] * (a * b)
        else:
            frames, a, b = rng.randint(1, 4), rng.randint(1, 2), rng.randint(1, 2)
            video_grids.append((frames, 2 * a, 2 * b))
            scales.append(rng.choice([0.5, 1.0, 1.3, 2.0]))
            types += [2] * (frames * a * b)
        previous = kind
    return types


def media(image_grids, video_grids, scales):
    grids = {}
    if image_grids:
        grids[1] = MediaGrids(torch.tensor(image_grids))
    if video_grids:
        grids[2] = MediaGrids(torch.tensor(video_grids), torch.tensor(scales, dtype=torch.float32))
    return grids


def test_a_packed_row_equals_its_segments_alone():
    """Generated rows of 1 to 6 samples, as short as one token, that begin and end with text or
    media of either kind, videos with scaled temporal ids."""
    rng = random.Random("packed kernel")
    checked = 0
    while checked < 200:
        segments, per_segment = [], []
        for _ in range(rng.randint(1, 6)):
            grids = ([], [], [])
            segments.append(random_segment(rng, *grids))
            per_segment.append(grids)
        if any(a[-1] and a[-1] == b[0] for a, b in zip(segments, segments[1:])):
            continue  # a boundary between two runs of one kind is refused (tested above)
        row = torch.tensor([[t for segment in segments for t in segment]], dtype=torch.int8)
        cu_seqlens = torch.tensor([0, *map(len, segments)]).cumsum(0)
        together = tuple(sum((grids[i] for grids in per_segment), []) for i in range(3))
        positions, deltas = mrope_positions(row, None, KINDS, media(*together), spatial_merge_size=2,
                                            cu_seqlens=cu_seqlens)
        for k, (segment, grids) in enumerate(zip(segments, per_segment)):
            alone, alone_delta = mrope_positions(torch.tensor([segment], dtype=torch.int8), None, KINDS, media(*grids),
                                                 spatial_merge_size=2)
            span = slice(int(cu_seqlens[k]), int(cu_seqlens[k + 1]))
            assert torch.equal(positions[:, 0, span], alone[:, 0]) and torch.equal(deltas[k], alone_delta[0]), (
                f"row {checked}, segment {k}")
        checked += 1


def test_a_rollout_convention_is_the_variant_its_plugin_gives():
    """bind_mrope holds no engine's rules: each convention beyond transformers' binds the family
    the plugin built for it, and one offered without a variant is refused."""
    import dataclasses

    from mmrope_core.mrope import MropeFamily, TemporalRule, bind_mrope

    family = MropeFamily("My-VL", spatial_merge_size=2, image_token_id=5, video_token_id=6,
                         temporal=TemporalRule(2, precision="seconds"), image_key="images", video_key="videos",
                         seconds_key="seconds")
    with pytest.raises(TypeError, match=r"conventions \['vllm-0.33'\] of My-VL need their family in variants="):
        bind_mrope(family, None, {}, conventions=("transformers", "vllm-0.33"))
    variant = dataclasses.replace(family, resume_past_frames=True, temporal=TemporalRule(2, precision="float64"))
    binding = bind_mrope(family, None, {"convention": "vllm"}, conventions=("transformers", "vllm-0.33"),
                         variants={"vllm-0.33": variant})
    assert binding.kernel.family is variant


@pytest.mark.parametrize("loops", [True, False], ids=["compiled", "numpy"])
def test_the_kernel_reads_the_keys_its_family_declares(loops, monkeypatch):
    """The core knows no key names: a family that calls its media otherwise is read, probed and
    checked by those names, and its errors name them."""
    import dataclasses

    from mmrope_core.mrope import MropeFamily, MropeKernel, TemporalRule, probe_batches

    ours = MropeFamily("My-VL", 2, 5, 6, temporal=TemporalRule(2, precision="seconds"), image_key="pictures",
                       video_key="clips", seconds_key="clip_seconds")
    processors = dataclasses.replace(ours, image_key="image_grid_thw", video_key="video_grid_thw",
                                     seconds_key="second_per_grid_ts")
    kernel, reference = MropeKernel(ours), MropeKernel(processors)
    if not loops:
        monkeypatch.setattr(compiled, "native", None)
    assert kernel.input_keys == ("pictures", "clips", "clip_seconds")
    ids = torch.tensor([[1, 5, 5, 5, 5, 2] + [6] * 8 + [3]])
    images, videos, seconds = torch.tensor([[1, 4, 4]]), torch.tensor([[2, 4, 4]]), torch.tensor([0.7])
    got = kernel.rope_index(ids, pictures=images, clips=videos, clip_seconds=seconds)
    want = reference.rope_index(ids, image_grid_thw=images, video_grid_thw=videos, second_per_grid_ts=seconds)
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and got[0][0, 0, -2] > got[0][0, 0, 7]
    assert set(next(probe_batches(ours))) == {"input_ids", "attention_mask", "pictures", "clips", "clip_seconds"}
    assert isinstance(kernel.check(ids, pictures=images, clips=videos, clip_seconds=[0.7])["clip_seconds"], torch.Tensor)
    with pytest.raises(PlaceholderMismatchError, match="has no image grid .pictures has 0 rows"):
        kernel.rope_index(ids, image_grid_thw=images, clips=videos, clip_seconds=seconds)
    with pytest.raises(PlaceholderMismatchError, match="clips has 2 rows"):
        kernel.rope_index(ids, pictures=images, clips=torch.cat([videos, videos]), clip_seconds=seconds.repeat(2))
