"""Real engines on a local Ray: shipped to actors and tasks, and in a Ray Data pipeline."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest
import ray  # the trainers' environment has it: its absence is a failure, not a skip
import torch

EXAMPLES = Path(__file__).parents[2] / "examples"
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the tasks below, for workers that cannot import it


def example(name):
    """An example script as a module whose functions Ray ships by value (workers cannot import it)."""
    spec = importlib.util.spec_from_file_location(f"mmrope_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local node for the module: two CPUs, a small object store, 127.0.0.1 only (conftest).
    Workers import Gemma4's processor module as this process does (transformers 5.10 without
    torchvision, see cases.py) before they unpickle one."""
    import cases

    ray.cloudpickle.register_pickle_by_value(cases)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20,
             runtime_env={"worker_process_setup_hook": cases.import_gemma4_processor})
    yield
    ray.shutdown()


def test_ray_actors_example():
    remote, local = example("ray_actors").main(count=6)
    assert len(remote) == 6 and all(torch.equal(a, b) for a, b in zip(remote, local))
    assert any(positions.shape[0] > 1 for positions in remote)  # batches, not single samples


@ray.remote
def positions_in_a_worker(engine, input_ids, attention_mask, inputs):
    import os

    return os.getpid(), engine.compute_position_ids(input_ids, attention_mask, inputs)


@pytest.mark.parametrize("name", ["GLM-4V", "Qwen3-Omni", "Gemma4"])
def test_engines_of_each_kind_compute_in_a_worker_what_they_compute_here(name):
    """Token types from video markers (GLM), float positions and audio (Qwen3-Omni), 1-D (Gemma4)."""
    import os

    from cases import build, trajectories

    from mmrope_core import RopeEngine

    processor, config = build(name)
    engine = RopeEngine.from_processor(processor, config)
    shipped = ray.put(engine)
    rng = random.Random(f"ray {name}")
    for trajectory in trajectories(name, rng, 4):
        input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        pid, remote = ray.get(positions_in_a_worker.remote(shipped, input_ids, attention_mask, trajectory.inputs()))
        local = engine.compute_position_ids(input_ids, attention_mask, trajectory.inputs())
        assert pid != os.getpid() and remote.dtype == local.dtype and torch.equal(remote, local)


@ray.remote
def verl_positions_in_a_worker(processor, input_ids, attention_mask, inputs):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = type("Worker", (), {"processor": processor})()
    return AgentLoopWorker._compute_position_ids(worker, input_ids, attention_mask, inputs)


def test_the_verl_drop_in_processor_works_in_a_worker():
    from cases import build, reference_verl_positions, trajectories

    from mmrope_core.integrations.verl import as_verl_processor

    processor, config = build("Qwen2.5-VL")
    shipped = ray.put(as_verl_processor(processor, config))
    rng = random.Random("ray verl")
    for trajectory in trajectories("Qwen2.5-VL", rng, 4):
        input_ids, attention_mask = trajectory.verl_layout(rng, processor.tokenizer.pad_token_id)
        remote = ray.get(verl_positions_in_a_worker.remote(shipped, input_ids, attention_mask, trajectory.inputs()))
        assert torch.equal(remote, reference_verl_positions("Qwen2.5-VL", input_ids, attention_mask,
                                                            trajectory.reference_kwargs))


def test_ray_data_example():
    pipeline, _ = example("ray_data").main(count=20)
    assert len(pipeline) == 20
    assert len({positions.shape[1] for positions in pipeline}) > 1  # samples of different lengths
