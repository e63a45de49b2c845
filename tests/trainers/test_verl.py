"""verl 0.9.1's own agent-loop code, unchanged, with mmrope's drop-in processor factory, against
the model classes' own get_rope_index; and verl's own factory where it is wrong or crashes."""

import asyncio
import collections
import contextlib
import importlib
import pickle
import random
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from cases import (
    FAMILIES,
    OMNI,
    build,
    loading_without_torchvision,
    reference_rope_index,
    reference_verl_positions,
    trajectories,
)
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker

import mmrope_core.integrations.verl as mmrope_verl
from mmrope_core import PlaceholderMismatchError, UnsupportedProcessorError
from mmrope_core.integrations.verl import as_verl_processor, hf_processor

TRAJECTORIES = 16  # per family: half real processor calls, half generated samples with videos


def load(factory, directory, **kwargs):
    with loading_without_torchvision(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        processor = factory(directory, **kwargs)
    return processor, [str(warning.message) for warning in caught if "Failed to create processor" in str(warning.message)]


def verls_own_factory():
    factory = importlib.import_module("verl.utils.tokenizer.tokenizer").hf_processor
    assert factory.__module__ == "verl.utils.tokenizer.tokenizer"  # not rebound by a test before
    return factory


def worker(processor):
    """What verl's own CPU test passes as ``self``: ``_compute_position_ids`` reads only ``processor``."""
    return type("Worker", (), {"processor": processor})()


def verl_positions(processor, input_ids, attention_mask, multi_modal_inputs):
    return AgentLoopWorker._compute_position_ids(worker(processor), input_ids, attention_mask, multi_modal_inputs)


def outcome(processor, trajectory, input_ids, attention_mask, expected):
    try:
        got = verl_positions(processor, input_ids, attention_mask, trajectory.inputs())
    except Exception as error:  # the exception, where it was raised, its message
        return f"raises {type(error).__name__} in {traceback.extract_tb(error.__traceback__)[-1].name}: {error}"
    if got.shape != expected.shape:
        return "1-D" if got.dim() == 2 else f"shape {tuple(got.shape)}"
    return "equal" if got.dtype == expected.dtype and torch.equal(got, expected) else "differs"


@pytest.mark.parametrize("name", FAMILIES)
def test_verls_compute_position_ids_with_the_drop_in_equals_the_reference(checkpoint, name):
    processor, failures = load(hf_processor, checkpoint(name))
    assert not failures
    assert type(processor) is type(build(name)[0])
    rng = random.Random(f"verl {name}")
    kinds = collections.Counter()
    for index, trajectory in enumerate(trajectories(name, rng, TRAJECTORIES)):
        input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        expected = reference_verl_positions(name, input_ids, attention_mask, trajectory.reference_kwargs)
        got = verl_positions(processor, input_ids, attention_mask, trajectory.inputs())
        assert got.dtype == expected.dtype and torch.equal(got, expected), f"trajectory {index} ({trajectory.kind})"
        # mmrope's own call gives what verl assembles
        assert torch.equal(processor.rope_engine.compute_position_ids(input_ids, attention_mask, trajectory.inputs()), got)
        if hasattr(processor, "get_rope_index"):  # positions and deltas, called as verl calls it
            inputs = trajectory.inputs()
            kwargs = {key: inputs.get(key) for key in ("image_grid_thw", "video_grid_thw", "mm_token_type_ids")}
            kwargs.update(processor.get_rope_index_kwargs(inputs))
            result = processor.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            want = reference_rope_index(name, input_ids, attention_mask, trajectory.reference_kwargs)
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(result, want))
        kinds[trajectory.kind, trajectory.has_video] += 1
    if name not in ("PaddleOCR-VL", "Gemma4"):  # families with videos get generated video samples
        assert kinds["generated", True] >= 4, kinds


# Where verl 0.9.1's own factory is wrong: what its positions do on the same trajectories.
VERL_ALONE = {
    "Qwen2-VL": "right",
    "Qwen3-VL": "right",
    "Qwen3.5": "right",
    "Gemma4": "right",
    "Qwen2.5-VL": "wrong after videos",       # second_per_grid_ts never reaches the model
    "GLM-4V": "crashes on videos",            # video frames typed as images
    "GLM-4.6V": "crashes on videos",
    "PaddleOCR-VL": "1-D",                    # unknown class: the processor becomes None
    "Qwen3-Omni": "1-D",
    "Qwen2.5-Omni": "1-D",
}


