"""verl 0.9.1's own agent-loop code with the drop-in: positions of the rollout engine verl's config
names (or the convention one config entry names), and the response mask as ``generated_mask``."""

import importlib
import random
import warnings

import pytest
import torch
from cases import build, loading_without_torchvision, trajectories
from test_verl import full_worker, load, rollout_config
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput, AgentLoopWorker

from mmrope_core import RopeEngine, UnknownConventionError
from mmrope_core.integrations.verl import RopeIndex, as_verl_processor, hf_processor, rollout_convention
from mmrope_core.tiny import random_image


def output_of(prompt, response, response_mask=None):
    return AgentLoopOutput(prompt_ids=prompt, response_ids=response, response_mask=response_mask or [1] * len(response),
                           multi_modal_data={}, metrics=AgentLoopMetrics())


def verl_positions(worker, output, input_ids, attention_mask, inputs):
    """What ``_agent_loop_postprocess`` does for one trajectory's positions: the processor's
    outputs of its text, then the positions (of the given processor outputs, which hold media)."""
    worker._compute_multi_modal_inputs(output, input_ids)
    return AgentLoopWorker._compute_position_ids(worker, input_ids, attention_mask, inputs)


def engine(name, convention):
    processor, config = build(name)
    return RopeEngine.from_processor(processor, config, convention=convention)


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "Qwen3-Omni"])
def test_the_drop_in_takes_the_positions_of_the_rollout_engine_verls_config_names(checkpoint, name):
    processor, _ = load(hf_processor, checkpoint(name))
    rollouts = {"vllm": rollout_config("vllm"), "sglang": rollout_config("sglang"),
                "vllm-0.33": rollout_config("trtllm", mmrope_convention="vllm-0.33"),
                "transformers": rollout_config("sglang", mmrope_convention="transformers")}
    engines = {convention: engine(name, convention) for convention in rollouts}
    rng = random.Random(f"verl rollouts {name}")
    differ = dict.fromkeys(rollouts, 0)
    for index, trajectory in enumerate(t for t in trajectories(name, rng, 12) if t.has_video):
        input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        kwargs = engines["transformers"].rope_index_kwargs(trajectory.inputs())
        want_transformers, _ = engines["transformers"].get_rope_index(input_ids, attention_mask, **kwargs)
        for convention, rollout in rollouts.items():
            worker = full_worker(processor, rollout)
            got = verl_positions(worker, output_of(trajectory.prompt, trajectory.response), input_ids,
                                 attention_mask, trajectory.inputs())
            want, _ = engines[convention].get_rope_index(input_ids, attention_mask, **kwargs)
            assert got.shape == (1, 4, input_ids.shape[1]) and got.dtype == torch.promote_types(torch.int64, want.dtype)
            assert torch.equal(got[:, 1:], want.transpose(0, 1).to(got.dtype)), (index, convention)
            differ[convention] += not torch.equal(want.double(), want_transformers.double())
    assert differ["transformers"] == 0 and all(differ[c] > 0 for c in ("vllm", "sglang", "vllm-0.33")), differ


