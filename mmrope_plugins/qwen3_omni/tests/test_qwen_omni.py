"""mmrope-qwen3-omni against the installed transformers thinker reference, with real processors."""

import functools
import random
import types

import numpy as np
import pytest
import torch
import transformers

from mmrope_core import InvalidInputError, MmropeError, PlaceholderMismatchError, PluginManager, RopeEngine
from mmrope_core.tiny import processors_without_torchvision

FAMILIES = ["Qwen3-Omni", "Qwen2.5-Omni"]
BATCHES_PER_MODE = 120


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen3_omni"})


@functools.cache
def built(name):
    from mmrope_qwen3_omni.examples import build

    return build(name)


def engines(manager, name, **options):
    processor, config = built(name)
    return (
        RopeEngine.from_processor(processor, config, plugin_manager=manager, **options),
        RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation="reference", **options),
    )


def transformers_reference(name):
    """The thinker's own get_rope_index bound to the config, without mmrope."""
    from mmrope_qwen3_omni.families import FAMILIES as BY_PROCESSOR

    family = next(f for f in BY_PROCESSOR.values() if f.name == name)
    module = getattr(transformers.models, family.module)
    model_cls = getattr(getattr(module, f"modeling_{family.module}"), family.reference_class)
    thinker = built(name)[1].thinker_config
    namespace = types.SimpleNamespace(config=thinker, spatial_merge_size=thinker.vision_config.spatial_merge_size)
    for method in ("get_llm_pos_ids_for_vision", "get_chunked_index", "get_rope_index"):
        setattr(namespace, method, types.MethodType(getattr(model_cls, method), namespace))
    return namespace.get_rope_index


def generated(name, rng, use_audio_in_video, **limits):
    from mmrope_qwen3_omni.binding import token_ids
    from mmrope_qwen3_omni.families import family_of
    from mmrope_qwen3_omni.layout import tokens_of
    from mmrope_qwen3_omni.probe import random_batch

    processor, config = built(name)
    family = family_of(processor)
    tokenizer = processor.tokenizer
    ids = token_ids(processor)
    markers = {"vision_end": ids["vision_eos"], "audio_end": ids["audio_eos"]}
    thinker = config.thinker_config
    words = tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "mat"])
    return random_batch(family, tokens_of(thinker, markers), 2, thinker, rng,
                        use_audio_in_video=use_audio_in_video, text_ids=words, pad_id=tokenizer.pad_token_id, **limits)


def split(batch):
    kwargs = {k: v for k, v in batch.items() if k not in ("input_ids", "attention_mask") and v is not None}
    return batch["input_ids"], batch["attention_mask"], kwargs


