"""What the benchmarks share: engines of one plugin, and timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import transformers

from mmrope_core import PluginManager, RopeEngine


def engine(processor, config, plugin: str, **options) -> RopeEngine:
    """An engine that loads only ``plugin``, so that other installed plugins do not take part."""
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": plugin})
    return RopeEngine.from_processor(processor, config, plugin_manager=manager, **options)


def timed(fns: Mapping[str, Callable[[], object]], repeat: int, block: int = 5) -> dict[str, float]:
    """Seconds per call of each function: the least disturbed of ``repeat`` rounds, in each of
    which every function runs ``block`` times in a row (the first call warms caches and the
    allocator after the others ran). The functions take turns, so that a change in the
    machine's load (these machines are noisy) hits all of them alike and ratios stay meaningful."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            for _ in range(block):
                started = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - started)
    return best


def environment() -> str:
    return f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads"