def test_the_response_mask_reaches_sglangs_qwen3_omni_positions(checkpoint):
    """A prompt with a video of 4 frames of 48 tokens 0.5 s apart, then a reply, a tool's text and
    a reply: SGLang decoded each reply one position past where a prefill puts it; verl's own
    post-processing gives those positions through the drop-in."""
    processor, _ = load(hf_processor, checkpoint("Qwen3-Omni"))
    tokenizer = processor.tokenizer
    word, other = tokenizer.convert_tokens_to_ids(["the", "cat"])
    video = [tokenizer.convert_tokens_to_ids(processor.vision_bos_token)]
    video += [tokenizer.convert_tokens_to_ids(processor.video_token)] * 192
    video += [tokenizer.convert_tokens_to_ids(processor.vision_eos_token)]
    prompt, response = [word] * 3 + video + [word] * 3, [other] * 5 + [word] * 3 + [other] * 5
    response_mask = [1] * 5 + [0] * 3 + [1] * 5
    inputs = {"video_grid_thw": torch.tensor([[4, 16, 12]]), "video_second_per_grid": [0.5]}
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * 2 + prompt + response + [pad] * 4])
    attention_mask = (torch.arange(input_ids.shape[1]) >= 2) & (torch.arange(input_ids.shape[1]) < input_ids.shape[1] - 4)
    attention_mask = attention_mask[None].long()
    worker = full_worker(processor, rollout_config("sglang"))
    with loading_without_torchvision():
        got = verl_positions(worker, output_of(prompt, response, response_mask), input_ids, attention_mask, dict(inputs))
    sglang = engine("Qwen3-Omni", "sglang")
    generated = torch.zeros_like(input_ids)
    generated[0, 2 + len(prompt):2 + len(prompt) + len(response)] = torch.tensor(response_mask)
    want = sglang.compute_position_ids(input_ids, attention_mask, inputs, generated_mask=generated)
    prefilled = sglang.compute_position_ids(input_ids, attention_mask, inputs)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    moved = (want != prefilled).any(1)[0]
    assert torch.equal(moved, generated[0].bool()) and ((want - prefilled)[0, 1:, moved] == 1).all()


def test_a_rollout_engine_without_a_convention_is_named_with_the_entry_that_decides(checkpoint):
    """Refused as soon as the worker holds the processor and the rollout config, before a rollout."""
    processor, _ = load(hf_processor, checkpoint("Qwen2.5-VL"))
    with pytest.raises(UnknownConventionError, match=r"not 'trtllm' \(actor_rollout_ref.rollout.name\). Name the "
                                                     r"convention .* \+actor_rollout_ref.rollout.custom.mmrope_convention"):
        full_worker(processor, rollout_config("trtllm"))


def verls_config(checkpoint_path, *overrides):
    """verl's own ppo_trainer config with the drop-in as ``external_lib``."""
    import os

    import verl
    from hydra import compose, initialize_config_dir

    directory = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=directory, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={checkpoint_path}",
            "actor_rollout_ref.model.external_lib=mmrope_core.integrations.verl.patch", *overrides])


def test_verls_own_agent_loop_worker_refuses_at_start_up_what_it_could_not_place(checkpoint):
    """verl's unchanged ``AgentLoopWorker.__init__`` (the drop-in installed by its external_lib
    while it builds its model config): an engine mmrope has no convention for, or one the family
    lacks, is refused when the worker starts, not after its first rollout."""
    from test_verl import verls_factory_restored

    def start(name, *overrides):
        config = verls_config(checkpoint(name), *overrides)
        with verls_factory_restored(), loading_without_torchvision():
            return AgentLoopWorker(config, None)

    worker = start("Qwen2.5-VL", "actor_rollout_ref.rollout.name=sglang")
    assert worker.processor.get_rope_index.follow_rollout
    assert worker.processor.get_rope_index.for_convention("sglang").convention == "sglang-0.5.23"
    with pytest.raises(UnknownConventionError, match=r"not 'trtllm' \(actor_rollout_ref.rollout.name\)"):
        start("Qwen2.5-VL", "actor_rollout_ref.rollout.name=trtllm")
    with pytest.raises(UnknownConventionError, match=r"SGLang 0\.5\.23 has no Qwen2\.5-Omni model"):
        start("Qwen2.5-Omni", "actor_rollout_ref.rollout.name=sglang")
    start("Qwen2.5-VL", "actor_rollout_ref.rollout.name=trtllm", "+actor_rollout_ref.rollout.custom.mmrope_convention=vllm")


