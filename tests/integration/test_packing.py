"""Packed rows: computing K packed samples once equals the model's own ``get_rope_index`` on each
sample alone, for every family."""

import itertools
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mmrope_core import InvalidInputError, PlaceholderMismatchError, SegmentCutError
from mmrope_core.kernel import RopeKernel
from test_properties import MROPE_FAMILIES, SETTINGS, engines, models_own, one_sample

from mmrope_gemma4.examples import builds_offline

gemma4 = pytest.mark.mmrope_applies(builds_offline(), "a Gemma4Processor that builds without torchvision")


def packed(samples, style, pad, rows=1):
    """Samples packed into ``rows`` rows; returns (input_ids, packing keyword, media keyword arguments)."""
    per_row = [samples[i::rows] for i in range(rows)]
    length = max(sum(ids.numel() for ids, _ in row) for row in per_row) + 3  # trailing padding
    input_ids = torch.full((rows, length), pad)
    segment_ids = torch.zeros(rows, length, dtype=torch.long)
    for r, row in enumerate(per_row):
        column = 0
        for k, (ids, _) in enumerate(row, start=1):
            input_ids[r, column : column + ids.numel()] = ids
            segment_ids[r, column : column + ids.numel()] = k
            column += ids.numel()
    order = [sample for row in per_row for sample in row]
    kwargs = {}
    for _, sample_kwargs in order:
        for key, value in sample_kwargs.items():
            kwargs[key] = torch.cat([kwargs[key], value]) if isinstance(value, torch.Tensor) and key in kwargs else value
    if style == "cu_seqlens":
        used = int((segment_ids[0] > 0).sum())
        lengths = torch.tensor([ids.numel() for ids, _ in order])
        return input_ids[:, :used], {"cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])}, kwargs, order
    return input_ids, {"segment_ids": segment_ids}, kwargs, order


@pytest.mark.differential
@pytest.mark.parametrize("name", MROPE_FAMILIES)
@pytest.mark.parametrize("style", ["cu_seqlens", "segment_ids"])
@SETTINGS
@given(seed=st.integers(0, 2**31), count=st.integers(1, 6), use_audio_in_video=st.booleans(), rows=st.integers(1, 3))
def test_packing_equals_each_sample_alone(name, style, seed, count, use_audio_in_video, rows):
    fast, _ = engines(name)
    rng = random.Random(seed)
    samples = [one_sample(name, rng, use_audio_in_video) for _ in range(count)]
    ids, packing, kwargs, order = packed(samples, style, fast.processor.tokenizer.pad_token_id,
                                         rows=1 if style == "cu_seqlens" else rows)
    positions, deltas = fast.get_rope_index(ids, **packing, **kwargs)
    segment_ids = packing.get("segment_ids", None)
    if segment_ids is None:
        segment_ids = torch.repeat_interleave(torch.arange(1, len(order) + 1), packing["cu_seqlens"].diff()).unsqueeze(0)
    layout_rows = [(r, k) for r in range(ids.shape[0]) for k in range(1, int(segment_ids[r].max()) + 1)]
    assert deltas.shape == (len(order), 1)
    for index, ((sample_ids, sample_kwargs), (row, k)) in enumerate(zip(order, layout_rows)):
        alone, alone_delta = models_own(name)(sample_ids, **sample_kwargs)
        assert torch.equal(positions[:, row, segment_ids[row] == k], alone[:, 0]), f"segment {index}"
        assert torch.equal(deltas[index], alone_delta[0])


@pytest.mark.parametrize("style", ["cu_seqlens", "segment_ids"])
def test_compute_position_ids_restarts_every_segment(style):
    fast, _ = engines("Qwen2-VL")
    rng = random.Random(4)
    samples = [one_sample("Qwen2-VL", rng, False) for _ in range(3)]
    ids, packing, kwargs, order = packed(samples, style, fast.processor.tokenizer.pad_token_id)
    inputs = {k: v for k, v in kwargs.items() if k.endswith("grid_thw")}
    positions = fast.compute_position_ids(ids, None, inputs, **packing)
    column = 0
    for sample_ids, sample_kwargs in order:
        alone = fast.compute_position_ids(sample_ids, None, {k: v for k, v in sample_kwargs.items() if k.endswith("grid_thw")})
        assert torch.equal(positions[0, :, column : column + sample_ids.numel()], alone[0])
        column += sample_ids.numel()
    if style == "segment_ids":
        assert positions[0, 0, column:].eq(1).all() and positions[0, 1:, column:].eq(0).all()


@gemma4
def test_1d_families_restart_per_segment_too():
    from mmrope_core import PluginManager, RopeEngine
    from mmrope_gemma4.examples import build

    processor, config = build()
    engine = RopeEngine.from_processor(processor, config, plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "gemma4"}))
    ids = torch.ones(1, 9, dtype=torch.long)
    assert engine.compute_position_ids(ids, None, cu_seqlens=torch.tensor([0, 4, 6, 9])).tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]
    segments = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    assert engine.compute_position_ids(torch.ones(2, 6, dtype=torch.long), None, segment_ids=segments).tolist() == [
        [0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 0, 0]]


