"""convention="vllm": the positions vLLM 0.33 and 0.34 give each token of the Qwen-VL families'
prompts and multi-turn rollouts. The cases in vllm_cases.json (``"<family> vllm-X.Y"``) were
computed by vLLM's own code, read from its wheels: ``python benchmarks/vllm_side_by_side.py
--source DIR --cases FILE``, once per release (see vllm_cases.py)."""

import functools
import json
from pathlib import Path

import pytest
import torch
from test_sglang_convention import inputs_of, recorded

from mmrope_core import PluginManager, RopeEngine
from mmrope_core.testing._recorded import assert_batches_reproduce
from mmrope_qwen_vl.examples import build

CASES = json.loads(Path(__file__).with_name("vllm_cases.json").read_text())
NAMED = [(key, index) for key, cases in CASES.items() for index in range(len(cases))]
NEWEST = max({key.split()[-1] for key in CASES}, key=lambda release: tuple(map(int, release[5:].split("."))))


@functools.cache
def engine(name, convention):
    processor, config = build(name)
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    return RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=convention)


def conventions(key):
    """The convention names the release of ``key`` answers to: its own, and "vllm" for the newest."""
    release = key.split()[-1]
    return [release, "vllm"] if release == NEWEST else [release]


@pytest.mark.differential
@pytest.mark.parametrize("key, index", NAMED)
def test_each_token_where_vllm_put_it(key, index):
    name, case = key.split()[0], CASES[key][index]
    ids, generated, kwargs = inputs_of(name, case)
    for convention in conventions(key):
        vllm = engine(name, convention)
        positions, deltas = vllm.get_rope_index(ids, generated_mask=generated, **kwargs)
        assert positions[:, 0].tolist() == case["positions"] and deltas.tolist() == [[case["delta"]]], convention
        four = vllm.compute_position_ids(ids, None, kwargs, generated_mask=generated)
        assert four[0, 1:].tolist() == case["positions"] and four[0, 0].tolist() == list(range(ids.shape[1]))
        # vLLM decodes each token where a prefill of the whole sequence puts it
        whole, whole_deltas = vllm.get_rope_index(ids, **kwargs)
        assert torch.equal(whole, positions) and torch.equal(whole_deltas, deltas)


@pytest.mark.differential
@pytest.mark.parametrize("key", CASES)
def test_padded_and_packed_batches_give_each_case_its_own(key):
    name = key.split()[0]
    for convention in conventions(key):
        assert_batches_reproduce(engine(name, convention), *recorded(name, CASES[key]))


def test_the_cases_cover_each_family_in_both_releases_and_tell_vllm_from_transformers():
    """Every Qwen-VL family vLLM runs (the MoE variants are subclasses keeping their position
    code), in each release; where vLLM's rules differ (text after a video), the cases show it."""
    assert set(CASES) == {f"{name} {release}" for name in ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3.5", "GLM-4V",
                                                            "GLM-4.6V") for release in ("vllm-0.33", "vllm-0.34")}
    assert engine("Qwen2-VL", "vllm").convention == NEWEST == "vllm-0.34"
    for name in ("Qwen2-VL", "Qwen2.5-VL"):
        differ = 0
        for release in ("vllm-0.33", "vllm-0.34"):
            for case in CASES[f"{name} {release}"]:
                ids, _, kwargs = inputs_of(name, case)
                theirs, _ = engine(name, "transformers").get_rope_index(ids, **kwargs)
                differ += theirs[:, 0].tolist() != case["positions"]
        assert differ > 0, name
