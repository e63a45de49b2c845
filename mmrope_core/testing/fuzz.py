"""Fuzzing a plugin with corrupt batches, in a child process.

Real batches of the plugin's example processors are mutated the way a trainer's data goes
wrong (grids of huge, negative, float or narrow values, seconds that overflow, audio masks of
the wrong type, token ids of other dtypes, masks of other shapes, devices without values,
samples as a dataset hands them over, packed rows with moved or corrupt boundaries) and fed to
the engine of each implementation and convention, to packed rows and to the collators. Every
case must give what the model computes itself (:mod:`._direct`; each packed segment its sample's
alone), or a typed :class:`~mmrope_core.MmropeError` that is not a plugin fault; the caller's
inputs stay as they were; and no case may take long or allocate far beyond its rows. The cases
run in a child process, so that a crash in compiled code is reported (with the case that caused
it) instead of ending the caller.

``fuzz_plugin`` draws mutations from ``random.Random(seed)``; the project's own suite draws
them with hypothesis (``chooser="hypothesis"``).
"""
from __future__ import annotations

import os
import pickle
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from ._fuzzer import CALL_SECONDS, MEMORY_GROWTH, UNPICKLED, FuzzFinding, _Fuzzer

__all__ = ["CALL_SECONDS", "MEMORY_GROWTH", "UNPICKLED", "FuzzFinding", "fuzz_plugin"]


def fuzz_plugin(name: str, *, cases: Sequence[Any] | None = None, seed: int = 0, examples: int = 100,
                chooser: str = "random", timeout: float = 600.0,
                vllm_as_transformers: Sequence[str] = (),
                tally: dict[str, int] | None = None, unjudged: dict[str, int] | None = None) -> list[FuzzFinding]:
    """Fuzz plugin ``name`` (an installed entry point) with ``examples`` corrupt batches made from
    its example cases (or ``cases``, which must pickle) in a child process; return what broke a
    rule. A child that dies is a finding naming the case it was computing.

    ``vllm_as_transformers`` names example cases whose ``convention="vllm"`` positions are
    transformers' on every input; the others are held to transformers' on batches without
    video or audio, where every family's conventions agree. ``tally``, when given, gets the
    number of cases run from each example case; ``unjudged``, the number of cases whose reference
    (the model's own code) failed, so that nothing was compared, by example case, what failed and
    the error."""
    with tempfile.TemporaryDirectory(prefix="mmrope-fuzz-") as folder:
        trace, report = os.path.join(folder, "trace"), os.path.join(folder, "report")
        try:
            payload = pickle.dumps((name, cases, seed, examples, chooser, trace, report, tuple(vllm_as_transformers)))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            return [FuzzFinding(name, (), UNPICKLED,
                                f"they do not pickle ({exc}); define their functions at module level")]
        env = {**os.environ, "MMROPE_LOAD_PLUGINS": name, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))}
        try:
            child = subprocess.run([sys.executable, "-c", "from mmrope_core.testing.fuzz import _child; _child()"],
                                   input=payload, env=env, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return [FuzzFinding(name, (), "the fuzzing ends in time", f"still running after {timeout:.0f} s; "
                                f"last case: {_last_line(trace)}")]
        if child.returncode != 0 or not os.path.exists(report):
            how = f"signal {-child.returncode}" if child.returncode < 0 else f"exit {child.returncode}"
            stderr = child.stderr.decode(errors="replace").strip().splitlines()[-3:]
            return [FuzzFinding(name, (), "no input ends the process",
                                f"the process died ({how}) on: {_last_line(trace)}. {' '.join(stderr)}")]
        if tally is not None:
            _count_cases(trace, tally)
        with open(report, "rb") as file:
            findings, failed = pickle.load(file)
        if unjudged is not None:
            for key, count in failed.items():
                unjudged[key] = unjudged.get(key, 0) + count
        return findings


def _count_cases(path: str, tally: dict[str, int]) -> None:
    """Add the cases of the trace (lines ``case call [mutations]``) up by example case."""
    with open(path) as file:
        for line in file:
            case = line.rsplit(" [", 1)[0].rsplit(" ", 1)[0]
            tally[case] = tally.get(case, 0) + 1


def _last_line(path: str) -> str:
    try:
        with open(path) as file:
            lines = file.read().splitlines()
    except OSError:
        return "(before the first case)"
    return lines[-1] if lines else "(before the first case)"


def _child() -> None:
    name, cases, seed, examples, chooser, trace, report, vllm_as_transformers = pickle.loads(sys.stdin.buffer.read())
    torch.set_num_threads(2)
    fuzzer = _Fuzzer(name, trace, vllm_as_transformers)
    _cap_address_space()
    findings = fuzzer.run(cases, seed, examples, chooser)
    with open(report, "wb") as file:
        pickle.dump((findings, fuzzer.unjudged), file)


def _cap_address_space() -> None:
    """Let an allocation sized from a corrupt number fail in this process (a MemoryError the
    fuzzer reports) instead of drawing the machine's memory, and other processes, down with it."""
    try:
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = used + 8 * MEMORY_GROWTH
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (OSError, StopIteration, ValueError):
        pass  # not Linux: the peak-memory rule still reports what grew


