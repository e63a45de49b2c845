"""convention="sglang": the positions SGLang 0.5.23 gives each token of a Qwen3-Omni rollout. The
cases in sglang_cases.json (prompts and multi-turn rollouts, their positions and delta) were
computed by SGLang's own code, read from its wheel: ``python benchmarks/sglang_side_by_side.py
--cases`` (see sglang_anchor.py). Their last case is a rollout whose replies SGLang decodes one
position past where a prefill of the whole sequence puts them."""

import json
import random
from pathlib import Path

import pytest
import torch
from test_qwen_omni import as_processor_outputs, built, generated, ids_of, split, transformers_reference

from mmrope_core import InvalidInputError, PluginManager, RopeEngine, UnknownConventionError, _native, compiled
from mmrope_core.testing._recorded import Recorded, assert_batches_reproduce
from mmrope_qwen3_omni.fast import FastRopeIndex

CASES = json.loads(Path(__file__).with_name("sglang_cases.json").read_text())["Qwen3-Omni"]


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen3_omni"})


def sglang_engine(manager, name="Qwen3-Omni", **options):
    processor, config = built(name)
    return RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="sglang", **options)


@pytest.fixture(params=["batched", "numpy", "engine"])
def place(request, manager, monkeypatch):
    """``place(ids, mask=None, **kwargs) -> (positions, deltas)`` by one of the paths: the binding's
    kernel over the batched kernel on its compiled loops (loaded even where MMROPE_DISABLE_COMPILED
    switched them off for the engines) or on its numpy path, or the engine."""
    monkeypatch.setattr(compiled, "native", _native)
    engine = sglang_engine(manager)

    def placed(ids, mask=None, **kwargs):
        if request.param == "engine":
            return engine.get_rope_index(ids, mask, **kwargs)
        bound = engine.binding.kernel
        markers = {"vision_end": ids_of(engine.processor)["vision_eos"], "audio_end": ids_of(engine.processor)["audio_eos"]}
        kernel = FastRopeIndex(bound.family, bound.config, markers, bound.audio_rule, convention=bound.convention)
        if kwargs.get("generated_mask") is not None:
            kwargs["generated_mask"] = kwargs["generated_mask"].bool()
        if request.param == "numpy":
            with compiled.switched_off():
                return kernel.rope_index(ids, None if mask is None else mask.bool(), **kwargs)
        return kernel.rope_index(ids, None if mask is None else mask.bool(), **kwargs)

    return placed


def inputs_of(case, name="Qwen3-Omni"):
    """``(input_ids, generated_mask, get_rope_index keyword arguments)`` of a case, ``(1, L)``."""
    processor, _ = built(name)
    token = ids_of(processor)
    table = {"t": processor.tokenizer.convert_tokens_to_ids("cat"), "[": token["vision_bos"], "]": token["vision_eos"],
             "(": token["audio_bos"], ")": token["audio_eos"], "i": token["image"], "v": token["video"],
             "a": token["audio"]}
    ids = torch.tensor([[table[symbol] for symbol in case["tokens"]]])
    generated_mask = torch.tensor([[int(flag) for flag in case["generated"]]])
    kwargs = {key: torch.tensor(case[key]) for key in ("image_grid_thw", "video_grid_thw", "audio_seqlens") if case[key]}
    if case["seconds"]:
        kwargs["second_per_grids"] = torch.tensor(case["seconds"], dtype=torch.float32)
    if case.get("use_audio_in_video"):
        kwargs["use_audio_in_video"] = True
    return ids, generated_mask, kwargs


def recorded(cases, name="Qwen3-Omni"):
    """``(Recorded sequences, get_rope_index keyword arguments of them all, processor outputs,
    mm_processor_kwargs)`` of cases alike in ``use_audio_in_video``."""
    rows = [inputs_of(case, name) for case in cases]
    keys = ("image_grid_thw", "video_grid_thw", "audio_seqlens", "second_per_grids")
    kwargs = {key: torch.cat([row[2][key] for row in rows if key in row[2]]) for key in keys
              if any(key in row[2] for row in rows)}
    flags = {bool(case.get("use_audio_in_video")) for case in cases}
    assert len(flags) == 1, "one use_audio_in_video for a batch"
    with_audio = flags.pop()
    sequences = [Recorded(ids[0].tolist(), generated[0].tolist(), case["positions"], case["delta"])
                 for (ids, generated, _), case in zip(rows, cases)]
    return (sequences, kwargs | ({"use_audio_in_video": True} if with_audio else {}), as_processor_outputs(kwargs),
            {"use_audio_in_video": with_audio})


