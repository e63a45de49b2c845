"""convention="sglang": the positions SGLang 0.5.23 gives each token of a rollout, for the Qwen-VL
families. The cases in sglang_cases.json (prompts and multi-turn rollouts, their positions and
delta) were computed by SGLang's own code, read from its wheel: ``python
benchmarks/sglang_side_by_side.py --cases`` (see sglang_anchor.py)."""

import dataclasses
import functools
import json
import random
from pathlib import Path

import pytest
import torch

from mmrope_core import InvalidInputError, PluginManager, RopeEngine, UnknownConventionError
from mmrope_core.testing._recorded import Recorded, assert_batches_reproduce
from mmrope_qwen_vl.examples import build
from mmrope_qwen_vl.families import TRANSFORMERS_RULES
from mmrope_qwen_vl.samples import random_batch

CASES = json.loads(Path(__file__).with_name("sglang_cases.json").read_text())
NAMED = [(name, index) for name, cases in CASES.items() for index in range(len(cases))]


@functools.cache
def engine(name, convention="sglang", tokens_per_second=None):
    processor, config = build(name)
    if tokens_per_second is not None:
        config.vision_config.tokens_per_second = tokens_per_second
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    return RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=convention)


def symbols(processor):
    """The token of each symbol of the cases: t text, [ ] vision start and end (GLM: begin and end
    of image), i v image and video tokens, { } GLM's begin and end of video."""
    tokenizer = processor.tokenizer
    if hasattr(tokenizer, "vision_start_token"):
        names = {"[": tokenizer.vision_start_token, "]": tokenizer.vision_end_token}
    else:
        names = {"[": tokenizer.begin_of_image_token, "]": tokenizer.end_of_image_token,
                 "{": tokenizer.begin_of_video_token, "}": tokenizer.end_of_video_token}
    table = {symbol: tokenizer.convert_tokens_to_ids(token) for symbol, token in names.items()}
    return table | {"t": tokenizer.convert_tokens_to_ids("cat"), "i": processor.image_token_id,
                    "v": processor.video_token_id}


def inputs_of(name, case):
    """``(input_ids, generated_mask, get_rope_index keyword arguments)`` of a case, ``(1, L)``."""
    table = symbols(engine(name).processor)
    ids = torch.tensor([[table[symbol] for symbol in case["tokens"]]])
    generated = torch.tensor([[int(flag) for flag in case["generated"]]])
    kwargs = {key: torch.tensor(case[key]) for key in ("image_grid_thw", "video_grid_thw") if case[key]}
    if case["seconds"]:
        kwargs["second_per_grid_ts"] = torch.tensor(case["seconds"], dtype=torch.float32)
    return ids, generated, kwargs


def case_engine(name, case):
    return engine(name, tokens_per_second=case.get("tokens_per_second"))


@pytest.mark.differential
@pytest.mark.parametrize("name, index", NAMED)
def test_each_token_where_sglang_put_it(name, index):
    case = CASES[name][index]
    sglang = case_engine(name, case)
    ids, generated, kwargs = inputs_of(name, case)
    positions, deltas = sglang.get_rope_index(ids, generated_mask=generated, **kwargs)
    assert positions[:, 0].tolist() == case["positions"] and deltas.tolist() == [[case["delta"]]]
    four = sglang.compute_position_ids(ids, None, kwargs, generated_mask=generated)
    assert four[0, 1:].tolist() == case["positions"] and four[0, 0].tolist() == list(range(ids.shape[1]))
    # integer positions, text resuming past each item: decoding places tokens where a prefill does
    whole, whole_deltas = sglang.get_rope_index(ids, **kwargs)
    assert torch.equal(whole, positions) and torch.equal(whole_deltas, deltas)