def as_processor_outputs(kwargs):
    """The multimodal inputs a processor would return for these get_rope_index keyword arguments."""
    inputs = {k: v for k, v in kwargs.items() if k in ("image_grid_thw", "video_grid_thw")}
    if "second_per_grids" in kwargs:
        inputs["video_second_per_grid"] = kwargs["second_per_grids"].tolist()
    frames = kwargs.get("audio_seqlens")
    if frames is not None:
        inputs["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).int()
    return inputs


def ids_of(processor):
    from mmrope_qwen3_omni.binding import token_ids

    return token_ids(processor)


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_fast_binding_is_used_on_this_transformers(manager, name):
    fast, reference = engines(manager, name)
    assert fast.implementation == "fast", fast.binding.description
    assert reference.implementation == "reference"


@pytest.mark.parametrize("name", FAMILIES)
def test_without_the_compiled_loops_the_batched_kernel_runs_in_numpy(manager, monkeypatch, name):
    """Not the reference, which fails where the batched kernel does not: a vision start sampled
    at the end of a response is text."""
    from mmrope_core import compiled
    from mmrope_qwen3_omni.fast import FastRopeIndex

    monkeypatch.setattr(compiled, "native", None)
    fast, reference = engines(manager, name)
    assert type(fast.binding.kernel) is FastRopeIndex and fast.implementation == "fast"
    assert "batched kernel (in numpy: the compiled loops are missing)" in fast.binding.description
    assert reference.binding.kernel.audio_rule == fast.binding.kernel.audio_rule is not None  # probed
    kwargs = {"image_grid_thw": torch.tensor([[1, 2, 2]])}
    as_text = omni_row(name, "t[i]ttt")
    want = transformers_reference(name)(input_ids=as_text, attention_mask=torch.ones_like(as_text), **kwargs)
    got = fast.get_rope_index(omni_row(name, "t[i]tt{"), **kwargs)
    assert got[0].dtype == want[0].dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(PlaceholderMismatchError, match="get_rope_index cannot place this batch") as caught:
        reference.get_rope_index(omni_row(name, "t[i]tt{"), **kwargs)
    assert not isinstance(caught.value.__cause__, MmropeError)  # the installed reference's own failure


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_fast_equals_reference_on_generated_batches(manager, name, use_audio_in_video):
    fast, reference = engines(manager, name)
    own = transformers_reference(name)
    rng = random.Random(f"{name}/{use_audio_in_video}")
    for index in range(BATCHES_PER_MODE):
        ids, mask, kwargs = split(generated(name, rng, use_audio_in_video))
        want = own(input_ids=ids, attention_mask=mask, **kwargs)
        got = fast.get_rope_index(ids, mask, **kwargs)
        context = f"batch {index}: {ids.shape}"
        assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype, context
        assert torch.equal(got[0], want[0]), context
        assert torch.equal(got[1], want[1]), context
        assert torch.equal(reference.get_rope_index(ids, mask, **kwargs)[0], want[0]), context


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
def test_real_processor_output_gives_the_thinkers_own_positions(manager, name):
    from mmrope_qwen3_omni.examples import audio_and_image_prompt

    processor, _ = built(name)
    fast, _ = engines(manager, name)
    own = transformers_reference(name)
    for seed in range(4):
        batch = dict(processor(**audio_and_image_prompt(processor, random.Random(seed))))
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        want, _ = own(input_ids=ids, attention_mask=mask, image_grid_thw=batch["image_grid_thw"],
                      audio_seqlens=batch["feature_attention_mask"].sum(-1))
        positions = fast.compute_position_ids(ids, mask, batch)
        assert torch.equal(positions[:, 1:], want.transpose(0, 1).to(positions.dtype))


def test_generated_batches_cover_what_the_tests_claim():
    rng = random.Random("coverage")
    batches = [generated("Qwen3-Omni", rng, use_audio_in_video=bool(i % 2)) for i in range(BATCHES_PER_MODE)]
    text_only_rows = audio_only = left = right = 0
    for batch in batches:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        left += bool(mask[:, 0].eq(0).any())
        right += bool(mask[:, -1].eq(0).any())
        audio_only += batch["image_grid_thw"] is None and batch["video_grid_thw"] is None
        token = ids_of(built("Qwen3-Omni")[0])
        media = (ids == token["image"]) | (ids == token["video"]) | (ids == token["audio"])
        text_only_rows += int((~media.any(1)).sum())
    audios = sum(int(b["audio_seqlens"].numel()) for b in batches if b["audio_seqlens"] is not None)
    assert left > 10 and right > 10 and text_only_rows > 10 and audios > 100
    seconds = torch.cat([b["second_per_grids"] for b in batches if b["second_per_grids"] is not None])
    assert bool((seconds * 25 != (seconds * 25).round()).any())
    # frames over two of Qwen2.5-Omni's 50-position chunks apart: its interleave cuts them inside a frame
    grids = torch.cat([b["video_grid_thw"] for b in batches if b["video_grid_thw"] is not None])
    assert int(((seconds * 25 >= 100) & (grids[:, 0] > 1)).sum()) > 10


def test_positions_keep_their_fractions_by_default_and_truncate_only_on_request(manager):
    processor, _ = built("Qwen3-Omni")
    fast, _ = engines(manager, "Qwen3-Omni")
    integer, _ = engines(manager, "Qwen3-Omni", integer_positions=True)
    token = ids_of(processor)
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    ids = torch.tensor([[word, token["vision_bos"]] + [token["video"]] * 2 + [token["vision_eos"], word, word]])
    kwargs = {"video_grid_thw": torch.tensor([[2, 2, 2]]), "second_per_grids": torch.tensor([0.5])}
    positions = fast.compute_position_ids(ids, None, kwargs)
    assert positions.dtype == torch.float32
    assert 14.5 in positions[0, 1].tolist()  # frame 1 at 0.5 s x 25 positions per second, after 2 tokens
    assert (positions[0, 1, -1] % 1).item() == 0.5  # later positions inherit the fraction
    truncated = integer.compute_position_ids(ids, None, kwargs)
    assert truncated.dtype == torch.int64 and torch.equal(truncated, positions.long())
    assert "truncated" in integer.binding.description


@pytest.mark.parametrize("name", FAMILIES)
def test_dtype_is_the_same_with_and_without_media(manager, name):
    fast, _ = engines(manager, name)
    processor, _ = built(name)
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    text_only = fast.compute_position_ids(torch.tensor([[word] * 4]), None, {})
    ids, mask, kwargs = split(generated(name, random.Random(0), False))
    with_media = fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs))
    assert text_only.dtype == with_media.dtype == fast.position_dtype


