"""convention="vllm" and "sglang" for the model types mmrope-transformers binds: where vLLM 0.33 and
0.34 or SGLang 0.5.23 run one of them, they give every token transformers' position, and the
convention is transformers' positions under that name; elsewhere it is refused, saying why.

The cases in rollout_cases.json (prompts and multi-turn rollouts with every token's position) were
computed by the engines' own code, read from their wheels: ``python
benchmarks/transformers_rollouts.py --cases FILE``, once per vLLM release."""

import functools
import json
import random
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from mmrope_core import InvalidInputError, PluginManager, RopeEngine, UnknownConventionError
from mmrope_core.tiny import padded_batch
from mmrope_core.verify import verify
from mmrope_transformers import examples
from mmrope_transformers.layouts import LAYOUTS, random_batch

CASES = json.loads(Path(__file__).with_name("rollout_cases.json").read_text())


def present(names):
    return [name for name in names if name.split()[0] in transformers.CONFIG_MAPPING]


NAMED = [(name, index) for name in present(CASES) for index in range(len(CASES[name]))]
#: the model types of transformers 5.24 whose rollout conventions are transformers' positions
OFFERED = {"paddleocr_vl": ("vllm", "sglang"), "qwen4_exp": ("vllm", "sglang"), "cosmos3_omni": ("vllm", "sglang"),
           "cosmos3_edge": ("vllm", "sglang"), "cohere_compass": ("vllm",), "glm_ocr": ("vllm", "sglang"),
           "glmga": ("vllm",), "hy_v4_vl": ("vllm",), "minicpmv4_7": ("vllm", "sglang")}


@functools.cache
def built(model_type, canvas=True):
    processor, config = examples.build(examples.spec_of(model_type))
    if model_type == "minicpmv4_7" and canvas:  # as the engines need it: the checkpoint's config switches the canvas on
        config.mrope_mode = "canvas"
    return processor, config


@functools.cache
def engine(model_type, convention="transformers", implementation="fast", canvas=True):
    processor, config = built(model_type, canvas)
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reference-bound model types say so once
        return RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=convention,
                                         implementation=implementation)


def inputs_of(model_type, case):
    """``(input_ids, generated_mask, get_rope_index keyword arguments)`` of a case, ``(1, L)``."""
    tokenizer = built(model_type)[0].tokenizer
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(case["tokens"])])
    generated = torch.tensor([[int(flag) for flag in case["generated"]]])
    kwargs = {key: torch.tensor(value) for key, value in case.items() if key not in ("tokens", "generated", "positions")}
    return ids, generated, kwargs


@pytest.mark.differential
@pytest.mark.parametrize("name, index", NAMED)
def test_each_token_where_the_rollout_engine_put_it(name, index):
    model_type, release = name.split()
    case = CASES[name][index]
    rollout = engine(model_type, release)
    ids, generated, kwargs = inputs_of(model_type, case)
    positions, deltas = rollout.get_rope_index(ids, generated_mask=generated, **kwargs)
    assert positions[:, 0].tolist() == case["positions"]
    four = rollout.compute_position_ids(ids, None, kwargs, generated_mask=generated)
    assert four[0, 1:].tolist() == case["positions"] and four[0, 0].tolist() == list(range(ids.shape[1]))
    # transformers' positions, decoded tokens where a prefill of the whole sequence puts them
    theirs, their_deltas = engine(model_type).get_rope_index(ids, **kwargs)
    assert torch.equal(theirs, positions) and torch.equal(their_deltas, deltas)


@pytest.mark.differential
@pytest.mark.parametrize("name", present(CASES))
def test_padded_and_packed_batches_give_each_case_its_own(name):
    model_type, release = name.split()
    rollout = engine(model_type, release)
    cases = CASES[name]
    rows = [inputs_of(model_type, case) for case in cases]
    keys = {key for _, _, kwargs in rows for key in kwargs}
    kwargs = {key: torch.cat([row[2][key] for row in rows if key in row[2]]) for key in keys}
    lengths = [row[0].shape[1] for row in rows]
    for left in (False, True):
        ids, mask = padded_batch([row_ids[0].tolist() for row_ids, _, _ in rows], 0, left=left)
        generated, _ = padded_batch([row_generated[0].tolist() for _, row_generated, _ in rows], 0, left=left)
        positions, _ = rollout.get_rope_index(ids, mask, generated_mask=generated, **kwargs)
        for k, case in enumerate(cases):
            assert positions[:, k, mask[k].bool()].tolist() == case["positions"], (left, k)
    joined = torch.cat([row[0] for row in rows], dim=1)
    bounds = torch.tensor([0, *np.cumsum(lengths)])
    packed, _ = rollout.get_rope_index(joined, cu_seqlens=bounds, generated_mask=torch.cat([row[1] for row in rows], dim=1),
                                       **kwargs)
    for k, case in enumerate(cases):
        assert packed[:, 0, bounds[k]:bounds[k + 1]].tolist() == case["positions"]


@pytest.mark.parametrize("model_type", present(OFFERED))
def test_the_offered_conventions_bind_the_transformers_kernel_and_say_so(model_type):
    ours = engine(model_type)
    for alias in OFFERED[model_type]:
        rollout = engine(model_type, alias)
        assert rollout.implementation == ours.implementation
        assert rollout.binding.description.startswith(ours.binding.description)
        assert " convention" in rollout.binding.description
        assert rollout.binding.description.endswith("): transformers' positions" if alias == "vllm" else "convention: transformers' positions")
    # transformers' own get_rope_index computes them too
    reference = engine(model_type, OFFERED[model_type][0], "reference")
    assert reference.implementation == "reference"


