"""What the sequence- and context-parallel tests share: a process group of any size seen from
any rank, the frameworks' own cutting functions imported as far as they import without a GPU,
and packed rows of real samples (videos, Omni audio in video)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import random
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from mmrope_core import RopeEngine

SIZES = (2, 4, 8)
RANKS = [(size, rank) for size in SIZES for rank in range(size)]
# family, the samples' generator seeds (videos among them), processor arguments
FAMILIES = {"Qwen2.5-VL": ((1, 2, 3), {}), "Qwen3-VL": ((3, 4, 7), {}),
            "Qwen2.5-Omni": (None, {"use_audio_in_video": True})}


@contextlib.contextmanager
def world(size: int, rank: int) -> Iterator[Any]:
    """A process group of ``size`` ranks as rank ``rank`` sees it (torch's ``fake`` backend: the
    size and rank are real, collectives move nothing), with Megatron-core's parallel state
    initialised on it (context parallel ``size``) and verl's Ulysses group set to it."""
    from megatron.core import parallel_state
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from verl.utils import ulysses

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=size)
    try:
        parallel_state.initialize_model_parallel(context_parallel_size=size, create_gloo_process_groups=False)
        ulysses.set_ulysses_sequence_parallel_group(dist.group.WORLD)
        yield dist.group.WORLD
    finally:
        ulysses.set_ulysses_sequence_parallel_group(None)
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def without_package_init(*packages: str) -> None:
    """Register ``packages`` as bare packages, their ``__init__`` not run: mcore-bridge's applies
    patches to Transformer Engine and Megatron-Bridge's imports its PEFT layers, both of which
    import Transformer Engine (CUDA only); the modules under them import without it."""
    for name in packages:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, name
        package = types.ModuleType(name)
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules[name] = package


@functools.cache
def split_cp_inputs() -> Any:
    """mcore-bridge 1.6.5's ``split_cp_inputs`` (ms-swift's Megatron and ring-attention cut)."""
    without_package_init("mcore_bridge")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Megatron-core: no Transformer Engine, no Apex
        return importlib.import_module("mcore_bridge.utils.megatron_utils").split_cp_inputs


@functools.cache
def engine_and_rows(family: str) -> tuple[RopeEngine, list[dict[str, Any]], dict[str, Any]]:
    """The family's engine, three samples as ``PackedCollator`` takes them and the processor
    arguments their positions need."""
    seeds, kwargs = FAMILIES[family]
    if family == "Qwen2.5-Omni":
        return _omni_rows(kwargs)
    from mmrope_qwen_vl.examples import build, one_sample

    processor, config = build(family)
    rows = []
    for seed in seeds:
        sample = one_sample(processor, config, random.Random(seed))
        rows.append({key: value for key, value in sample.items() if key != "attention_mask"})
    assert any("video_grid_thw" in row for row in rows)
    return RopeEngine.from_processor(processor, config), rows, kwargs


def _omni_rows(kwargs: dict[str, Any]) -> tuple[RopeEngine, list[dict[str, Any]], dict[str, Any]]:
    from mmrope_qwen3_omni.examples import build, one_sample

    processor, config = build("Qwen2.5-Omni")
    rng = random.Random(3)
    rows = []
    while len(rows) < 3:
        sample = one_sample(processor, config, rng)
        if not sample["use_audio_in_video"] or sample["audio_seqlens"] is None:
            continue
        valid = sample["attention_mask"][0].bool()
        row = {"input_ids": sample["input_ids"][:, valid], "video_grid_thw": sample["video_grid_thw"],
               "video_second_per_grid": sample["second_per_grids"]}
        frames = sample["audio_seqlens"]
        row["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).long()
        if sample["image_grid_thw"] is not None:
            row["image_grid_thw"] = sample["image_grid_thw"]
        rows.append(row)
    return RopeEngine.from_processor(processor, config), rows, kwargs


def alone(engine: RopeEngine, row: dict[str, Any], kwargs: dict[str, Any]) -> torch.Tensor:
    """A sample's own ``(4, L)`` positions."""
    inputs = {key: value for key, value in row.items() if key not in ("input_ids", "attention_mask", "labels")}
    return engine.compute_position_ids(row["input_ids"], None, inputs, kwargs)[0]


def arange_row(length: int) -> torch.Tensor:
    """A ``(1, length)`` row holding its own indices: what a framework's cut leaves of it is the
    framework's index."""
    return torch.arange(length)[None]