def recorded(name, cases):
    """``(Recorded sequences, get_rope_index keyword arguments of them all)`` of the cases."""
    rows = [inputs_of(name, case) for case in cases]
    kwargs = {key: torch.cat([row[2][key] for row in rows if key in row[2]])
              for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts") if any(key in row[2] for row in rows)}
    return [Recorded(ids[0].tolist(), generated[0].tolist(), case["positions"], case["delta"])
            for (ids, generated, _), case in zip(rows, cases)], kwargs


@pytest.mark.differential
@pytest.mark.parametrize("name", CASES)
def test_padded_and_packed_batches_give_each_case_its_own(name):
    assert_batches_reproduce(engine(name), *recorded(name, [case for case in CASES[name] if "tokens_per_second" not in case]))


def test_sglang_multiplies_frame_numbers_by_the_seconds_first():
    """At 25 tokens per second and 1.65 s a frame, frame 12's temporal id is 494 in SGLang (float32
    (12 * 1.65) * 25), 495 in transformers >= 5.11 (float32 12 * (25 * 1.65); 5.10 truncates the
    seconds first: 300) and 494 in vLLM (float64): the case's positions come from SGLang's code."""
    case = next(case for case in CASES["Qwen2.5-VL"] if case.get("tokens_per_second") == 25)
    ids, _, kwargs = inputs_of("Qwen2.5-VL", case)
    frame_12 = case["tokens"].index("v") + 12
    sglang = case_engine("Qwen2.5-VL", case)
    transformers = engine("Qwen2.5-VL", "transformers", 25)
    vllm = engine("Qwen2.5-VL", "vllm", 25)
    start = case["tokens"].index("v")
    assert case["positions"][0][frame_12] - start == 494
    theirs = int(transformers.get_rope_index(ids, **kwargs)[0][0, 0, frame_12]) - start
    scaled, whole_seconds = (dataclasses.replace(rule, per_second=25) for rule in TRANSFORMERS_RULES)
    assert theirs == {scaled: 495, whole_seconds: 300}[transformers.binding.kernel.family.temporal]
    assert int(vllm.get_rope_index(ids, **kwargs)[0][0, 0, frame_12]) - start == 494
    assert sglang.binding.kernel.family.temporal.order == "frame_first"
    assert int(sglang.get_rope_index(ids, **kwargs)[0][0, 0, frame_12]) - start == 494


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL"])
def test_sglang_resumes_text_past_a_runs_largest_position_as_vllm(name):
    """Qwen2-VL's and Qwen2.5-VL's text after a video: one past its largest position on any axis,
    vLLM's rule (transformers resumes max(h, w) past the video's start)."""
    rng = random.Random(f"sglang {name}")
    differ = 0
    for index in range(30):
        batch = random_batch(engine(name).processor, rng, max_batch=4, max_frames=8)
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        kwargs = {key: value for key, value in batch.items() if value is not None}
        got = engine(name).get_rope_index(ids, mask, **kwargs)
        vllm = engine(name, "vllm").get_rope_index(ids, mask, **kwargs)
        theirs = engine(name, "transformers").get_rope_index(ids, mask, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, vllm)), f"batch {index}"
        differ += not torch.equal(got[0], theirs[0])
    assert differ > 0


def test_the_convention_names_and_what_is_refused():
    sglang = engine("Qwen3-VL")
    assert sglang.convention == "sglang-0.5.23" and repr(sglang).endswith("SGLang 0.5.23 convention)")
    assert engine("Qwen3-VL", "sglang-0.5.23").binding.kernel.family == sglang.binding.kernel.family
    processor, config = build("Qwen3.5")
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    with pytest.raises(UnknownConventionError, match="implementation='reference' is transformers' own"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="sglang",
                                  implementation="reference")
    with pytest.raises(UnknownConventionError, match=r"'sglang-0.4.0' is unknown; Qwen3-VL offers 'transformers', "
                                                     r"'vllm-0.33', 'vllm-0.34', 'sglang-0.5.23'"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="sglang-0.4.0")
    ids, _, kwargs = inputs_of("Qwen2-VL", CASES["Qwen2-VL"][0])
    with pytest.raises(InvalidInputError, match="generated_mask marks the first token of sample 0"):
        engine("Qwen2-VL").get_rope_index(ids, generated_mask=torch.ones_like(ids), **kwargs)