def image_row(*segments):
    fast, _ = engines("Qwen2-VL")
    processor = fast.processor
    tokenizer = processor.tokenizer
    table = {"t": tokenizer.convert_tokens_to_ids("cat"), "[": tokenizer.convert_tokens_to_ids(tokenizer.vision_start_token),
             "]": tokenizer.convert_tokens_to_ids(tokenizer.vision_end_token), "i": processor.image_token_id}
    ids = torch.tensor([[table[c] for segment in segments for c in segment]])
    cu = torch.tensor([0] + [len(s) for s in segments]).cumsum(0)
    return fast, ids, cu


def test_a_boundary_through_a_placeholder_run_names_the_segment():
    fast, ids, cu = image_row("t[ii", "ii]t")
    with pytest.raises(PlaceholderMismatchError, match=r"segment 1 starts inside a placeholder run that segment 0 began \(row 0, token 4\)"):
        fast.get_rope_index(ids, cu_seqlens=cu, image_grid_thw=torch.tensor([[1, 4, 4]]))


def test_errors_inside_a_segment_say_which_segment():
    fast, ids, cu = image_row("t[iiii]t", "tt[iii]")
    with pytest.raises(PlaceholderMismatchError, match=r"sample k below is segment k.*sample 1, image 0: .*found 3"):
        fast.get_rope_index(ids, cu_seqlens=cu, image_grid_thw=torch.tensor([[1, 4, 4]] * 2))


