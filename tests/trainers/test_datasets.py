"""A real engine in ``datasets.Dataset.map`` with two worker processes."""

import importlib.util
from pathlib import Path

import torch

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_datasets_map_example():
    spec = importlib.util.spec_from_file_location("mmrope_example_datasets_map", EXAMPLES / "datasets_map.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pipeline, serial = module.main(count=18)
    assert len(pipeline) == 18 and all(torch.equal(a, b) for a, b in zip(pipeline, serial))
    assert pipeline[0].dtype == torch.float32  # Qwen3-Omni's positions, fractional after timed videos
    assert len({positions.shape[1] for positions in pipeline}) > 1
