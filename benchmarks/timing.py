"""What the benchmarks share: engines of one plugin, and timing."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
import tracemalloc
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


MEMORY_HEADER = f"{'call':<30}{'output':>12}{'peak RSS':>14}{'beyond the output':>21}{'traced':>14}"


def peak_memory(name: str, call: Callable[[], object]) -> None:
    """Print the peak resident memory of ``call()`` beyond the size of its output (the first
    tensor it returns), and what tracemalloc saw (numpy's and the extension's allocations; torch's
    are not traced). Run it in a fresh process, see :func:`in_fresh_processes`."""
    gc.collect()
    tracemalloc.start()
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the peak from here
    result = call()
    peak = _status("VmHWM") - before
    traced = tracemalloc.get_traced_memory()[1]
    out = result[0] if isinstance(result, tuple) else result
    size = out.numel() * out.element_size()
    print(f"{name:<30}{size / 2**20:>8.2f} MiB{peak / 2**20:>10.2f} MiB{(peak - size) / 2**10:>+9.0f} KiB"
          f"{(peak - size) / size:>+8.1%}{traced / 2**10:>10.0f} KiB")


def in_fresh_processes(script: str, calls: list[str]) -> None:
    """Run ``script --measure-memory-of CALL`` for each call, each in a process of its own whose
    allocator maps every block of 64 KiB or more afresh, so that none hides in memory freed before."""
    print(MEMORY_HEADER)
    for call in calls:
        subprocess.run([sys.executable, script, "--measure-memory-of", call], check=True,
                       env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)})


def _status(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key))
