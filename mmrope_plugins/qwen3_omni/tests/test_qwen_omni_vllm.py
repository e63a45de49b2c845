"""The vLLM 0.33 convention (``convention="vllm"``): each rule on short sequences, the expected
positions written here from the rule itself; both kernels on them; packed rows and padded
batches as each sample alone; the token layouts of a video with its audio that vLLM and the
transformers processor build; what vLLM refuses; and the transformers convention unchanged.
(benchmarks/vllm_side_by_side.py --convention vllm compares with vLLM's own code.)"""

import collections
import copy
import random

import pytest
import torch
import transformers
from test_qwen_omni import (
    FAMILIES,
    WithoutLoops,
    as_processor_outputs,
    built,
    generated,
    ids_of,
    split,
    transformers_reference,
)

from mmrope_core import (
    InvalidInputError,
    MmropeError,
    PlaceholderMismatchError,
    PluginManager,
    RopeEngine,
    UnknownConventionError,
    _native,
    compiled,
)
from mmrope_qwen3_omni.fast import FastRopeIndex

BATCHES = 40


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen3_omni"})


def vllm_engine(manager, name, config=None, **options):
    processor, default = built(name)
    return RopeEngine.from_processor(processor, default if config is None else config, plugin_manager=manager,
                                     convention="vllm", **options)


@pytest.fixture(params=["batched", "batched in numpy", "engine"])
def place(request, manager, monkeypatch):
    """``place(name, ids, **kwargs) -> (positions, deltas)`` by one of the vllm-convention paths:
    the batched kernel (its compiled loops loaded even where MMROPE_DISABLE_COMPILED switched
    them off for the engines), the batched kernel in numpy, or the engine bound."""
    monkeypatch.setattr(compiled, "native", _native)

    def placed(name, ids, config=None, mask=None, **kwargs):
        engine = vllm_engine(manager, name, config)
        if request.param == "engine":
            return engine.get_rope_index(ids, mask, **kwargs)
        bound = engine.binding.kernel
        kernel = FastRopeIndex(bound.family, bound.config, markers(name), bound.audio_rule, convention=bound.convention,
                               release=bound.release)
        if request.param != "batched":
            kernel = WithoutLoops(kernel)
        return kernel.rope_index(ids, None if mask is None else mask.bool(), **kwargs)

    return placed


def markers(name):
    token = ids_of(built(name)[0])
    return {"vision_end": token["vision_eos"], "audio_end": token["audio_eos"]}


def row_of(name, *parts):
    """One (1, L) row from parts: a string of t (a word), [ ] (vision start, end), ( ) (audio
    start, end), i v a (image, video, audio token), or a list of token ids."""
    processor, _ = built(name)
    token = ids_of(processor)
    table = {"t": processor.tokenizer.convert_tokens_to_ids("cat"), "[": token["vision_bos"],
             "]": token["vision_eos"], "(": token["audio_bos"], ")": token["audio_eos"], "i": token["image"],
             "v": token["video"], "a": token["audio"]}
    ids = []
    for part in parts:
        ids += [table[c] for c in part] if isinstance(part, str) else list(part)
    return torch.tensor([ids])


# -- the rules, written out ------------------------------------------------------------------------

def times(frames, seconds, per_second=25):
    """vLLM's temporal ids: frame * (seconds * positions per second), the seconds a float32 read
    into a Python float, the product in float64, truncated."""
    seconds = float(torch.tensor(seconds, dtype=torch.float32))
    return [int(frame * (seconds * per_second)) for frame in range(frames)]


def grid_block(start, frame_times, height, width):
    return [(start + t, start + y, start + x) for t in frame_times for y in range(height) for x in range(width)]


def text(first, count):
    return [(first + k,) * 3 for k in range(count)]