def test_kwargs_come_from_the_processor_outputs(manager):
    from mmrope_qwen3_omni.inputs import rope_index_kwargs

    inputs = {"feature_attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), "video_second_per_grid": [0.5, 2.0],
              "video_grid_thw": torch.tensor([[1, 2, 2]] * 2)}
    kwargs = rope_index_kwargs(inputs, {"use_audio_in_video": True})
    assert kwargs["audio_seqlens"].tolist() == [3, 2]
    assert kwargs["second_per_grids"].dtype == torch.float32 and kwargs["second_per_grids"].tolist() == [0.5, 2.0]
    assert kwargs["use_audio_in_video"] is True and "image_grid_thw" not in kwargs
    assert rope_index_kwargs({}, {"load_audio_from_video": False}) == {"use_audio_in_video": False}


@pytest.mark.parametrize("name", FAMILIES)
def test_audio_in_video_through_compute_position_ids(manager, name):
    fast, _ = engines(manager, name)
    batch = generated(name, random.Random(7), True, max_batch=3)
    ids, mask, kwargs = split(batch)
    want, _ = transformers_reference(name)(input_ids=ids, attention_mask=mask, **kwargs)
    use = kwargs.pop("use_audio_in_video")
    got = fast.compute_position_ids(ids, mask, as_processor_outputs(kwargs), {"use_audio_in_video": use})
    assert use and got.dtype == want.dtype and torch.equal(got[:, 1:], want.transpose(0, 1))


def test_full_config_thinker_config_and_missing_vision_start(manager):
    processor, config = built("Qwen3-Omni")
    thinker = config.thinker_config
    full = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert RopeEngine.from_processor(processor, thinker, plugin_manager=manager).implementation == "fast"
    stripped = transformers.AutoConfig.for_model("qwen3_omni_moe").thinker_config
    for key in ("image_token_id", "video_token_id", "audio_token_id", "audio_start_token_id"):
        setattr(stripped, key, getattr(thinker, key))
    assert getattr(stripped, "vision_start_token_id", None) is None
    filled = RopeEngine.from_processor(processor, stripped, plugin_manager=manager)
    assert filled.binding.kernel.config.vision_start_token_id == ids_of(processor)["vision_bos"]
    assert getattr(stripped, "vision_start_token_id", None) is None  # the caller's config is untouched
    batch = generated("Qwen3-Omni", random.Random(3), False)
    ids, mask, kwargs = split(batch)
    assert torch.equal(filled.get_rope_index(ids, mask, **kwargs)[0], full.get_rope_index(ids, mask, **kwargs)[0])