@pytest.mark.parametrize(
    "cu_seqlens, message",
    [
        (torch.tensor([0, 5, 9]), "must start at 0 and end at the row length 10"),
        (torch.tensor([1, 5, 10]), "must start at 0"),
        (torch.tensor([0, 6, 4, 10]), "not increasing at segment 1: 6 then 4"),
        (torch.tensor([0, 5, 5, 10]), "not increasing at segment 1"),
        (torch.tensor([0.0, 10.0]), "1-D integer tensor"),
    ],
)
def test_bad_cu_seqlens(cu_seqlens, message):
    fast, _ = engines("Qwen2-VL")
    with pytest.raises(InvalidInputError, match=message):
        fast.compute_position_ids(torch.ones(1, 10, dtype=torch.long), None, {}, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize(
    "segment_ids, message",
    [
        ([[1, 1, 2, 1, 0]], r"row 0 .*token 3 holds segment 1 where segment 3 was expected"),
        ([[2, 2, 0, 0, 0]], r"token 0 holds segment 2 where segment 1 was expected"),
        ([[1, 1, 0, 1, 0]], r"token 3 holds segment 1 where segment 2 was expected"),
        ([[1, -1, 0, 0, 0]], "must not be negative"),
    ],
)
def test_bad_segment_ids(segment_ids, message):
    fast, _ = engines("Qwen2-VL")
    with pytest.raises(InvalidInputError, match=message):
        fast.compute_position_ids(torch.ones(1, 5, dtype=torch.long), None, {}, segment_ids=torch.tensor(segment_ids))


def test_packing_arguments_are_checked_against_the_mask():
    fast, _ = engines("Qwen2-VL")
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(InvalidInputError, match="either cu_seqlens or segment_ids"):
        fast.compute_position_ids(ids, None, {}, cu_seqlens=torch.tensor([0, 4]), segment_ids=torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(InvalidInputError, match="attention_mask must be all 1"):
        fast.compute_position_ids(ids, torch.tensor([[1, 1, 1, 0]]), {}, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(InvalidInputError, match="attention_mask disagrees with segment_ids"):
        fast.compute_position_ids(ids, torch.tensor([[1, 1, 1, 1]]), {}, segment_ids=torch.tensor([[1, 1, 2, 0]]))
    with pytest.raises(InvalidInputError, match="one packed \\(1, T\\) row"):
        fast.compute_position_ids(torch.ones(2, 4, dtype=torch.long), None, {}, cu_seqlens=torch.tensor([0, 4]))


@gemma4
@SETTINGS
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6), rows=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_1d_packing_equals_each_sample_alone(lengths, rows, seed):
    from mmrope_core import PluginManager, RopeEngine
    from mmrope_gemma4.examples import build

    processor, config = build()
    engine = RopeEngine.from_processor(processor, config, plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "gemma4"}))
    rng = random.Random(seed)
    samples = [(torch.tensor([rng.randint(5, 9) for _ in range(n)]), {}) for n in lengths]
    for style in ("cu_seqlens", "segment_ids"):
        ids, packing, _, order = packed(samples, style, processor.tokenizer.pad_token_id,
                                        rows=1 if style == "cu_seqlens" else rows)
        positions = engine.compute_position_ids(ids, None, **packing)
        segment_ids = packing.get("segment_ids")
        if segment_ids is None:
            segment_ids = torch.repeat_interleave(torch.arange(1, len(order) + 1), packing["cu_seqlens"].diff()).unsqueeze(0)
        pairs = [(r, k) for r in range(ids.shape[0]) for k in range(1, int(segment_ids[r].max()) + 1)]
        for (sample_ids, _), (row, k) in zip(order, pairs):
            alone = engine.compute_position_ids(sample_ids, None)
            assert torch.equal(positions[row, segment_ids[row] == k], alone[0])