def test_verls_trainer_refuses_an_unknown_rollout_engine_before_it_starts_workers(checkpoint):
    """``RayPPOTrainer.__init__`` (verl's trainer that takes a built processor) holds the drop-in
    and verl's config before it builds any worker group."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    processor, _ = load(hf_processor, checkpoint("Qwen2.5-VL"))
    config = verls_config(checkpoint("Qwen2.5-VL"), "actor_rollout_ref.rollout.name=trtllm")
    with warnings.catch_warnings(), pytest.raises(UnknownConventionError, match=r"not 'trtllm' \(actor_rollout_ref"):
        warnings.simplefilter("ignore", FutureWarning)  # verl marks this trainer deprecated in favour of its v1 one
        RayPPOTrainer(config, processor.tokenizer, role_worker_mapping={}, resource_pool_manager=None,
                      processor=processor)


def test_a_convention_nobody_knows_is_refused_at_install():
    import mmrope_core.integrations.verl as mmrope_verl

    with pytest.raises(UnknownConventionError, match=r"'vlm' \(mmrope_core.integrations.verl.install\(convention=...\)\) "
                                                     r"is unknown; the known ones are 'transformers'"):
        mmrope_verl.install(convention="vlm")
    assert importlib.import_module("verl.utils.tokenizer.tokenizer").hf_processor.__module__ == \
        "verl.utils.tokenizer.tokenizer"  # nothing rebound


@pytest.mark.parametrize("mode", ["built-before-import", "unpickled-before-import", "unpickled-after-import",
                                  "model-config-unpickled-before-import"])
def test_the_drop_in_follows_the_rollout_whatever_verl_imported_first(mode, tmp_path, checkpoint):
    """A drop-in made, or unpickled (a prebuilt processor, verl's HFModelConfig passed on as it
    is), before verl's agent loop is imported, or unpickled after: SGLang's positions for an
    sglang rollout, and an unknown rollout engine refused (in a fresh process: this one imported
    verl)."""
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    from test_verl import verls_factory_restored
    from verl.utils.config import omega_conf_to_dataclass

    if mode.startswith("model-config"):  # verl's own model config, the drop-in switched on by its external_lib
        entry = {"_target_": "verl.workers.config.HFModelConfig", "path": checkpoint("Qwen3-Omni"),
                 "external_lib": "mmrope_core.integrations.verl.patch"}
        with verls_factory_restored(), loading_without_torchvision(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            made = omega_conf_to_dataclass(entry)
        assert isinstance(made.processor.get_rope_index, RopeIndex)
    else:
        made = as_verl_processor(*build("Qwen3-Omni"))
    (tmp_path / "drop_in.pkl").write_bytes(pickle.dumps(made))
    script = Path(__file__).with_name("verl_import_order.py")
    run = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "drop_in.pkl")], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("followed the rollout"), run.stderr[-3000:]


def test_a_fixed_convention_is_refused_at_construction_where_the_family_lacks_it(checkpoint):
    with pytest.raises(UnknownConventionError, match=r"SGLang 0\.5\.23 has no Qwen2\.5-Omni model"):
        load(hf_processor, checkpoint("Qwen2.5-Omni"), convention="sglang")
    fixed, _ = load(hf_processor, checkpoint("Qwen2.5-VL"), convention="vllm")
    assert fixed.rope_engine.convention == "vllm-0.34"
    # a fixed convention does not follow the rollout: any engine name goes
    trajectory = next(t for t in trajectories("Qwen2.5-VL", random.Random(3), 4) if t.has_video)
    input_ids, attention_mask = trajectory.verl_layout(random.Random(4), fixed.tokenizer.pad_token_id)
    got = verl_positions(full_worker(fixed, rollout_config("trtllm")), output_of(trajectory.prompt, trajectory.response),
                         input_ids, attention_mask, trajectory.inputs())
    assert torch.equal(got, fixed.rope_engine.compute_position_ids(input_ids, attention_mask, trajectory.inputs()))


def test_the_config_entry_reads_from_verls_own_hydra_config():
    """``+actor_rollout_ref.rollout.custom.mmrope_convention=...`` on verl's ppo_trainer config."""
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from verl.utils.config import omega_conf_to_dataclass

    directory = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=directory, version_base=None):
        plain = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=sglang"])
        named = compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.rollout.name=sglang", "+actor_rollout_ref.rollout.custom.mmrope_convention=vllm-0.33"])
    assert rollout_convention(omega_conf_to_dataclass(plain.actor_rollout_ref.rollout)) == "sglang"
    assert rollout_convention(omega_conf_to_dataclass(named.actor_rollout_ref.rollout)) == "vllm-0.33"