@pytest.mark.differential
@pytest.mark.parametrize("index", range(len(CASES)))
def test_each_token_where_sglang_put_it(place, index):
    case = CASES[index]
    ids, generated_mask, kwargs = inputs_of(case)
    positions, deltas = place(ids, generated_mask=generated_mask, **kwargs)
    assert positions.dtype == deltas.dtype == torch.int64
    assert positions[:, 0].tolist() == case["positions"] and deltas.tolist() == [[case["delta"]]]


@pytest.mark.differential
def test_the_generated_mask_moves_decoded_replies_and_only_them(manager):
    """A prefill of the whole sequence truncates transformers' float positions; SGLang decoded
    the replies at index + trunc(delta), one position further here."""
    engine = sglang_engine(manager)
    case = CASES[-1]
    ids, generated_mask, kwargs = inputs_of(case)
    whole, _ = engine.get_rope_index(ids, **kwargs)
    own, _ = transformers_reference("Qwen3-Omni")(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    assert torch.equal(whole, own.to(torch.int64))
    moved = (torch.tensor(case["positions"]) != whole[:, 0]).any(0)
    assert moved.any() and torch.equal(moved, generated_mask[0].bool())
    assert (torch.tensor(case["positions"])[:, moved] - whole[:, 0, moved]).unique().tolist() == [1]
    four = engine.compute_position_ids(ids, None, as_processor_outputs(kwargs), generated_mask=generated_mask)
    assert four.dtype == torch.int64 and four[0, 1:].tolist() == case["positions"]
    assert four[0, 0].tolist() == list(range(ids.shape[1]))


@pytest.mark.differential
def test_padded_and_packed_batches_give_each_case_its_own(manager):
    assert_batches_reproduce(sglang_engine(manager), *recorded(CASES))


@pytest.mark.differential
def test_without_generated_tokens_the_prefill_truncates_transformers_positions(manager):
    engine = sglang_engine(manager)
    own = transformers_reference("Qwen3-Omni")
    rng = random.Random("sglang prefill")
    for index in range(30):
        ids, mask, kwargs = split(generated("Qwen3-Omni", rng, False))
        want, want_deltas = own(input_ids=ids, attention_mask=mask, **kwargs)
        got, deltas = engine.get_rope_index(ids, mask, **kwargs)
        assert torch.equal(got, want.to(torch.int64)) and torch.equal(deltas, want_deltas.to(torch.int64)), index


def test_what_sglang_never_computes_is_refused(manager):
    ids, _, kwargs = inputs_of(CASES[0])
    assert "video_grid_thw" in kwargs
    engine = sglang_engine(manager)
    with pytest.raises(InvalidInputError, match=r"SGLang 0\.5\.23 computes Qwen3-Omni's positions with "
                                                r"use_audio_in_video=False"):
        engine.get_rope_index(ids, use_audio_in_video=True, **kwargs)
    with pytest.raises(UnknownConventionError, match=r"'sglang' is not offered by Qwen2.5-Omni \(SGLang 0.5.23 has "
                                                     r"no Qwen2.5-Omni model.*it offers 'transformers', 'vllm-0.33', "
                                                     r"'vllm-0.34'"):
        sglang_engine(manager, "Qwen2.5-Omni")
    with pytest.raises(UnknownConventionError, match=r"'sglang-0\.5\.23' has no reference implementation"):
        sglang_engine(manager, implementation="reference")
    bound = sglang_engine(manager)
    assert bound.convention == "sglang-0.5.23" and bound.position_dtype == torch.int64
    assert bound.binding.description.endswith(", SGLang 0.5.23 convention")
