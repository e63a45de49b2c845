"""The media keys the engine reads are the ones a plugin declares (``batch_layout``), whatever
their names: a third-party family's grids and seconds get the checks the shipped families' get,
and a key no plugin declares is passed on unread."""

import pytest
import torch

from mmrope_core import (
    BatchLayout,
    InvalidInputError,
    MediaKey,
    PlaceholderMismatchError,
    RopeBinding,
    RopeEngine,
    hookimpl,
)
from mmrope_core.batching import GRID, IMAGE_GRID, VIDEO_GRID
from mmrope_core.kernel import RopeKernel

#: A clip family's keys, named as no shipped family names them.
CLIP_KEYS = {"clip_patches": GRID, "clip_timing": MediaKey(role="seconds", grid="clip_patches"),
             "clip_sound": MediaKey(role="audio_lengths"), "clip_sound_mask": MediaKey(role="audio_mask")}


class ClipProcessor:
    pass


class RecordingKernel(RopeKernel):
    """Sequential positions in three rows; keeps the keyword inputs of each call as given to it."""

    def __init__(self):
        self.inputs = []

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        self.inputs.append(inputs)
        positions = torch.arange(input_ids.shape[1]).expand(3, *input_ids.shape).clone()
        return positions, torch.zeros(input_ids.shape[0], 1, dtype=torch.long)


class ClipPlugin:
    """A third-party plugin: the family's keys, declared through ``batch_layout``."""

    def __init__(self):
        self.kernel = RecordingKernel()

    @hookimpl
    def bind_rope_index(self, processor):
        return RopeBinding("mrope", self.kernel, "fast") if isinstance(processor, ClipProcessor) else None

    @hookimpl
    def get_rope_index_kwargs(self, processor, multi_modal_inputs):
        if not isinstance(processor, ClipProcessor):
            return None
        return {key: value for key, value in multi_modal_inputs.items() if key in (*CLIP_KEYS, "image_grid_thw")}

    @hookimpl
    def batch_layout(self, processor):
        return BatchLayout(media=CLIP_KEYS) if isinstance(processor, ClipProcessor) else None


@pytest.fixture
def clip(toy_manager):
    plugin = ClipPlugin()
    with toy_manager.registered(plugin, "clip"):
        yield RopeEngine.from_processor(ClipProcessor(), plugin_manager=toy_manager), plugin.kernel


IDS = torch.ones(1, 16, dtype=torch.long)
GOOD = {"clip_patches": torch.tensor([[2, 2, 2], [1, 2, 2]], dtype=torch.uint8), "clip_timing": [0.5, 2.0],
        "clip_sound": [40], "clip_sound_mask": torch.ones(1, 40, dtype=torch.int32)}


def test_declared_keys_reach_the_kernel_read(clip):
    engine, kernel = clip
    engine.compute_position_ids(IDS, None, GOOD)
    engine.get_rope_index(IDS, **GOOD)
    for given in kernel.inputs:
        assert given["clip_patches"].dtype == torch.int64 and given["clip_patches"].tolist() == [[2, 2, 2], [1, 2, 2]]
        assert given["clip_timing"].dtype == torch.float32 and given["clip_timing"].tolist() == [0.5, 2.0]
        assert given["clip_sound"].dtype == torch.int64 and given["clip_sound"].tolist() == [40]
        assert torch.equal(given["clip_sound_mask"], GOOD["clip_sound_mask"])


@pytest.mark.parametrize(("key", "value", "error", "message"), [
    ("clip_patches", [[1, 2, 2]], InvalidInputError, r"clip_patches must be a tensor of shape \(N, 3\), got list"),
    ("clip_patches", torch.tensor([[1, 0, 2]]), InvalidInputError, r"clip_patches row 0 is \(1, 0, 2\): every size"),
    ("clip_patches", torch.tensor([[64, 2, 2], [1, 2, 2]]), PlaceholderMismatchError, r"clip_patches row 0 is \(64, 2, 2\): the "
                                                                            r"grids up to it need more placeholder"),
    ("clip_timing", [1.0], InvalidInputError, "clip_timing has 1 value for 2 videos in clip_patches; pass one value"),
    ("clip_timing", [1.0, float("nan")], InvalidInputError, "clip_timing holds a non-finite value"),
    ("clip_sound", [-1], InvalidInputError, "clip_sound .* holds a negative or impossible length"),
    ("clip_sound_mask", torch.ones(40), InvalidInputError, r"clip_sound_mask must be an integer or bool tensor of "
                                                           r"shape \(audios, frames\)"),
])
def test_declared_keys_get_the_checks_of_their_role(clip, key, value, error, message):
    engine, kernel = clip
    bad = {**GOOD, key: value}
    calls = [lambda: engine.compute_position_ids(IDS, None, bad), lambda: engine.get_rope_index(IDS, **bad)]
    if error is not PlaceholderMismatchError:  # (sizes are measured against a batch's tokens)
        calls.append(lambda: engine.rope_index_kwargs(bad))
    for call in calls:
        with pytest.raises(error, match=message):
            call()
    assert not kernel.inputs