def test_a_config_whose_token_ids_disagree_with_the_processor_is_refused(manager):
    processor, _ = built("Qwen3-Omni")
    default = transformers.AutoConfig.for_model("qwen3_omni_moe")  # real-vocabulary ids, not the tiny ones
    with pytest.raises(InvalidInputError, match="image_token_id is 151655 but the processor's tokenizer uses"):
        RopeEngine.from_processor(processor, default, plugin_manager=manager)
    with pytest.raises(InvalidInputError, match="config given has 'qwen2_vl'"):
        RopeEngine.from_processor(processor, transformers.AutoConfig.for_model("qwen2_vl"), plugin_manager=manager)


# -- errors -------------------------------------------------------------------------------------

def audio_sample(processor, audio_tokens, frames, *, with_start=True):
    token = ids_of(processor)
    word = processor.tokenizer.convert_tokens_to_ids("cat")
    row = [word, token["vision_bos"], token["image"], token["vision_eos"], word]
    row += ([token["audio_bos"]] if with_start else [word]) + [token["audio"]] * audio_tokens + [token["audio_eos"], word]
    kwargs = {"image_grid_thw": torch.tensor([[1, 2, 2]]), "audio_seqlens": torch.tensor([frames])}
    return torch.tensor([row]), kwargs


@pytest.fixture(params=["fast", "reference"])
def qwen3_engine(manager, request):
    processor, config = built("Qwen3-Omni")
    return processor, RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation=request.param)


def test_an_audio_run_that_disagrees_with_its_mask(qwen3_engine):
    processor, engine = qwen3_engine
    ids, kwargs = audio_sample(processor, 10, 100)  # 100 mel frames make 13 audio tokens
    with pytest.raises(PlaceholderMismatchError, match="sample 0, audio 0: needs 13 placeholder tokens, found 10"):
        engine.get_rope_index(ids, **kwargs)


def test_a_missing_start_marker(qwen3_engine):
    processor, engine = qwen3_engine
    ids, kwargs = audio_sample(processor, 13, 100, with_start=False)
    with pytest.raises(PlaceholderMismatchError, match="sample 0: 13 image, video or audio placeholder tokens stand outside"):
        engine.get_rope_index(ids, **kwargs)


def test_use_audio_in_video_without_audio(qwen3_engine):
    processor, engine = qwen3_engine
    token = ids_of(processor)
    ids = torch.tensor([[token["vision_bos"]] + [token["video"]] * 2 + [token["vision_eos"]]])
    with pytest.raises(PlaceholderMismatchError, match="sample 0: a video at token 0 has no audio start marker"):
        engine.get_rope_index(ids, video_grid_thw=torch.tensor([[2, 2, 2]]), second_per_grids=torch.tensor([1.0]),
                              use_audio_in_video=True)


def test_audio_in_video_without_the_flag(qwen3_engine):
    _processor, engine = qwen3_engine
    batch = generated("Qwen3-Omni", random.Random(5), True, max_batch=1, max_items=1)
    ids, mask, kwargs = split(batch)
    if "video_grid_thw" not in kwargs:
        pytest.fail("generator gave no video for this seed; pick another seed")
    kwargs["use_audio_in_video"] = False
    with pytest.raises(PlaceholderMismatchError, match="use_audio_in_video is not set"):
        engine.get_rope_index(ids, mask, **kwargs)


def test_more_audios_than_masks(qwen3_engine):
    processor, engine = qwen3_engine
    ids, kwargs = audio_sample(processor, 13, 100)
    ids = torch.cat([ids, ids], dim=1)
    kwargs["image_grid_thw"] = torch.tensor([[1, 2, 2]] * 2)
    with pytest.raises(PlaceholderMismatchError, match="audio 1 of the batch has no entry in feature_attention_mask"):
        engine.get_rope_index(ids, **kwargs)


