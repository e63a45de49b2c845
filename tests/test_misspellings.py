"""What a newcomer mistypes: a media key, a keyword argument, a key that is not a string. Each
is a typed error naming what was given and what was probably meant; keys that resemble nothing
a family reads pass, as processors return many."""

import functools
import random

import pytest
import torch

from mmrope_core import (
    InvalidInputError,
    RopeEngine,
    UnknownInputKeyError,
    UnknownKeywordError,
    get_plugin_manager,
)
from mmrope_core._names import resembles
from mmrope_core.collators import PackedCollator, PaddedCollator


@functools.cache
def family(name):
    """An engine of the installed family ``name`` and one batch of its real processor's outputs,
    every key the processor returned included."""
    case = next(case for _, cases in get_plugin_manager().results("example_cases") for case in cases if case.name == name)
    processor, config = case.build()
    engine = RopeEngine.from_processor(processor, config)
    outputs = [engine.process(**sample) for sample in case.samples(processor, random.Random(0))]
    input_ids, attention_mask, inputs = engine.batch(outputs)
    return engine, input_ids, attention_mask, {**inputs, "input_ids": input_ids, "attention_mask": attention_mask}


FAMILIES = {"Qwen2-VL": "image_grid_thw", "Qwen3-VL": "image_grid_thw", "GLM-4V": "image_grid_thw",
            "Qwen3-Omni": "feature_attention_mask", "Qwen2.5-Omni": "image_grid_thw",
            "MiniCPM-V 4.7 (minicpmv4_7)": "target_sizes", "GLM-Image (glm_image)": "images_per_sample"}


def typos(key):
    """``key`` in another case, with a letter dropped, two letters swapped, a word dropped."""
    words = key.split("_")
    dropped = ["_".join(words[1:]), "_".join(words[:-1])]
    return [key.upper(), key[:-1], key[:3] + key[4] + key[3] + key[5:], *(word for word in dropped if "_" in word)]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_whole_processor_output_is_accepted_with_keys_nobody_reads(name):
    engine, ids, mask, outputs = family(name)
    expected = engine.compute_position_ids(ids, mask, outputs)
    unrelated = {**outputs, "images": ["a picture"], "video_metadata": None, "pixel_values_videos": None,
                 "source": "dataset row 3", "moe_mm_token_type_ids": outputs.get("mm_token_type_ids")}
    assert torch.equal(engine.compute_position_ids(ids, mask, unrelated), expected)


@pytest.mark.parametrize("name, key", FAMILIES.items())
def test_a_misspelt_media_key_is_named_with_the_key_meant(name, key):
    engine, ids, mask, outputs = family(name)
    assert key in outputs
    for typo in [typo for typo in typos(key) if typo not in outputs]:  # attention_mask is the batch's own
        given = {typo if k == key else k: v for k, v in outputs.items()}
        with pytest.raises(UnknownInputKeyError, match=rf"multi_modal_inputs holds {typo!r}, which plugin \w+ .* "
                                                       rf"did you mean (.* or )?{key!r}"):
            engine.compute_position_ids(ids, mask, given)


@pytest.mark.parametrize("name", FAMILIES)  # (every one M-RoPE)
def test_a_misspelt_keyword_of_get_rope_index_is_named_with_the_input_meant(name):
    """The model's own get_rope_index keywords, as a caller passes them: a misspelt one is named,
    never dropped to give other positions."""
    engine, ids, mask, outputs = family(name)
    kwargs = engine.rope_index_kwargs(outputs)
    expected = engine.get_rope_index(ids, mask, **kwargs)
    read = [key for key in kwargs if key in engine.binding.kernel.input_keys]
    assert read, "the kernel says which inputs it reads"
    for key in read:
        for typo in [typo for typo in typos(key) if typo not in kwargs]:
            given = {typo if k == key else k: v for k, v in kwargs.items()}
            with pytest.raises(UnknownInputKeyError, match=rf"get_rope_index\(\) got {typo!r}, .* did you mean "
                                                           rf"(.* or )?{key!r}"):
                engine.get_rope_index(ids, mask, **given)
    assert all(torch.equal(a, b) for a, b in zip(engine.get_rope_index(ids, mask, **kwargs), expected))


def test_the_newcomers_grid_thw_names_both_grids():
    engine, ids, mask, outputs = family("Qwen2-VL")
    given = {"grid_thw": outputs["image_grid_thw"]}
    with pytest.raises(UnknownInputKeyError, match=r"'grid_thw', .* did you mean 'image_grid_thw' or 'video_grid_thw'"):
        engine.compute_position_ids(ids, mask, given)
    assert list(given) == ["grid_thw"]  # the caller's dict is not changed