@pytest.mark.parametrize("name", FAMILIES)
def test_where_verls_own_factory_is_wrong_the_drop_in_is_right(checkpoint, name):
    drop_in, _ = load(hf_processor, checkpoint(name))
    verls, failures = load(verls_own_factory(), checkpoint(name))
    rng = random.Random(f"verl alone {name}")
    seen = collections.Counter()
    for trajectory in trajectories(name, rng, TRAJECTORIES):
        input_ids, attention_mask = trajectory.verl_layout(rng, drop_in.tokenizer.pad_token_id)
        expected = reference_verl_positions(name, input_ids, attention_mask, trajectory.reference_kwargs)
        assert outcome(drop_in, trajectory, input_ids, attention_mask, expected) == "equal"
        seen[trajectory.has_video, outcome(verls, trajectory, input_ids, attention_mask, expected)] += 1
    verdict = VERL_ALONE[name]
    if verdict == "right":
        assert set(seen) <= {(False, "equal"), (True, "equal")}, seen
    elif verdict == "wrong after videos":
        assert seen[True, "differs"] > 0 and (False, "differs") not in seen, seen
    elif verdict == "crashes on videos":
        assert {outcome for video, outcome in seen if video} <= {
            "raises StopIteration in get_rope_index: ",
            "raises TypeError in get_rope_index: 'NoneType' object is not an iterator"}, seen
        assert {outcome for video, outcome in seen if not video} == {"equal"}, seen
    else:
        assert verls is None and "Unsupported processor type" in failures[0]
        assert {outcome for _, outcome in seen} == {"1-D"}, seen


def test_a_second_call_on_the_same_dict_works(checkpoint):
    """verl pops mm_token_type_ids from the dict it is given; transformers 5.10's Qwen2-VL
    reference requires them, the drop-in builds its own."""
    drop_in, _ = load(hf_processor, checkpoint("Qwen2-VL"))
    verls, _ = load(verls_own_factory(), checkpoint("Qwen2-VL"))
    rng = random.Random(3)
    trajectory = trajectories("Qwen2-VL", rng, 1)[0]
    input_ids, attention_mask = trajectory.verl_layout(rng, 0)
    expected = reference_verl_positions("Qwen2-VL", input_ids, attention_mask, trajectory.reference_kwargs)
    for processor in (drop_in, verls):
        inputs = trajectory.inputs()
        assert torch.equal(verl_positions(processor, input_ids, attention_mask, inputs), expected)
        assert "mm_token_type_ids" not in inputs
    assert torch.equal(verl_positions(drop_in, input_ids, attention_mask, inputs), expected)
    with pytest.raises(TypeError, match="mm_token_type_ids"):
        verl_positions(verls, input_ids, attention_mask, inputs)


@pytest.mark.parametrize("name", OMNI)
def test_audio_in_video_needs_the_processor_kwargs_verl_does_not_pass(checkpoint, name):
    default, _ = load(hf_processor, checkpoint(name))
    with_audio, _ = load(hf_processor, checkpoint(name), mm_processor_kwargs={"use_audio_in_video": True})
    rng = random.Random(f"audio in video {name}")
    refused = 0
    for trajectory in trajectories(name, rng, 6, use_audio_in_video=True):
        input_ids, attention_mask = trajectory.verl_layout(rng, default.tokenizer.pad_token_id)
        expected = reference_verl_positions(name, input_ids, attention_mask, trajectory.reference_kwargs)
        assert torch.equal(verl_positions(with_audio, input_ids, attention_mask, trajectory.inputs()), expected)
        try:  # verl hands its mm_processor_kwargs to nobody: without them the drop-in refuses, never guesses
            got = verl_positions(default, input_ids, attention_mask, trajectory.inputs())
        except PlaceholderMismatchError as error:
            assert "use_audio_in_video" in str(error)
            refused += 1
        else:
            assert torch.equal(got, expected)  # a sample whose draw holds no video with audio
    assert refused >= 4


@pytest.mark.parametrize("name", FAMILIES)
def test_verls_whole_postprocess_with_the_drop_in(checkpoint, name):
    """``_agent_loop_postprocess``: decode the trajectory, process its media again, positions."""
    from cases import _samples

    processor, _ = load(hf_processor, checkpoint(name))
    rng = random.Random(f"postprocess {name}")
    sample = next(s for s in _samples(name)(processor, rng) if s.get("images") or s.get("audio"))
    media = {}
    if sample.get("images"):
        media["images"] = sample["images"][0] if name == "Gemma4" else sample["images"]
    if sample.get("audio"):
        media["audios"] = sample["audio"]
    output = AgentLoopOutput(
        prompt_ids=processor(**sample)["input_ids"][0].tolist(),
        response_ids=processor.tokenizer("the cat sat on", add_special_tokens=False)["input_ids"],
        response_mask=[1, 1, 1, 1], multi_modal_data=media, metrics=AgentLoopMetrics(),
    )
    internal = asyncio.run(AgentLoopWorker._agent_loop_postprocess(full_worker(processor), output, validate=False,
                                                                   raw_prompt=[]))
    inputs = internal.multi_modal_inputs
    kwargs = {key: inputs.get(key) for key in ("image_grid_thw", "video_grid_thw")}
    if "feature_attention_mask" in inputs:
        kwargs["audio_seqlens"] = inputs["feature_attention_mask"].sum(-1)
    expected = reference_verl_positions(name, internal.input_ids, internal.attention_mask, kwargs)
    assert internal.position_ids.dtype == expected.dtype and torch.equal(internal.position_ids, expected)


