"""Timing shared by the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import transformers


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Seconds of the least disturbed of ``repeat`` calls, after one warm-up call: these
    machines are noisy, so the minimum is the estimate least affected by other load."""
    fn()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return min(samples)


def environment() -> str:
    return f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.get_num_threads()} threads"