def test_a_misspelt_processor_argument_is_named():
    engine, ids, mask, outputs = family("Qwen3-Omni")
    with pytest.raises(UnknownInputKeyError, match=r"mm_processor_kwargs holds 'use_audio_in_vidoe', .* "
                                                   r"did you mean 'use_audio_in_video'"):
        engine.compute_position_ids(ids, mask, outputs, {"use_audio_in_vidoe": True})
    engine.compute_position_ids(ids, mask, outputs, {"use_audio_in_video": False, "fps": 2, "return_tensors": "pt"})


@pytest.mark.parametrize("where, named", [("multi_modal_inputs", "multi_modal_inputs"),
                                         ("mm_processor_kwargs", "mm_processor_kwargs")])
def test_a_key_that_is_not_a_string_is_an_input_error(where, named):
    engine, ids, mask, outputs = family("Qwen3-Omni")
    arguments = {"multi_modal_inputs": outputs, "mm_processor_kwargs": None, where: {**outputs, 3: torch.ones(1)}}
    with pytest.raises(InvalidInputError, match=rf"{named} has the key 3 \(int\); keys must be strings"):
        engine.compute_position_ids(ids, mask, **arguments)


def test_a_sample_key_that_is_not_a_string_is_an_input_error():
    engine, ids, _, _ = family("Qwen2-VL")
    with pytest.raises(InvalidInputError, match=r"sample 1 has the key \('image', 0\) \(tuple\); keys must be strings"):
        PaddedCollator(engine)([{"input_ids": ids[0]}, {"input_ids": ids[1], ("image", 0): 1}])


@pytest.mark.parametrize("call, keyword, meant", [
    (lambda engine, ids: engine.compute_position_ids(ids, None, cu_seqlen=torch.tensor([0, 2])), "cu_seqlen",
     "cu_seqlens"),
    (lambda engine, ids: engine.compute_position_ids(ids, None, segment_id=None), "segment_id", "segment_ids"),
    (lambda engine, ids: engine.compute_position_ids(ids, attention_masks=None), "attention_masks", "attention_mask"),
    (lambda engine, ids: engine.batch([], padding="left"), "padding", "padding_side"),
    (lambda engine, ids: engine.get_rope_index(ids, cu_seqlen=torch.tensor([0, 2])), "cu_seqlen", "cu_seqlens"),
    (lambda engine, ids: engine.get_rope_index(ids, generated_masks=None), "generated_masks", "generated_mask"),
    (lambda engine, ids: PackedCollator(engine, max_len=4), "max_len", "max_length"),
    (lambda engine, ids: PackedCollator(engine, flash_attention_kwargs=True), "flash_attention_kwargs",
     "flash_attn_kwargs"),
    (lambda engine, ids: PaddedCollator(engine, padding="left"), "padding", "padding_side"),
    (lambda engine, ids: PaddedCollator(engine, mm_processor_kwarg={}), "mm_processor_kwarg", "mm_processor_kwargs"),
    (lambda engine, ids: PackedCollator(engine)(sample=[{"input_ids": ids}]), "sample", "samples"),
])
def test_a_misspelt_keyword_names_the_keyword_meant(call, keyword, meant):
    engine, ids, _, _ = family("Qwen2-VL")
    with pytest.raises(UnknownKeywordError, match=rf"got an unknown keyword argument {keyword!r}; did you mean "
                                                  rf"{meant!r}\? It takes ") as raised:
        call(engine, ids)
    assert isinstance(raised.value, TypeError)  # where Python's own error was caught before, it still is


def test_a_keyword_like_no_other_is_named_without_a_guess():
    engine, ids, _, _ = family("Qwen2-VL")
    with pytest.raises(UnknownKeywordError, match=r"'zzz'\. It takes input_ids, attention_mask, multi_modal_inputs"):
        engine.compute_position_ids(ids, None, zzz=1)


@pytest.mark.parametrize("given, known, expected", [
    ("grid_thw", "image_grid_thw", True), ("image_grid", "image_grid_thw", True),
    ("Image_Grid_THW", "image_grid_thw", True), ("image_grid_thv", "image_grid_thw", True),
    ("imgae_grid_thw", "image_grid_thw", True), ("second_per_grid_ts", "second_per_grids", True),
    ("attention_mask", "feature_attention_mask", True),  # (the engine never asks about attention_mask)
    ("images", "images_per_sample", False), ("pixel_values_videos", "video_grid_thw", False),
    ("moe_mm_token_type_ids", "mm_token_type_ids", False), ("fps", "fp", False), ("image_sizes", "image_grid_thw", False),
])
def test_what_resembles_what(given, known, expected):
    assert resembles(given, known) is expected