def rollout_config(name="vllm", **custom):
    """verl's own rollout config (``actor_rollout_ref.rollout``), as its workers convert it."""
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass({"_target_": "verl.workers.config.RolloutConfig", "name": name, "prompt_length": 256,
                                    "response_length": 32, **({"custom": custom} if custom else {})})


def full_worker(processor, rollout=None):
    """What ``_agent_loop_postprocess`` reads of the worker, besides its methods; by default a
    rollout config whose one entry asks for transformers' positions."""
    worker = object.__new__(AgentLoopWorker)
    worker.processor, worker.tokenizer = processor, processor.tokenizer
    worker.rollout_config = rollout or rollout_config(mmrope_convention="transformers")
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    return worker


def test_gemma4_processes_with_its_relaxed_check_and_offers_no_rope_index():
    from mmrope_core.tiny import random_image

    original, config = build("Gemma4")
    drop_in = as_verl_processor(original, config)
    assert not hasattr(drop_in, "get_rope_index") and not hasattr(drop_in, "get_rope_index_kwargs")
    # verl re-processes text whose placeholders decoding removed; the processor's own check refuses it
    collapsed = {"text": ["the cat"], "images": [[random_image(random.Random(1), 64, 64)]], "return_tensors": "pt"}
    with pytest.raises(ValueError, match="number of images"):
        original(**collapsed)
    assert drop_in(**collapsed)["pixel_values"].shape[0] == 1
    with pytest.raises(ValueError, match="placeholders"):  # what the relaxed check still refuses
        drop_in(text=[f"{drop_in.image_token} {drop_in.image_token}"], images=collapsed["images"], return_tensors="pt")


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "Qwen3-Omni", "Gemma4"])
def test_the_users_processor_is_not_changed(name):
    processor, config = build(name)
    before = dict(vars(processor))
    drop_in = as_verl_processor(processor, config)
    drop_in.chat_template = "{{ messages }}"  # verl sets it on the processor it gets
    assert vars(processor) == before and all(vars(processor)[key] is value for key, value in before.items())
    assert not hasattr(processor, "get_rope_index") and not hasattr(processor, "rope_engine")
    assert drop_in is not processor and type(drop_in) is type(processor)
    assert drop_in.tokenizer is processor.tokenizer


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "GLM-4V", "Qwen3-Omni", "Gemma4"])
def test_the_drop_in_pickles(name):
    """Plain pickle too: verl's own processor, with a bound method in its instance dict, does not
    load back from it."""
    import cloudpickle
    import dill

    processor, config = build(name)
    drop_in = as_verl_processor(processor, config)
    rng = random.Random(f"pickle {name}")
    trajectory = trajectories(name, rng, 2)[1]
    input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
    expected = verl_positions(drop_in, input_ids, attention_mask, trajectory.inputs())
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, pickle.loads), (dill.dumps, dill.loads)):
        copy = loads(dumps(drop_in))
        assert type(copy) is type(processor) and hasattr(copy, "get_rope_index") == hasattr(drop_in, "get_rope_index")
        assert torch.equal(verl_positions(copy, input_ids, attention_mask, trajectory.inputs()), expected)


def test_a_text_only_checkpoint_gives_none(tmp_path):
    from mmrope_core.tiny import word_level_tokenizer

    word_level_tokenizer({}).save_pretrained(tmp_path)
    transformers.AutoConfig.for_model("qwen2").save_pretrained(tmp_path)
    assert hf_processor(str(tmp_path)) is None
    assert verls_own_factory()(str(tmp_path)) is None