@pytest.mark.differential
@pytest.mark.parametrize("name", MROPE_FAMILIES)
def test_segments_of_one_length_equal_each_sample_alone(name):
    """Segments of one length fill every slot of the unpacked batch: no mask is passed on."""
    fast, _ = engines(name)
    rng = random.Random(f"uniform/{name}")
    for _ in range(5):
        sample = one_sample(name, rng, use_audio_in_video=True)
        ids, packing, kwargs, order = packed([sample] * 3, "cu_seqlens", fast.processor.tokenizer.pad_token_id)
        positions, deltas = fast.get_rope_index(ids, **packing, **kwargs)
        alone, alone_delta = models_own(name)(sample[0], **sample[1])
        assert torch.equal(positions, alone.repeat(1, 1, 3)) and torch.equal(deltas, alone_delta.repeat(3, 1))


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "GLM-4V"])
def test_packed_rows_are_placed_where_they_lie(name):
    """The fast binding places a packed row of segments of different lengths in one call; it
    equals the segments unpacked into a padded batch, segments that begin or end with a
    placeholder run included (media of different kinds meeting at a boundary too)."""
    from mmrope_qwen_vl.samples import random_batch

    fast, _ = engines(name)
    placed, unpacked, calls = _counting_and_unpacked(fast)
    rng = random.Random(f"placed/{name}")
    for index in range(40):
        batch = random_batch(fast.processor, rng, max_batch=6, max_images=3, max_videos=1, max_frames=4, bare_edges=True)
        valid = batch.pop("attention_mask").bool()
        ids = batch.pop("input_ids")[valid].unsqueeze(0)
        lengths = valid.sum(1)
        kwargs = {key: value for key, value in batch.items() if value is not None}
        for packing in ({"cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])},
                        {"segment_ids": torch.repeat_interleave(torch.arange(1, len(lengths) + 1), lengths).unsqueeze(0)}):
            try:
                want = unpacked.get_rope_index(ids, **packing, **kwargs)
            except PlaceholderMismatchError:  # a boundary cuts a run in two parts that fit no grid
                with pytest.raises(SegmentCutError, match="segment .* starts inside a placeholder run"):
                    placed.get_rope_index(ids, **packing, **kwargs)
                continue
            count = len(calls)
            got = placed.get_rope_index(ids, **packing, **kwargs)
            assert len(calls) == count + 1, f"batch {index}"
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {index}"
            got = placed.compute_position_ids(ids, None, kwargs, **packing)
            assert len(calls) == count + 2, f"batch {index}"
            assert torch.equal(got, unpacked.compute_position_ids(ids, None, kwargs, **packing)), f"batch {index}"


def test_the_reference_leaves_packed_rows_to_the_engine():
    assert not engines("Qwen2-VL")[1].binding.kernel.places_packed_rows
    for name in ("Qwen2-VL", "GLM-4V"):
        assert engines(name)[0].binding.kernel.places_packed_rows


@pytest.mark.differential
def test_a_glm_segment_that_leaves_a_video_open_does_not_turn_the_next_ones_images_into_video():
    """A sample cut after a video frame, its end-of-video marker lost, packed before a sample that
    begins with an image run: typed along the row, that run would read as more of the video."""
    fast, _ = engines("GLM-4V")
    tokenizer = fast.processor.tokenizer
    image, start, end, video_start, word = tokenizer.convert_tokens_to_ids([
        tokenizer.image_token, tokenizer.begin_of_image_token, tokenizer.end_of_image_token,
        tokenizer.begin_of_video_token, "cat"])
    frame = [start] + [image] * 4 + [end, word]
    samples = [
        (torch.tensor([word] * 3 + [video_start] + frame * 2), {"video_grid_thw": torch.tensor([[2, 4, 4]])}),
        (torch.tensor([image] * 6 + [word] * 3 + [start] + [image] * 4 + [end, word]),
         {"image_grid_thw": torch.tensor([[1, 4, 6], [1, 4, 4]])}),
        (torch.tensor([word, start] + [image] * 4 + [end] + [word] * 2), {"image_grid_thw": torch.tensor([[1, 4, 4]])}),
    ]
    placed, unpacked, calls = _counting_and_unpacked(fast)
    for style, pad in (("cu_seqlens", 0), ("segment_ids", 1)):
        ids, packing, kwargs, order = packed(samples, style, tokenizer.pad_token_id, rows=1 + pad)
        got = placed.get_rope_index(ids, **packing, **kwargs)
        alone = [fast.get_rope_index(sample_ids, **sample_kwargs) for sample_ids, sample_kwargs in order]
        assert torch.equal(got[1], torch.cat([deltas for _, deltas in alone])), style
        assert torch.equal(got[0], unpacked.get_rope_index(ids, **packing, **kwargs)[0]), style
        assert torch.equal(placed.compute_position_ids(ids, None, kwargs, **packing),
                           unpacked.compute_position_ids(ids, None, kwargs, **packing)), style
    assert len(calls) == 4  # both calls placed each packed row where it lies
    # read as one sample instead, the second segment's image run reads as more of the video
    ids, packing, kwargs, _ = packed(samples, "cu_seqlens", tokenizer.pad_token_id)
    with pytest.raises(PlaceholderMismatchError):
        fast.binding.kernel.rope_index(ids, **kwargs)


@pytest.mark.differential
def test_packed_rows_of_several_rows_are_placed_where_they_lie():
    """segment_ids over two rows without padding: the rows are placed as one packed row."""
    fast, _ = engines("Qwen2.5-VL")
    _, unpacked, _ = _counting_and_unpacked(fast)
    rng = random.Random("two rows")
    for index in range(10):
        samples = [one_sample("Qwen2.5-VL", rng, False) for _ in range(3)]
        rows = [samples, samples[::-1]]  # one length for both rows, segments of different lengths
        ids = torch.stack([torch.cat([sample_ids for sample_ids, _ in row]) for row in rows])
        segment_ids = torch.stack([torch.repeat_interleave(torch.arange(1, 4), torch.tensor([s.numel() for s, _ in row]))
                                   for row in rows])
        kwargs = {}
        for _, sample_kwargs in samples + samples[::-1]:
            for key, value in sample_kwargs.items():
                kwargs[key] = torch.cat([kwargs[key], value]) if key in kwargs else value
        got = fast.get_rope_index(ids, segment_ids=segment_ids, **kwargs)
        want = unpacked.get_rope_index(ids, segment_ids=segment_ids, **kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {index}"
        got = fast.compute_position_ids(ids, None, kwargs, segment_ids=segment_ids)
        assert got.is_contiguous()
        assert torch.equal(got, unpacked.compute_position_ids(ids, None, kwargs, segment_ids=segment_ids)), f"batch {index}"


class Counted(RopeKernel):
    """A kernel's positions, the packed rows it is handed counted; with ``places`` False, the same
    kernel leaving packed rows to the engine, which unpacks them into a batch."""

    def __init__(self, kernel, places, calls):
        self.kernel, self.places_packed_rows, self.calls = kernel, places, calls
        self.position_dtype = kernel.position_dtype

    def rope_index(self, *args, cu_seqlens=None, **kwargs):
        return self._call(self.kernel.rope_index, args, cu_seqlens, kwargs)

    def position_ids(self, *args, cu_seqlens=None, **kwargs):
        return self._call(self.kernel.position_ids, args, cu_seqlens, kwargs)

    def _call(self, method, args, cu_seqlens, kwargs):
        if cu_seqlens is None:
            return method(*args, **kwargs)
        self.calls.append(cu_seqlens)
        return method(*args, cu_seqlens=cu_seqlens, **kwargs)


def with_kernel(engine, kernel):
    import copy
    import dataclasses

    other = copy.copy(engine)
    other.binding = dataclasses.replace(engine.binding, kernel=kernel)
    return other


def _counting_and_unpacked(fast):
    """The fast engine with the packed rows its kernel is handed counted, and the same engine
    with a kernel that leaves packed rows to the engine."""
    calls = []
    return (with_kernel(fast, Counted(fast.binding.kernel, True, calls)),
            with_kernel(fast, Counted(fast.binding.kernel, False, [])), calls)


def _apart_and_meeting(ids, segment_ids, placeholders):
    """Whether two segments, one after the other but not side by side in one row, end and begin
    with the same placeholder token."""
    rows, length = segment_ids.shape
    spans = [(r * length + int(c[0]), r * length + int(c[-1])) for r in range(rows)
             for k in range(1, int(segment_ids[r].max()) + 1) for c in [(segment_ids[r] == k).nonzero()[:, 0]]]
    flat = ids.reshape(-1).tolist()
    return any(flat[end] == flat[start] and flat[end] in placeholders and (start != end + 1 or start % length == 0)
               for (_, end), (start, _) in zip(spans, spans[1:]))


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL"])
def test_packed_rows_with_padding_are_placed_where_they_lie(name):
    """segment_ids with padding before, between and after segments, over one to three rows: the
    fast kernel takes the segments' tokens joined into one row, and the result equals the
    segments unpacked into a padded batch, segments apart in the batch whose placeholder runs
    meet in the joined row included."""
    from mmrope_qwen_vl.samples import random_batch

    fast, _ = engines(name)
    placed, unpacked, calls = _counting_and_unpacked(fast)
    processor = fast.processor
    placeholders = {processor.image_token_id, processor.video_token_id}
    rng = random.Random(f"padded/{name}")
    seen = {"meeting": 0, "apart": 0}
    for index in range(40):
        batch = random_batch(processor, rng, max_batch=6, max_images=3, max_videos=1, max_frames=4, bare_edges=True)
        valid = batch.pop("attention_mask").bool()
        samples = [row[keep] for row, keep in zip(batch.pop("input_ids"), valid)]
        kwargs = {key: value for key, value in batch.items() if value is not None}
        rows = rng.randint(1, 3)
        cut = sorted(rng.sample(range(1, len(samples)), min(rows - 1, len(samples) - 1))) if len(samples) > 1 else []
        groups = [samples[a:b] for a, b in zip([0, *cut], [*cut, len(samples)])]
        # padding (the pad token, or a placeholder: outside segments ids do not count) around segments
        filler = [processor.tokenizer.pad_token_id, processor.image_token_id]
        laid_out = []
        for group in groups:
            ids_row, segment_row = [], []
            for k, sample in enumerate(group, start=1):
                gap = rng.choice([0, 0, 1, 3])
                ids_row += [rng.choice(filler)] * gap + sample.tolist()
                segment_row += [0] * gap + [k] * sample.numel()
            laid_out.append((ids_row, segment_row))
        length = max(len(ids_row) for ids_row, _ in laid_out) + rng.choice([0, 2])
        ids = torch.tensor([r + [processor.tokenizer.pad_token_id] * (length - len(r)) for r, _ in laid_out])
        segment_ids = torch.tensor([s + [0] * (length - len(s)) for _, s in laid_out])
        try:
            want = unpacked.get_rope_index(ids, segment_ids=segment_ids, **kwargs)
        except PlaceholderMismatchError:  # two segments side by side in a row, cut through one run
            with pytest.raises(SegmentCutError, match="starts inside a placeholder run"):
                placed.get_rope_index(ids, segment_ids=segment_ids, **kwargs)
            continue
        count = len(calls)
        got = placed.compute_position_ids(ids, None, kwargs, segment_ids=segment_ids)
        assert got.is_contiguous() and len(calls) == count + 1
        assert torch.equal(got, unpacked.compute_position_ids(ids, None, kwargs, segment_ids=segment_ids)), f"batch {index}"
        seen["meeting" if _apart_and_meeting(ids, segment_ids, placeholders) else "apart"] += 1
        got = placed.get_rope_index(ids, segment_ids=segment_ids, **kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {index}"
    assert all(seen.values()), seen


@pytest.mark.parametrize("apart", ["padding", "row end"])
def test_runs_of_segments_apart_in_the_batch_are_not_cut(apart):
    """Segment 0 ends with image tokens and segment 1 begins with image tokens, with padding or a
    row's end between them: two images, not a run cut in two."""
    fast, ids, _ = image_row("t[ii", "ii]t")
    placed, unpacked, calls = _counting_and_unpacked(fast)
    if apart == "padding":
        ids = torch.cat([ids[:, :4], ids[:, :1], ids[:, 4:]], dim=1)
        segment_ids = torch.tensor([[1, 1, 1, 1, 0, 2, 2, 2, 2]])
    else:
        ids, segment_ids = ids.view(2, 4), torch.ones(2, 4, dtype=torch.long)
    image, outside = {"image_grid_thw": torch.tensor([[1, 2, 4]])}, torch.tensor([[1], [0], [0], [0]])
    images = {"image_grid_thw": torch.tensor([[1, 2, 4]] * 2)}
    for engine in (placed, unpacked):
        positions = engine.compute_position_ids(ids, None, images, segment_ids=segment_ids)
        for row in range(ids.shape[0]):
            for k in segment_ids[row].unique().tolist():
                tokens = segment_ids[row] == k
                want = fast.compute_position_ids(ids[row, tokens], None, image)[0] if k else outside
                assert torch.equal(positions[row][:, tokens], want.expand(4, int(tokens.sum()))), (row, k)
    assert len(calls) == 1  # joined, the two runs stay two items
    # side by side in one row, they are two items too where they fit two grids, and a cut where they do not
    side_by_side = ids.reshape(1, -1)[:, segment_ids.reshape(-1) > 0]
    segment_ids = torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2]])
    assert torch.equal(fast.compute_position_ids(side_by_side, None, images, segment_ids=segment_ids),
                       unpacked.compute_position_ids(side_by_side, None, images, segment_ids=segment_ids))
    with pytest.raises(SegmentCutError, match=r"segment 1 starts inside a placeholder run that segment 0 began "
                                              r"\(row 0, token 4\)"):
        fast.compute_position_ids(side_by_side, None, {"image_grid_thw": torch.tensor([[1, 4, 4]])},
                                  segment_ids=segment_ids)