def omni_row(name, row, *, audio_frames=100):
    """One (1, L) row written as a string: t a word, [ ] vision start and end, ( ) audio start and
    end, i v a an image, video and audio token, A a whole audio clip of ``audio_frames`` mel
    frames (its markers and placeholders); { } < > a vision start and end and an audio start and
    end that open nothing (sampled in a response)."""
    from mmrope_qwen3_omni.audio import audio_token_counts

    processor, config = built(name)
    token = ids_of(processor)
    from mmrope_qwen3_omni.families import family_of

    audio = int(audio_token_counts(family_of(processor), config.thinker_config, "config_window",
                                   torch.tensor([audio_frames]))[0])
    row = row.replace("A", "(" + "a" * audio + ")")
    table = {"t": processor.tokenizer.convert_tokens_to_ids("cat"), "[": token["vision_bos"], "]": token["vision_eos"],
             "(": token["audio_bos"], ")": token["audio_eos"], "i": token["image"], "v": token["video"],
             "a": token["audio"], "{": token["vision_bos"], "}": token["vision_eos"], "<": token["audio_bos"],
             ">": token["audio_eos"]}
    return torch.tensor([[table[c] for c in row]])


@pytest.mark.parametrize("name, needed", [("Qwen3-Omni", 13), ("Qwen2.5-Omni", 25)])
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_an_audio_only_sample_whose_audio_run_disagrees_with_its_mask(manager, name, needed, impl):
    # no image or video grid: the reference places the batch as text, but the audio must fit its mask
    engine = RopeEngine.from_processor(*built(name), plugin_manager=manager, implementation=impl)
    frames = torch.tensor([100])  # 100 mel frames
    short = omni_row(name, "tt(" + "a" * 10 + ")t")
    with pytest.raises(PlaceholderMismatchError, match=f"sample 0, audio 0: needs {needed} placeholder tokens, found 10"):
        engine.get_rope_index(short, audio_seqlens=frames)
    fitting = omni_row(name, "ttAt")
    want = transformers_reference(name)(input_ids=fitting, attention_mask=torch.ones_like(fitting), audio_seqlens=frames)
    got = engine.get_rope_index(fitting, audio_seqlens=frames)
    assert got[0].dtype == want[0].dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


STRAY_ROWS = [
    "t[i]t{t",  # a vision start after the media, before text
    "t[i]tt{",  # ... ending the sequence
    "t{tt[i]t",  # before an image
    "t{[i]t",  # right before the image's own start marker
    "t[i]t<t",  # an audio start before text
    "t<t[i]tAt",  # ... before an audio clip
    "tA<[i]t{",
    "t[i]}tA>t",  # lone end markers
]