REFUSED = [
    ("minicpmv4_7 without its canvas", "vllm", "the config does not switch the canvas on (mrope_mode='canvas' or "
                                               "uses_mrope_canvas=True), so the engine gives every token its index"),
    ("minicpmv4_7 without its canvas", "sglang", "the config does not switch the canvas on"),
    ("cohere_compass", "sglang", "SGLang 0.5.23 has no model of this type"),
    ("glmga", "sglang", "SGLang 0.5.23 has no model of this type"),
    ("hy_v4_vl", "sglang", "SGLang 0.5.23 has no model of this type"),
    ("hunyuan_vl", "sglang", "SGLang 0.5.23 has no model of this type"),
    ("hunyuan_vl", "vllm", "computes each request alone, while HunYuan-VL's get_rope_index"),
    ("ernie4_5_vl_moe", "sglang", "reads the original checkpoints' config (im_patch_id, spatial_conv_size)"),
    ("ernie4_5_vl_moe", "vllm-0.33", "reads the original checkpoints' config (spatial_conv_size, temporal_conv_size)"),
    ("glm_image", "sglang", "decodes the generated tokens on the target image's grid"),
    ("glm_image", "vllm", "at its index plus the prompt's delta, which GLM-Image's get_rope_index gives as 0"),
]


@pytest.mark.parametrize("name, convention, why", [case for case in REFUSED if present([case[0]])])
def test_a_convention_an_engine_does_not_run_or_mmrope_cannot_follow_is_refused_saying_why(name, convention, why):
    """(MiniCPM-V 4.7: the engines' canvas follows a switch of the checkpoint's config, which
    transformers' default config leaves out.)"""
    model_type = name.split()[0]
    with pytest.raises(UnknownConventionError, match=f"not offered by {model_type} .*{re.escape(why)}.*it offers "
                                                     f"'transformers'"):
        engine(model_type, convention, canvas=name == model_type)


@pytest.mark.parametrize("model_type", [model_type for model_type in present(OFFERED)
                                        if examples.spec_of(model_type).video_processor and model_type in LAYOUTS
                                        and LAYOUTS[model_type][1] is not None])
def test_a_video_is_refused_exactly_where_the_engine_takes_none(model_type):
    """vLLM's Cohere-Compass takes images only: no rollout holds a video, and its convention
    refuses one, naming the sample; every other offered convention places videos as transformers."""
    processor, config = built(model_type)
    rng = random.Random(4)
    while True:
        batch = random_batch(model_type, processor, config, rng, samples=3)
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        types = torch.tensor(processor.create_mm_token_type_ids(ids.tolist())) * mask
        if (types == 2).any():
            break
    first = int((types == 2).any(1).nonzero()[0])
    want = engine(model_type).get_rope_index(ids, mask, **batch)
    for alias in OFFERED[model_type]:
        rollout = engine(model_type, alias)
        if (model_type, alias) != ("cohere_compass", "vllm"):
            assert all(torch.equal(a, b) for a, b in zip(rollout.get_rope_index(ids, mask, **batch), want))
            continue
        with pytest.raises(InvalidInputError, match=f"sample {first}, video_grid_thw: vLLM 0.34 takes no videos of "
                                                    f"model type 'cohere_compass'.*convention='transformers'"):
            rollout.get_rope_index(ids, mask, **batch)
        with pytest.raises(InvalidInputError, match="takes no videos"):
            rollout.compute_position_ids(ids, mask, batch)


def test_a_model_type_no_engine_was_measured_on_offers_transformers_alone():
    """A model type this plugin binds that the table does not name (here Qwen2-VL, whose family
    plugin knows the engines' rules, bound by this plugin alone)."""
    spec = examples.spec_of("qwen2_vl")
    processor, config = examples.build(spec)
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"})
    with pytest.raises(UnknownConventionError, match=re.escape("mmrope has not measured vLLM 0.33's positions for "
                                                               "model type 'qwen2_vl'")):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm")


@pytest.mark.parametrize("model_type, offered", [
    (model_type, offered) for model_type, offered in (("qwen4_exp", ["vllm-0.34", "sglang-0.5.23"]),
                                                      ("glm_ocr", ["vllm-0.34", "sglang-0.5.23"]),
                                                      ("hy_v4_vl", ["vllm-0.34"]), ("hunyuan_vl", []))
    if present([model_type])])
def test_mmrope_verify_reports_these_conventions(model_type, offered):
    processor, config = built(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = verify(processor, config, samples=12, plugin_manager=PluginManager(
            env={"MMROPE_LOAD_PLUGINS": "transformers"}))
    assert report.fast_agrees and report.checked == ["transformers", *offered]
    assert all(comparison.differ == 0 for comparison in report.conventions)
    assert set(report.not_offered) == {"vLLM", "SGLang"} - {"vLLM" if "vllm-0.34" in offered else "",
                                                            "SGLang" if "sglang-0.5.23" in offered else ""}
    assert any("either convention trains on" in line for line in report.advice()) == bool(offered)