@SETTINGS
@given(layout=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), max_size=4), min_size=1, max_size=3),
       tail=st.integers(0, 3))
def test_layouts_read_from_segment_ids_agree_token_by_token(layout, tail):
    """Segments with padding anywhere, over several rows: the segments' tokens as one row, placing
    them back, offsets, validity, unpacking and packing equal a token-by-token reading."""
    from hypothesis import assume

    from mmrope_core.packed_layout import PackedLayout

    rows = [sum(([0] * gap + [k] * count for k, (gap, count) in enumerate(row, start=1)), []) for row in layout]
    length = max(len(row) for row in rows) + tail
    assume(length > 0 and any(rows))
    segment_ids = torch.tensor([row + [0] * (length - len(row)) for row in rows])
    packed_layout = PackedLayout.from_segment_ids(segment_ids, tuple(segment_ids.shape))
    values = torch.arange(1, segment_ids.numel() + 1).view(segment_ids.shape) * 10
    inside = segment_ids > 0
    tokens, offsets, segments = [], torch.full(segment_ids.shape, -1), []
    for r, row in enumerate(segment_ids.tolist()):
        for c, k in enumerate(row):
            if k:
                new = c == 0 or row[c - 1] != k
                segments += [[r * length + c, 0]] if new else []
                segments[-1][1] += 1
                offsets[r, c] = 0 if new else offsets[r, c - 1] + 1
                tokens.append(int(values[r, c]))
    assert [[int(s), int(n)] for s, n in zip(packed_layout.starts, packed_layout.lengths)] == segments
    row = packed_layout.joined(values)
    assert row.tolist() == [tokens]
    assert packed_layout.joined_bounds().tolist() == [0, *itertools.accumulate(n for _, n in segments)]
    assert torch.equal(packed_layout.offsets(outside=-1), offsets)
    assert torch.equal(packed_layout.valid(), inside)
    assert torch.equal(packed_layout.spread(row[0], outside=-5), torch.where(inside, values, -5))
    both = torch.stack([row[0], -row[0]])
    out = torch.empty(segment_ids.shape[0], 2, length, dtype=torch.long)
    packed_layout.spread(both, (7, 8), out=out.transpose(0, 1))
    assert torch.equal(out[:, 0], torch.where(inside, values, 7)) and torch.equal(out[:, 1], torch.where(inside, -values, 8))
    assert torch.equal(packed_layout.pack(packed_layout.unpack(values)), torch.where(inside, values, 0))