def test_a_processor_without_m_rope_gets_verls_1d_positions(tmp_path):
    """LLaVA has no M-RoPE: the drop-in's processor offers no get_rope_index, so verl's own check
    takes its 1-D path, where verl's factory refuses the class and returns None."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mmrope_core.tiny import word_level_tokenizer

    processor = transformers.LlavaProcessor(image_processor=Qwen2VLImageProcessorPil(), patch_size=14,
                                            tokenizer=word_level_tokenizer({"image_token": "<image>"}))
    processor.save_pretrained(tmp_path)
    transformers.AutoConfig.for_model("llava").save_pretrained(tmp_path)
    dropped_in, _ = load(hf_processor, str(tmp_path))
    assert type(dropped_in).__name__ == "LlavaProcessor" and not hasattr(dropped_in, "get_rope_index")
    assert dropped_in.rope_engine.rope_kind == "1d"
    verls, failures = load(verls_own_factory(), str(tmp_path))  # verl: None and a warning, then 1-D positions
    assert verls is None and "Unsupported processor type: LlavaProcessor" in failures[0]


def test_a_processor_no_plugin_handles_is_refused_not_silently_1d(tmp_path, monkeypatch):
    import os

    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    import mmrope_core.manager
    from mmrope_core import PluginManager
    from mmrope_core.tiny import word_level_tokenizer

    processor = transformers.LlavaProcessor(image_processor=Qwen2VLImageProcessorPil(), patch_size=14,
                                            tokenizer=word_level_tokenizer({"image_token": "<image>"}))
    processor.save_pretrained(tmp_path)
    transformers.AutoConfig.for_model("llava").save_pretrained(tmp_path)
    without = PluginManager(env={**os.environ, "MMROPE_DISABLE_PLUGINS": "transformers"})  # none handles LLaVA
    monkeypatch.setattr(mmrope_core.manager, "_default_manager", without)
    with pytest.raises(UnsupportedProcessorError, match="LlavaProcessor"):
        load(hf_processor, str(tmp_path))


@contextlib.contextmanager
def verls_factory_restored():
    modules = [importlib.import_module(name) for name in mmrope_verl.VERL_FACTORY_MODULES]
    saved = [module.hf_processor for module in modules]
    sys.modules.pop("mmrope_core.integrations.verl.patch", None)
    try:
        yield
    finally:
        for module, factory in zip(modules, saved):
            module.hf_processor = factory
        sys.modules.pop("mmrope_core.integrations.verl.patch", None)


def test_the_external_lib_config_entry_switches_verls_model_config(checkpoint):
    """What AgentLoopWorker (and every other verl worker) does with the model config section."""
    from verl.utils.config import omega_conf_to_dataclass

    entry = {"_target_": "verl.workers.config.HFModelConfig", "path": checkpoint("Qwen2.5-VL")}
    with verls_factory_restored(), loading_without_torchvision(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = omega_conf_to_dataclass(entry)
        switched = omega_conf_to_dataclass({**entry, "external_lib": "mmrope_core.integrations.verl.patch"})
    assert not hasattr(plain.processor, "rope_engine")
    assert switched.processor.rope_engine.plugin_name == "qwen_vl"
    assert isinstance(switched.processor.get_rope_index, mmrope_verl.RopeIndex)


def test_install_while_verl_imports_it_through_verl_use_external_modules(checkpoint):
    script = (
        "import verl.workers.config.model as model, verl.utils, verl.utils.tokenizer as tokenizer\n"
        "from mmrope_core.integrations.verl import hf_processor\n"
        "assert model.hf_processor is verl.utils.hf_processor is tokenizer.hf_processor is hf_processor\n"
    )
    env = {**__import__("os").environ, "VERL_USE_EXTERNAL_MODULES": "mmrope_core.integrations.verl.patch"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_verls_own_cpu_test_of_the_rope_kwargs_hook():
    """verl's own test of the hook the drop-in fills in, from the verl wheel, as it is."""
    from tests.experimental.agent_loop import test_multimodal_position_ids_on_cpu as verls_test

    assert Path(verls_test.__file__).is_relative_to(Path(importlib.import_module("verl").__file__).parents[1])
    verls_test.test_compute_position_ids_accepts_processor_rope_kwargs_hook()


def docs_block(starting):
    """The python block of docs/trainers.md that starts with ``starting``."""
    text = (Path(__file__).parents[2] / "docs" / "trainers.md").read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]
    return next(block for block in blocks if block.startswith(starting))


def test_the_documented_audio_in_video_setup_module(checkpoint, tmp_path, monkeypatch):
    """The docs' ``my_verl_setup.py``, as verl's external_lib, on a Qwen3-Omni checkpoint."""
    from verl.utils.config import omega_conf_to_dataclass

    (tmp_path / "my_verl_setup.py").write_text(docs_block("# my_verl_setup.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = {"_target_": "verl.workers.config.HFModelConfig", "path": checkpoint("Qwen3-Omni"),
             "external_lib": "my_verl_setup"}
    with verls_factory_restored(), loading_without_torchvision(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = omega_conf_to_dataclass(entry).processor
    sys.modules.pop("my_verl_setup", None)
    rng = random.Random("setup module")
    for trajectory in trajectories("Qwen3-Omni", rng, 3, use_audio_in_video=True):
        input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        expected = reference_verl_positions("Qwen3-Omni", input_ids, attention_mask, trajectory.reference_kwargs)
        assert torch.equal(verl_positions(processor, input_ids, attention_mask, trajectory.inputs()), expected)