def with_item(before, block, tail, after):
    """``before`` text tokens (the start markers vLLM reads as text among them), the media block
    from the next position, ``tail`` end tokens and ``after`` text counting on from its largest + 1."""
    largest = max(max(p) for p in block)
    return torch.tensor(text(0, before) + block + text(largest + 1, tail + after)).T


def qwen3_interleaved(start, frame_times, height, width, audio):
    """Qwen3-Omni: audio token k before a frame at integer time t when k < t (a tie: the frame first)."""
    block, heard = [], 0
    for t in frame_times:
        while heard < audio and heard < t:
            block.append((start + heard,) * 3)
            heard += 1
        block += grid_block(start, [t], height, width)
    return block + text(start + heard, audio - heard)


def qwen2_5_interleaved(start, frame_times, height, width, audio, chunk=50):
    """Qwen2.5-Omni: frames grouped by time // chunk (a group without frames takes nothing), each
    group's frames then the next ``chunk`` audio positions, the rest last."""
    block, heard = [], 0
    for group in sorted({t // chunk for t in frame_times}):
        block += grid_block(start, [t for t in frame_times if t // chunk == group], height, width)
        taken = min(chunk, audio - heard)
        block += text(start + heard, taken)
        heard += taken
    return block + text(start + heard, audio - heard)


def qwen3_audio_tokens(frames):
    """vLLM's Qwen3-Omni audio token count: encoder windows of 100 mel frames whatever the config says."""
    rest = frames % 100
    return (((rest - 1) // 2 + 1 - 1) // 2 + 1 - 1) // 2 + 1 + frames // 100 * 13


def qwen2_5_audio_tokens(frames):
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def audio_frames_for(name, tokens):
    """The fewest mel frames whose audio makes ``tokens`` tokens in vLLM's count."""
    count = qwen3_audio_tokens if name == "Qwen3-Omni" else qwen2_5_audio_tokens
    return next(frames for frames in range(1, 100 * tokens + 100) if count(frames) == tokens)


def same(got, want_positions, want_delta):
    positions, deltas = got
    return (positions.dtype == torch.int64 and deltas.dtype == torch.int64 and torch.equal(positions[:, 0], want_positions)
            and int(deltas[0, 0]) == want_delta)


def delta_of(positions):
    return int(positions.max()) + 1 - positions.shape[1]


# -- binding -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("asked, named", [("vllm", "vLLM 0.34 convention (the rules of vLLM 0.33)"),
                                          ("vllm-0.33", "vLLM 0.33 convention")])
def test_the_binding_names_the_convention_and_gives_int64(manager, name, asked, named):
    processor, config = built(name)
    engine = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=asked)
    assert engine.implementation == "fast" and engine.binding.description.endswith(f", {named}")
    assert engine.position_dtype == torch.int64 and engine.binding.kernel.convention == "vllm-0.33"
    default = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert "vLLM" not in default.binding.description
    assert default.position_dtype == (torch.float32 if name == "Qwen3-Omni" else torch.int64)
    # integer positions are what the convention gives anyway
    integer = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=asked,
                                        integer_positions=True)
    assert integer.binding.description == engine.binding.description


@pytest.mark.parametrize("name", FAMILIES)
def test_an_unknown_convention_and_the_reference_with_vllm_are_refused(manager, name):
    processor, config = built(name)
    with pytest.raises(UnknownConventionError, match=r"'vllm-0\.99' is unknown; .* offers 'transformers', 'vllm-0\.33'"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm-0.99")
    with pytest.raises(UnknownConventionError, match=r"'vllm-0\.33' has no reference implementation .* Drop "
                                                     r"implementation='reference'"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm",
                                  implementation="reference")


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_the_transformers_convention_is_the_default_and_unchanged(manager, name):
    processor, config = built(name)
    explicit = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="transformers")
    default = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert explicit.binding.description == default.binding.description
    own = transformers_reference(name)
    rng = random.Random(f"transformers convention/{name}")
    for index in range(BATCHES // 2):
        ids, mask, kwargs = split(generated(name, rng, bool(index % 2)))
        want = own(input_ids=ids, attention_mask=mask, **kwargs)
        got = explicit.get_rope_index(ids, mask, **kwargs)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), f"batch {index}"


# -- the rules ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("seconds", [0.04, 0.5, 1.0, 3.0, 1 / 3])
def test_a_video_s_temporal_ids_are_float64_products_truncated(place, name, seconds):
    """Then its end marker at the largest + 1 and text counting on (integers: 0.5 s x 25 = 12.5
    gives frame 1 the id 12, and later positions no fraction)."""
    frame_times = times(5, seconds)
    ids = row_of(name, "tt[", "v" * 5, "]tt")  # five frames of one token (2 x 2 before merging)
    want = with_item(3, grid_block(3, frame_times, 1, 1), 1, 2)
    got = place(name, ids, video_grid_thw=torch.tensor([[5, 2, 2]]), second_per_grids=torch.tensor([seconds]))
    assert same(got, want, delta_of(want)), (got[0][:, 0].tolist(), want.tolist())


def test_float64_and_float32_truncation_part_at_0_04_seconds(manager):
    """0.04 s as float32 is 0.0399999991: times 25 in float64 is just below 1, so frame k gets
    k - 1; transformers' float32 products round to k."""
    assert times(5, 0.04) == [0, 0, 1, 2, 3]
    ids = row_of("Qwen2.5-Omni", "t[", "v" * 5, "]")
    kwargs = {"video_grid_thw": torch.tensor([[5, 2, 2]]), "second_per_grids": torch.tensor([0.04])}
    vllm, _ = vllm_engine(manager, "Qwen2.5-Omni").get_rope_index(ids, **kwargs)
    reference, _ = transformers_reference("Qwen2.5-Omni")(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert vllm[0, 0, 2:7].tolist() == [2, 2, 3, 4, 5] and reference[0, 0, 2:7].tolist() == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("name", FAMILIES)
def test_images_audios_and_their_markers(place, name):
    """Each block one past the largest position before it, each marker text: an image (2 x 3 after
    merging), then an audio of 5 tokens."""
    frames = audio_frames_for(name, 5)
    ids = row_of(name, "t[", "i" * 6, "]tt(", "a" * 5, ")t")
    image = grid_block(2, [0], 2, 3)
    after_image = max(max(p) for p in image) + 1  # the image's end marker
    want = torch.tensor(text(0, 2) + image + text(after_image, 4) + text(after_image + 4, 5)
                        + text(after_image + 9, 2)).T
    got = place(name, ids, image_grid_thw=torch.tensor([[1, 4, 6]]), audio_seqlens=torch.tensor([frames]))
    assert same(got, want, delta_of(want))


@pytest.mark.parametrize("seconds, audio", [(0.5, 26), (0.04, 6), (1.0, 60), (3.0, 40), (0.5, 2)])
def test_qwen3_omni_merges_a_video_and_its_audio_on_truncated_times(place, seconds, audio):
    """Frame times 0, 12, 25 at 0.5 s: the frame at 12.5 (truncated to 12) goes before audio
    token 12 (a tie: the video first), where transformers puts it after; the end markers follow
    the block's largest, and text resumes after them."""
    name = "Qwen3-Omni"
    frame_times = times(3, seconds)
    ids = row_of(name, "tt[(", "v" * 3, "a" * audio, ")]tt")
    block = qwen3_interleaved(4, frame_times, 1, 1, audio)
    want = with_item(4, block, 2, 2)
    got = place(name, ids, video_grid_thw=torch.tensor([[3, 2, 2]]), second_per_grids=torch.tensor([seconds]),
                audio_seqlens=torch.tensor([audio_frames_for(name, audio)]), use_audio_in_video=True)
    assert same(got, want, delta_of(want)), (got[0][:, 0].tolist(), want.tolist())
    if seconds == 0.5 and audio > 13:
        frame = [t for t, _, _ in block].index(4 + 12)  # frame 1 in the block
        assert block[frame - 1][0] == 4 + 11 and block[frame + 1][0] == 4 + 12  # audio 11, the frame, audio 12


def test_qwen3_omni_end_markers_follow_the_block_s_largest_position(place):
    """A 4 x 4 frame beside 3 audio tokens: the frame's height and width reach past the audio."""
    name = "Qwen3-Omni"
    ids = row_of(name, "t[(", "v" * 16, "aaa", ")]t")
    block = qwen3_interleaved(3, [0], 4, 4, 3)
    want = with_item(3, block, 2, 1)
    assert max(max(p) for p in block) == 3 + 3 and want[0, -3:].tolist() == [7, 8, 9]
    got = place(name, ids, video_grid_thw=torch.tensor([[1, 8, 8]]), second_per_grids=torch.tensor([0.5]),
                audio_seqlens=torch.tensor([audio_frames_for(name, 3)]), use_audio_in_video=True)
    assert same(got, want, delta_of(want))


@pytest.mark.parametrize("seconds, frames, audio", [
    (1.0, 3, 40),  # one chunk
    (0.5, 9, 120),  # frames at 0, 12, .. 100: chunks of 50 positions
    (3.0, 3, 120),  # frames at 0, 75, 150: chunk 2 holds no frame
    (5.0, 3, 130),  # 0, 125, 250: chunks 1, 3 and 4 empty
    (5.0, 3, 20),  # the audio runs out before the frames
    (0.04, 4, 7),
])
def test_qwen2_5_omni_lays_a_video_with_its_audio_one_token_early(place, seconds, frames, audio):
    """The block starts at the audio start marker (the vision start is text), so the last
    placeholder and both end markers count on from the block's largest + 1, and text resumes
    at largest + 4."""
    name = "Qwen2.5-Omni"
    frame_times = times(frames, seconds)
    ids = row_of(name, "tt[(", "v" * frames, "a" * audio, ")]tt")
    block = qwen2_5_interleaved(3, frame_times, 1, 1, audio)
    want = with_item(3, block, 3, 2)
    largest = max(max(p) for p in block)
    assert want[0, -5:].tolist() == [largest + k for k in range(1, 6)]
    got = place(name, ids, video_grid_thw=torch.tensor([[frames, 2, 2]]), second_per_grids=torch.tensor([seconds]),
                audio_seqlens=torch.tensor([audio_frames_for(name, audio)]), use_audio_in_video=True)
    assert same(got, want, delta_of(want)), (got[0][:, 0].tolist(), want.tolist())


def test_qwen2_5_omni_times_videos_by_the_vision_config_s_tokens_per_second(place):
    """vLLM reads vision_config.tokens_per_second (25 where absent), not position_id_per_seconds,
    for the temporal ids and the chunk (its product with seconds_per_chunk)."""
    name = "Qwen2.5-Omni"
    config = copy.deepcopy(built(name)[1])
    config.thinker_config.vision_config.tokens_per_second = 10
    config.thinker_config.position_id_per_seconds = 40
    frame_times = times(4, 1.5, per_second=10)
    assert frame_times == [0, 15, 30, 45]
    ids = row_of(name, "t[(", "v" * 4, "a" * 30, ")]t")
    block = qwen2_5_interleaved(2, frame_times, 1, 1, 30, chunk=20)
    want = with_item(2, block, 3, 1)
    got = place(name, ids, config, video_grid_thw=torch.tensor([[4, 2, 2]]), second_per_grids=torch.tensor([1.5]),
                audio_seqlens=torch.tensor([audio_frames_for(name, 30)]), use_audio_in_video=True)
    assert same(got, want, delta_of(want))


@pytest.mark.parametrize("name, default", [("Qwen2.5-Omni", 1.0), ("Qwen3-Omni", 2.0)])
def test_videos_without_seconds_take_vllm_s_default(manager, place, name, default):
    ids = row_of(name, "t[", "v" * 3, "]t")
    want = with_item(2, grid_block(2, times(3, default), 1, 1), 1, 1)
    assert same(place(name, ids, video_grid_thw=torch.tensor([[3, 2, 2]])), want, delta_of(want))
    processor, config = built(name)
    with pytest.raises(InvalidInputError, match="videos need second_per_grids"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager).get_rope_index(
            ids, video_grid_thw=torch.tensor([[3, 2, 2]]))


def test_qwen3_omni_audio_tokens_use_a_window_of_50_whatever_the_config_says(place):
    """300 mel frames: 39 tokens with vLLM's window of 50 (three windows of 100 frames); a
    config saying 100 (two-window chunks of 200 frames) would make 26."""
    name = "Qwen3-Omni"
    config = copy.deepcopy(built(name)[1])
    config.thinker_config.audio_config.n_window = 100
    assert qwen3_audio_tokens(300) == 39
    kwargs = {"image_grid_thw": torch.tensor([[1, 2, 2]]), "audio_seqlens": torch.tensor([300])}
    want = torch.arange(45).expand(3, -1)  # an image of one token, text, the audio: counting on
    got = place(name, row_of(name, "[i]t(", "a" * 39, ")"), config, **kwargs)
    assert same(got, want, 0)
    with pytest.raises(PlaceholderMismatchError, match="audio 0: needs 39 placeholder tokens, found 26"):
        place(name, row_of(name, "[i]t(", "a" * 26, ")"), config, **kwargs)


@pytest.mark.parametrize("name", FAMILIES)
def test_batches_without_grids_count_on_and_their_deltas_are_zero(place, name):
    """Text and audio alone count on in vLLM too; its deltas know no padding (transformers' count
    the padding's 1)."""
    processor, _ = built(name)
    word, pad = processor.tokenizer.convert_tokens_to_ids("cat"), processor.tokenizer.pad_token_id
    audio = row_of(name, "t(", "a" * 5, ")t")[0].tolist()
    ids = torch.tensor([[word, pad, pad, pad, pad, pad, pad, pad, pad], audio])
    mask = torch.tensor([[1] + [0] * 8, [1] * 9])
    kwargs = {"audio_seqlens": torch.tensor([audio_frames_for(name, 5)])}
    positions, deltas = place(name, ids, mask=mask, **kwargs)
    assert positions.dtype == deltas.dtype == torch.int64 and deltas.tolist() == [[0], [0]]
    assert positions[:, 0].tolist() == [[0] + [1] * 8] * 3 and positions[:, 1].tolist() == [list(range(9))] * 3
    _, reference_deltas = transformers_reference(name)(input_ids=ids, attention_mask=mask, **kwargs)
    assert reference_deltas.tolist() == [[1], [0]]


@pytest.mark.parametrize("name", FAMILIES)
def test_an_audio_of_its_own_beside_a_video_with_its_audio_is_refused(place, manager, name):
    """vLLM refuses such a request; a sample with audio alone under the flag is placed as audio."""
    frames = audio_frames_for(name, 4)
    kwargs = {"video_grid_thw": torch.tensor([[2, 2, 2]]), "second_per_grids": torch.tensor([1.0]),
              "audio_seqlens": torch.tensor([frames, frames]), "use_audio_in_video": True}
    ids = row_of(name, "t[(vvaaaa)]t(aaaa)t")
    with pytest.raises(InvalidInputError, match=r"sample 0: an audio of its own \(token 12\) beside a video with its "
                                                r"audio \(token 1\)\. vLLM 0\.34 refuses such a request .*so the "
                                                r"vllm-0\.34 convention has no positions"):
        place(name, ids, **kwargs)  # convention="vllm": the newest release, whose rules are 0.33's
    pinned = RopeEngine.from_processor(*built(name), plugin_manager=manager, convention="vllm-0.33")
    with pytest.raises(InvalidInputError, match=r"vLLM 0\.33 refuses such a request .*so the vllm-0\.33 convention"):
        pinned.get_rope_index(ids, **kwargs)
    alone = row_of(name, "t(aaaa)t")
    assert same(place(name, alone, audio_seqlens=torch.tensor([frames]), use_audio_in_video=True),
                torch.arange(8).expand(3, -1), 0)


# -- token layouts of a video with its audio -------------------------------------------------------

def vllm_layout(name, frames, per_frame, audio, seconds):
    """vLLM's tokens between the audio markers, by its rule. Qwen2.5-Omni: chunks
    c = 0 .. max(t) // 50 of frame times long(frame * seconds * 25) (float32), each with its frames'
    video tokens then up to 50 audio tokens, also where it holds no frame; then the rest.
    Qwen3-Omni: video and audio tokens merged by frame * seconds * 25 against the audio index
    (floats, not truncated), a video token first on a tie."""
    if name == "Qwen2.5-Omni":
        frame_times = (torch.arange(frames) * seconds * 25).long().tolist()
        tokens, heard = [], 0
        for chunk in range(max(frame_times) // 50 + 1):
            tokens += ["v"] * (per_frame * sum(t // 50 == chunk for t in frame_times))
            taken = min(50, audio - heard)
            tokens, heard = tokens + ["a"] * taken, heard + taken
        return "".join(tokens) + "a" * (audio - heard)
    seconds = float(torch.tensor(seconds, dtype=torch.float32))
    keys = sorted([(frame * seconds * 25, 0) for frame in range(frames) for _ in range(per_frame)]
                  + [(float(k), 1) for k in range(audio)])
    return "".join("v" if kind == 0 else "a" for _, kind in keys)


def processor_layout(name, frames, per_frame, audio, seconds):
    """The transformers processor's tokens between the audio markers (its own code)."""
    processor, _ = built(name)
    token = ids_of(processor)
    side = int(per_frame**0.5) * 2
    placed = processor.replace_video_with_audio_token(
        {"video_grid_thw": [[frames, side, side]], "video_second_per_grid": [seconds]}, 0,
        {"num_audio_tokens": [audio]}, 0, position_id_per_seconds=processor.position_id_per_seconds,
        seconds_per_chunk=processor.seconds_per_chunk)
    ids = processor.tokenizer(placed, add_special_tokens=False).input_ids[1:-1]
    return "".join("v" if i == token["video"] else "a" for i in ids)


@pytest.mark.mmrope_applies(all(hasattr(getattr(transformers, name), "replace_video_with_audio_token")
                          for name in ("Qwen3OmniMoeProcessor", "Qwen2_5OmniProcessor")),
                      "the processors' own layout of a video with its audio")
@pytest.mark.parametrize("name, seconds, frames, audio", [
    ("Qwen2.5-Omni", 5.0, 3, 130),  # vLLM gives chunks without frames their audio
    ("Qwen2.5-Omni", 3.0, 4, 180),
    ("Qwen3-Omni", 0.5, 4, 40),  # the processor merges at 13 positions a second, vLLM at 25
    ("Qwen3-Omni", 1 / 3, 6, 30),
])
def test_both_layouts_are_accepted_and_placed_alike(manager, place, name, seconds, frames, audio):
    """vLLM's positions follow offsets and counts, not the tokens' order inside the markers: its
    own layout and the transformers processor's get the same positions, vLLM's rule's."""
    theirs, ours = vllm_layout(name, frames, 4, audio, seconds), processor_layout(name, frames, 4, audio, seconds)
    assert theirs != ours and sorted(theirs) == sorted(ours)
    frame_times = times(frames, seconds)
    start = 2 if name == "Qwen2.5-Omni" else 3
    block = (qwen2_5_interleaved(start, frame_times, 2, 2, audio) if name == "Qwen2.5-Omni"
             else qwen3_interleaved(start, frame_times, 2, 2, audio))
    want = with_item(start, block, 3 if name == "Qwen2.5-Omni" else 2, 1)
    kwargs = {"video_grid_thw": torch.tensor([[frames, 4, 4]]), "second_per_grids": torch.tensor([seconds]),
              "audio_seqlens": torch.tensor([audio_frames_for(name, audio)]), "use_audio_in_video": True}
    for layout in (theirs, ours, "v" * 4 * frames + "a" * audio, "a" * audio + "v" * 4 * frames):
        got = place(name, row_of(name, "t[(", layout, ")]t"), **kwargs)
        assert same(got, want, delta_of(want)), layout
    if name == "Qwen2.5-Omni":  # transformers' Qwen2.5-Omni finds such a video by its first video token
        processor, config = built(name)
        default = RopeEngine.from_processor(processor, config, plugin_manager=manager)
        with pytest.raises(PlaceholderMismatchError, match="its placeholders begin with an audio token"):
            default.get_rope_index(row_of(name, "t[(", "a" * audio + "v" * 4 * frames, ")]t"), **kwargs)


# -- generated samples -------------------------------------------------------------------------------

def vllm_sample(name, rng, use_audio_in_video):
    """A generated single sample vLLM accepts (no audio of its own beside a video with its audio)."""
    token = ids_of(built(name)[0])
    vision, audio_start, audio = token["vision_bos"], token["audio_bos"], token["audio"]
    while True:
        ids, mask, kwargs = split(generated(name, rng, use_audio_in_video, max_batch=1,
                                            strays=rng.choice([None, "markers"])))
        row = ids[0][mask[0].bool()]
        t = row.tolist()
        pairs = any(t[k] == vision and t[k + 1] == audio_start for k in range(len(t) - 1))
        alone = any(t[k] == audio_start and t[k + 1] == audio and (k == 0 or t[k - 1] != vision)
                    for k in range(len(t) - 1))
        if not (use_audio_in_video and pairs and alone):
            return row, kwargs


def joined(samples):
    media = {}
    for _, kwargs in samples:
        for key, value in kwargs.items():
            media[key] = torch.cat([media[key], value]) if isinstance(value, torch.Tensor) and key in media else value
    return media


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_padded_and_packed_batches_equal_each_sample_alone(manager, name, use_audio_in_video):
    """vLLM computes each request alone: a padded batch (left or right), one packed row
    (cu_seqlens) and rows of segments (segment_ids), in both layouts, give each sample its
    positions and delta alone."""
    engine = vllm_engine(manager, name)
    rng = random.Random(f"vllm alone/{name}/{use_audio_in_video}")
    pad = built(name)[0].tokenizer.pad_token_id
    for index in range(BATCHES // 2):
        samples = [vllm_sample(name, rng, use_audio_in_video) for _ in range(rng.randint(2, 5))]
        alone = [engine.get_rope_index(row[None], **kwargs) for row, kwargs in samples]
        media = joined(samples)
        inputs, flag = as_processor_outputs(media), {"use_audio_in_video": use_audio_in_video}
        lengths = [row.numel() for row, _ in samples]
        width, left = max(lengths) + rng.randint(0, 3), rng.random() < 0.5
        ids, mask = torch.full((len(samples), width), pad), torch.zeros(len(samples), width, dtype=torch.long)
        for k, (row, _) in enumerate(samples):
            span = slice(width - row.numel(), width) if left else slice(0, row.numel())
            ids[k, span], mask[k, span] = row, 1
        positions, deltas = engine.get_rope_index(ids, mask, **media)
        four = engine.compute_position_ids(ids, mask, inputs, flag)
        for k, (want, want_delta) in enumerate(alone):
            valid = mask[k].bool()
            assert torch.equal(positions[:, k, valid], want[:, 0]) and deltas[k] == want_delta[0], f"batch {index}"
            assert torch.equal(four[k, 1:, valid], want[:, 0]) and four[k, 0, valid].tolist() == list(range(lengths[k]))
        row = torch.cat([row for row, _ in samples])[None]
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        packed, packed_deltas = engine.get_rope_index(row, cu_seqlens=cu_seqlens, **media)
        assert torch.equal(packed[:, 0], torch.cat([want[:, 0] for want, _ in alone], dim=1)), f"batch {index}"
        assert torch.equal(packed_deltas, torch.cat([delta for _, delta in alone])), f"batch {index}"
        four = engine.compute_position_ids(row, None, inputs, flag, cu_seqlens=cu_seqlens)
        assert torch.equal(four[0, 1:], packed[:, 0])
        segment_ids = torch.cat([torch.full((n,), k + 1) for k, n in enumerate(lengths)] + [torch.zeros(2, dtype=torch.long)])
        spaced, _ = engine.get_rope_index(torch.cat([row[0], torch.tensor([pad, pad])])[None], segment_ids=segment_ids[None],
                                          **media)
        assert torch.equal(spaced[:, 0, :-2], packed[:, 0]), f"batch {index}"


def holed(ids, mask, rng):
    ids, mask = ids.clone(), mask.clone()
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(ids.shape[0])
        columns = mask[k].nonzero().flatten()
        mask[k, columns[rng.randrange(columns.numel())]] = 0
    return ids, mask


def outcome(method, *args, **kwargs):
    try:
        return method(*args, **kwargs)
    except MmropeError as exc:
        return exc


def same_outcome(got, want):
    if isinstance(want, Exception) or isinstance(got, Exception):
        return type(got) is type(want) and str(got) == str(want)
    if isinstance(want, tuple):
        return all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    return got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_both_kernels_agree(manager, monkeypatch, name, use_audio_in_video):
    """The batched kernel on the compiled loops and in numpy in the vllm convention: the same positions,
    four rows and errors on generated batches with stray markers, without grids, with padding
    inside samples, with a video's seconds left out, with separate audio beside audio in video
    (refused), and with a token removed."""
    monkeypatch.setattr(compiled, "native", _native)
    bound = vllm_engine(manager, name).binding.kernel
    fast = FastRopeIndex(bound.family, bound.config, markers(name), bound.audio_rule, convention=bound.convention)
    in_numpy = WithoutLoops(fast)
    ran = collections.Counter()
    for index in range(BATCHES):
        rng = random.Random(f"vllm kernels/{name}/{use_audio_in_video}/{index}")
        what = rng.choice(["plain", "strays", "text only", "holes", "no seconds", "broken", "audio beside"])
        limits = {"kinds": ("audio",), "ensure_grid": False} if what == "text only" else {}
        if use_audio_in_video and what not in ("text only", "audio beside"):
            limits["kinds"] = ("image", "video", "video")  # vLLM refuses audios of their own beside them
        ids, mask, kwargs = split(generated(name, rng, use_audio_in_video, strays="markers" if what == "strays" else None,
                                            **limits))
        if what == "holes":
            ids, mask = holed(ids, mask, rng)
        if what == "no seconds":
            kwargs.pop("second_per_grids", None)
        if what == "broken":
            column = rng.randrange(ids.shape[1])
            ids = torch.cat([ids[:, :column], ids[:, column + 1:], ids[:, :1]], dim=1)
        want = outcome(fast.rope_index, ids, mask, **kwargs)
        assert same_outcome(outcome(in_numpy.rope_index, ids, mask, **kwargs), want), f"{what} batch {index}"
        assert same_outcome(outcome(in_numpy.position_ids, ids, mask, **kwargs),
                            outcome(fast.position_ids, ids, mask, **kwargs)), f"{what} batch {index}"
        ran[type(want).__name__ if isinstance(want, Exception) else "placed"] += 1
    assert ran["placed"] > BATCHES // 3 and sum(ran.values()) - ran["placed"] > 2, ran