@pytest.mark.differential
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("row", STRAY_ROWS)
def test_a_start_marker_sampled_in_a_response_is_text(manager, name, row):
    """Placed as the reference places it where it places it, and everywhere as the same sequence
    with the marker read as text (the reference fails on some: a vision start ending the sequence,
    or before a later image in Qwen3-Omni, an audio start opening no audio)."""
    fast, _ = engines(manager, name)
    own = transformers_reference(name)
    kwargs = {"image_grid_thw": torch.tensor([[1, 2, 2]]), "audio_seqlens": torch.tensor([100] * row.count("A"))}
    if not row.count("A"):
        kwargs.pop("audio_seqlens")
    ids = omni_row(name, row)
    as_text = omni_row(name, row.translate(str.maketrans("{}<>", "tttt")))
    want = own(input_ids=as_text, attention_mask=torch.ones_like(as_text), **kwargs)
    got = fast.get_rope_index(ids, **kwargs)
    assert got[0].dtype == want[0].dtype and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    try:
        raw = own(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    except (IndexError, ValueError, TypeError, RuntimeError):
        return
    assert torch.equal(got[0], raw[0]) and torch.equal(got[1], raw[1])


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("row, kwargs, message", [
    ("t[i]t", {}, "image 0 of the batch has no entry in image_grid_thw"),
    ("t[i]t{tit", {"image_grid_thw": torch.tensor([[1, 2, 2]])}, "1 image, video or audio placeholder token stands outside"),
    ("tAt", {}, "audio 0 of the batch has no entry in feature_attention_mask"),
    ("t[i]t{t[i]t", {"image_grid_thw": torch.tensor([[1, 2, 2]])}, "image 1 of the batch has no entry in image_grid_thw"),
])
def test_placeholders_without_their_media_stay_errors(manager, name, row, kwargs, message):
    fast, _ = engines(manager, name)
    with pytest.raises(PlaceholderMismatchError, match=message):
        fast.get_rope_index(omni_row(name, row), **kwargs)


def test_collate_pads_audio_features_of_different_lengths(manager):
    processor, _ = built("Qwen3-Omni")
    fast, _ = engines(manager, "Qwen3-Omni")
    assert fast.varlen_keys == {"input_features", "feature_attention_mask"}
    audio = f"{processor.tokenizer.audio_bos_token}{processor.audio_token}{processor.tokenizer.audio_eos_token}"
    samples = [processor(text=[f"the {audio}"], audio=[np.zeros(16000 * s, dtype=np.float32)], return_tensors="pt")
               for s in (1, 3)]
    inputs = [{k: v for k, v in s.items() if k not in ("input_ids", "attention_mask")} for s in samples]
    batch = fast.collate(inputs)
    frames = [s["feature_attention_mask"].shape[-1] for s in samples]
    assert frames[0] != frames[1]
    assert batch["input_features"].shape[-1] == max(frames) and batch["feature_attention_mask"].shape == (2, max(frames))
    assert batch["feature_attention_mask"].sum(-1).tolist() == [int(s["feature_attention_mask"].sum()) for s in samples]


def test_from_pretrained_round_trip(manager, tmp_path):
    processor, config = built("Qwen2.5-Omni")
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    with processors_without_torchvision():
        engine = RopeEngine.from_pretrained(str(tmp_path), plugin_manager=manager)
    assert type(engine.processor).__name__ == "Qwen2_5OmniProcessor" and engine.implementation == "fast"
    batch = generated("Qwen2.5-Omni", random.Random(9), True)
    ids, mask, kwargs = split(batch)
    fast, _ = engines(manager, "Qwen2.5-Omni")
    assert torch.equal(engine.get_rope_index(ids, mask, **kwargs)[0], fast.get_rope_index(ids, mask, **kwargs)[0])


@pytest.mark.parametrize("kernel", ["batched", "batched in numpy", "reference"])
def test_a_keyword_the_thinker_does_not_take_is_refused_by_name(manager, monkeypatch, kernel):
    from mmrope_core import InvalidInputError, compiled

    if kernel == "batched in numpy":
        monkeypatch.setattr(compiled, "native", None)
    fast, reference = engines(manager, "Qwen3-Omni")
    engine = reference if kernel == "reference" else fast
    processor, _ = built("Qwen3-Omni")
    ids = torch.full((1, 4), processor.tokenizer.convert_tokens_to_ids("cat"))
    for call in (lambda: engine.get_rope_index(ids, fps=torch.tensor([1.0])),
                 lambda: engine.binding.kernel.position_ids(ids, None, image_grid=torch.ones(1, 3))):
        with pytest.raises(InvalidInputError, match=r"get_rope_index got '(fps|image_grid)', which the "
                                                    r"Omni thinker's get_rope_index does not take"):
            call()
    # through the engine, a keyword like one the thinker takes is named with it
    with pytest.raises(InvalidInputError, match=r"got 'second_per_grid_ts', .* did you mean 'second_per_grids'"):
        engine.get_rope_index(ids, second_per_grid_ts=torch.tensor([1.0]))


class WithoutLoops:
    """A kernel whose calls run with the compiled loops switched off: its numpy path."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getattr__(self, name):
        from mmrope_core import compiled

        def call(*args, **kwargs):
            with compiled.switched_off():
                return getattr(self.kernel, name)(*args, **kwargs)

        return call