def test_a_key_the_plugin_does_not_declare_is_passed_on_unread(clip):
    engine, kernel = clip
    not_a_grid = torch.tensor([1.5])  # what a grid of that name would be refused for
    engine.compute_position_ids(IDS, None, {"image_grid_thw": not_a_grid})
    engine.get_rope_index(IDS, image_grid_thw=not_a_grid)
    assert [list(given) for given in kernel.inputs] == [["image_grid_thw"]] * 2
    assert all(torch.equal(given["image_grid_thw"], not_a_grid) for given in kernel.inputs)


def test_keys_declaring_only_their_role_are_batched_the_common_way(clip):
    engine, _ = clip
    batch = engine.collate([{"clip_timing": [0.5], "clip_patches": torch.tensor([[1, 2, 2]])},
                            {"clip_timing": [2.0], "clip_patches": torch.tensor([[2, 2, 2]])}])
    assert batch["clip_timing"] == [0.5, 2.0] and batch["clip_patches"].tolist() == [[1, 2, 2], [2, 2, 2]]


def test_a_layout_checks_its_roles():
    with pytest.raises(TypeError, match="role must be one of"):
        MediaKey(role="length")
    with pytest.raises(TypeError, match="needs grid"):
        MediaKey(role="seconds")
    with pytest.raises(TypeError, match="other roles take no grid"):
        MediaKey(role="grid", grid="video_grid_thw")
    with pytest.raises(TypeError, match="declare 'clip_patches' too"):
        BatchLayout(media={"clip_timing": MediaKey(role="seconds", grid="clip_patches")})
    strips = BatchLayout(media={"pixel_values": MediaKey(join="last")})
    both = strips.with_media({"pixel_values": MediaKey(role="audio_mask"), "clip_patches": GRID})
    assert both.media["pixel_values"] == MediaKey(join="last", role="audio_mask")
    assert both.media["clip_patches"] == GRID and not both.media["pixel_values"].common_batching


def test_a_layout_says_which_media_item_each_key_holds_one_entry_of():
    with pytest.raises(TypeError, match="medium must be one of"):
        MediaKey(role="grid", medium="panel")
    with pytest.raises(TypeError, match="holds one entry per audio: its medium is 'audio', not 'video'"):
        MediaKey(role="audio_lengths", medium="video")
    with pytest.raises(TypeError, match="counts the video items of 'clip_patches': its medium is 'video', not 'image'"):
        BatchLayout(media={"clip_patches": VIDEO_GRID, "clip_timing": MediaKey(role="seconds", grid="clip_patches",
                                                                               medium="image")})
    layout = BatchLayout(media={**CLIP_KEYS, "clip_patches": VIDEO_GRID, "stills": IMAGE_GRID,
                                "pixel_values": MediaKey(items_dim=1)})
    assert {key: layout.medium_of(key) for key in (*layout.media, "undeclared")} == {
        "clip_patches": "video", "clip_timing": "video", "clip_sound": "audio", "clip_sound_mask": "audio",
        "stills": "image", "pixel_values": None, "undeclared": None}
    assert BatchLayout(media=CLIP_KEYS).medium_of("clip_timing") is None  # its grid says none
    assert MediaKey(role="grid", medium="image").common_batching  # the medium does not change how it is batched
    merged = BatchLayout(media={"pixel_values": MediaKey(items_dim=1)}).with_media(
        {"pixel_values": MediaKey(medium="image")})
    assert merged.media["pixel_values"] == MediaKey(items_dim=1, medium="image")


@pytest.mark.parametrize(("family", "keys"), [
    ("Qwen2.5-VL", {"image_grid_thw": "grid", "video_grid_thw": "grid", "second_per_grid_ts": "seconds"}),
    ("Qwen2-VL", {"image_grid_thw": "grid", "video_grid_thw": "grid"}),
])
def test_the_qwen_vl_plugin_declares_its_families_keys(family, keys):
    from mmrope_qwen_vl.examples import build

    engine = RopeEngine.from_processor(*build(family))
    assert {key: rule.role for key, rule in engine.batch_layout.media.items()} == keys
    assert engine.plugin_name == "qwen_vl"