# -- what the engine says of the model (batch_layout, samples_independent) ---------------------------


def test_a_model_taking_no_text_row_is_refused_since_verl_adds_one(monkeypatch):
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core import UnsupportedProcessorError
    from mmrope_core.batching import BatchLayout

    default_manager_with(monkeypatch, ThirdParty(layout=BatchLayout(text_positions=False)))
    processor, config = build("Qwen2-VL")
    with pytest.raises(UnsupportedProcessorError, match="takes only its 3 rows of positions, and verl's agent loop puts "
                                                        "a text row above"):
        as_verl_processor(processor, config)


def test_a_reference_numbering_images_across_the_batch_takes_one_sample_a_call(monkeypatch):
    """verl's agent loop computes each trajectory alone; a call on a batch of a reference that
    numbers images across it is refused rather than answered with other samples' numbering."""
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core import CollateError

    default_manager_with(monkeypatch, ThirdParty(numbering=True))
    processor, config = build("Qwen2-VL")
    drop_in = as_verl_processor(processor, config)
    assert not drop_in.rope_engine.samples_independent
    text = f"a <|vision_start|>{processor.image_token}<|vision_end|> b"
    image = random_image(random.Random(0), 56, 56)
    one = processor(text=[text], images=[image], return_tensors="pt")
    kwargs = drop_in.get_rope_index_kwargs(one)
    alone, _ = drop_in.get_rope_index(input_ids=one["input_ids"], attention_mask=one["attention_mask"], **kwargs)
    assert alone.shape == (3, 1, one["input_ids"].shape[1])
    twice = {"image_grid_thw": torch.cat([kwargs["image_grid_thw"]] * 2)}
    with pytest.raises(CollateError, match="call get_rope_index on one sample at a time"):
        drop_in.get_rope_index(input_ids=one["input_ids"].repeat(2, 1), attention_mask=one["attention_mask"].repeat(2, 1),
                               **twice)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_verls_trainer_refuses_left_padding_the_model_gets_wrong_where_its_actor_keeps_padding(
        checkpoint, monkeypatch, remove_padding):
    """verl pads prompts on the left; ``RayPPOTrainer.__init__`` holds the drop-in and verl's config
    before any worker starts: with ``use_remove_padding`` off, the padding reaches the model."""
    from layout_plugins import ThirdParty, default_manager_with
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from mmrope_core import PaddingUnsupportedError
    from mmrope_core.batching import BatchLayout

    default_manager_with(monkeypatch, ThirdParty(layout=BatchLayout(refused_sides={"left": "its layers read slots"})))
    processor, _ = load(hf_processor, checkpoint("Qwen2-VL"), convention="transformers")
    config = verls_config(checkpoint("Qwen2-VL"), f"actor_rollout_ref.model.use_remove_padding={str(remove_padding).lower()}")

    def start():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            RayPPOTrainer(config, processor.tokenizer, role_worker_mapping={}, resource_pool_manager=None,
                          processor=processor)

    if remove_padding:  # past the drop-in's check, verl's own refuses a trainer without workers
        with pytest.raises(AssertionError, match="role_worker_mapping"):
            start()
    else:
        with pytest.raises(PaddingUnsupportedError, match="use_remove_padding=false: set it to true"):
            start()
