"""convention="vllm": the positions vLLM 0.33 and 0.34 give each token of Qwen2.5-Omni's and
Qwen3-Omni's prompts and multi-turn rollouts, videos with their audio among them. The cases in
vllm_cases.json (``"<family> vllm-X.Y"``) were computed by vLLM's own code, read from its wheels:
``python benchmarks/vllm_side_by_side.py --source DIR --cases FILE``, once per release (see
vllm_cases.py)."""

import json
from pathlib import Path

import pytest
import torch
from test_qwen_omni import as_processor_outputs, built
from test_qwen_omni_sglang import inputs_of, recorded

from mmrope_core import PluginManager, RopeEngine
from mmrope_core.testing._recorded import assert_batches_reproduce

CASES = json.loads(Path(__file__).with_name("vllm_cases.json").read_text())
NAMED = [(key, index) for key, cases in CASES.items() for index in range(len(cases))]
NEWEST = "vllm-0.34"


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen3_omni"})


def engines(manager, key):
    """The engines of the family of ``key`` under the conventions its release answers to: its own,
    and "vllm" for the newest."""
    name, release = key.split()
    processor, config = built(name)
    return [RopeEngine.from_processor(processor, config, plugin_manager=manager, convention=convention)
            for convention in ([release, "vllm"] if release == NEWEST else [release])]


@pytest.mark.differential
@pytest.mark.parametrize("key, index", NAMED)
def test_each_token_where_vllm_put_it(manager, key, index):
    name, case = key.split()[0], CASES[key][index]
    ids, generated, kwargs = inputs_of(case, name)
    with_audio = {"use_audio_in_video": bool(case.get("use_audio_in_video"))}
    for vllm in engines(manager, key):
        positions, deltas = vllm.get_rope_index(ids, generated_mask=generated, **kwargs)
        assert positions.dtype == deltas.dtype == torch.int64
        assert positions[:, 0].tolist() == case["positions"] and deltas.tolist() == [[case["delta"]]], vllm.convention
        four = vllm.compute_position_ids(ids, None, as_processor_outputs(kwargs), with_audio, generated_mask=generated)
        assert four[0, 1:].tolist() == case["positions"] and four[0, 0].tolist() == list(range(ids.shape[1]))
        # vLLM decodes each token where a prefill of the whole sequence puts it
        whole, whole_deltas = vllm.get_rope_index(ids, **kwargs)
        assert torch.equal(whole, positions) and torch.equal(whole_deltas, deltas)


@pytest.mark.differential
@pytest.mark.parametrize("key", CASES)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
def test_padded_and_packed_batches_give_each_case_its_own(manager, key, use_audio_in_video):
    cases = [case for case in CASES[key] if bool(case.get("use_audio_in_video")) == use_audio_in_video]
    assert len(cases) >= 2
    for vllm in engines(manager, key):
        assert_batches_reproduce(vllm, *recorded(cases, key.split()[0]))


def test_the_cases_cover_both_families_in_both_releases():
    assert set(CASES) == {f"{name} {release}" for name in ("Qwen2.5-Omni", "Qwen3-Omni")
                          for release in ("vllm-0.33", "vllm-0.34")}
    assert all(any(case.get("use_audio_in_video") and case["video_grid_thw"] for case in cases)
               and any(case["generated"].count("1") for case in cases) for cases in CASES.values())