def test_the_qwen_vl_plugin_declares_no_keys_for_a_model_type_another_plugin_binds():
    import types

    import mmrope_qwen_vl
    from mmrope_qwen_vl.examples import build

    processor, config = build("Qwen3-VL")  # Qwen3VLProcessor feeds Cosmos3-Omni too, bound by the transformers plugin
    assert mmrope_qwen_vl.batch_layout(processor, types.SimpleNamespace(model_type="cosmos3_omni")) is None
    assert mmrope_qwen_vl.batch_layout(processor, config).media == {"image_grid_thw": IMAGE_GRID,
                                                                    "video_grid_thw": VIDEO_GRID}


def test_the_transformers_plugin_declares_which_media_its_references_arguments_hold():
    """transformers names its ``get_rope_index`` arguments by the media they hold one entry of
    each: the plugin declares that, and the core never reads the names."""
    from mmrope_transformers.bind import Bound

    arguments = {"image_grid_thw", "video_grid_thw", "second_per_grids", "audio_seqlens", "images_per_sample",
                 "downsample_mode", "target_sizes", "target_sizes_videos", "use_audio_in_video"}
    layout = BatchLayout(media=Bound(frozenset(arguments)).media_keys)
    assert {key: layout.medium_of(key) for key in sorted(arguments)} == {
        "audio_seqlens": "audio", "downsample_mode": None, "image_grid_thw": "image", "images_per_sample": None,
        "second_per_grids": "video", "target_sizes": "image", "target_sizes_videos": "video", "video_grid_thw": "video",
        "use_audio_in_video": None}
    assert layout.media["audio_seqlens"].role == "audio_lengths" and "images_per_sample" not in layout.media


class FlawedKernel(RecordingKernel):
    """A planted flaw: an untyped error on any grid or seconds but the example's own."""

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
        patches, timing = inputs.get("clip_patches"), inputs.get("clip_timing")
        if (patches is not None and patches.tolist() != GOOD["clip_patches"].tolist()) or (
                timing is not None and timing.tolist() != GOOD["clip_timing"]):
            raise IndexError("index 7 is out of bounds")
        return super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens, **inputs)


def test_the_fuzzer_mutates_the_keys_a_plugin_declares_and_finds_a_flaw_there(toy_manager, tmp_path):
    import random

    from mmrope_core.testing._fuzzer import _Fuzzer, _RandomChoices, _Subjects
    from mmrope_core.testing._mutations import Case

    plugin = ClipPlugin()
    plugin.kernel = FlawedKernel()
    with toy_manager.registered(plugin, "clip"):
        engine = RopeEngine.from_processor(ClipProcessor(), plugin_manager=toy_manager)
        fuzzer = _Fuzzer("clip", str(tmp_path / "trace"))
        fuzzer.subjects["Clip"] = _Subjects(engine, None, None)
        base = Case("Clip", "position_ids", IDS, None, dict(GOOD), {}, media=engine.batch_layout.media)
        fuzzer.check(base, ())
        assert fuzzer.findings == []  # the example itself is flawless
        choices = _RandomChoices(random.Random(7))
        for _ in range(300):
            fuzzer.one([[base]], choices)
    flawed = [finding for finding in fuzzer.findings if finding.rule == "bad input raises a typed input error"]
    assert flawed, fuzzer.findings
    assert all("IndexError" in finding.detail for finding in flawed)
    mutated = {name.split("[")[0].split(" ")[0] for finding in flawed for name in finding.mutations[1:]}
    assert {"clip_patches", "clip_timing"} <= mutated, mutated
    trace = (tmp_path / "trace").read_text()
    for kind in ("clip_sound ", "clip_sound_mask "):  # the audio mutations reach the keys of their roles too
        assert kind in trace


def test_time_stamps_hold_one_entry_a_frame_and_no_medium_of_their_own():
    layout = BatchLayout(media={"panel_grid": MediaKey(role="grid", medium="video"),
                                "panel_times": MediaKey(role="stamps", grid="panel_grid")})
    assert layout.medium_of("panel_grid") == "video" and layout.medium_of("panel_times") is None
    with pytest.raises(TypeError, match="holds one entry per frame of its grid, not per item: it takes no medium"):
        MediaKey(role="stamps", grid="panel_grid", medium="video")
