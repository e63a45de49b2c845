"""Fuzzing a plugin with corrupt batches, in a child process.

Real batches of the plugin's example processors are mutated the way a trainer's data goes
wrong (grids of huge, negative, float or narrow values, seconds that overflow, audio masks of
the wrong type, token ids of other dtypes, masks of other shapes, devices without values) and
fed to the engine. Every case must give the reference implementation's result, or a typed
:class:`~mmrope_core.MmropeError` that is not a plugin fault; the caller's inputs stay as they
were; and no case may take long or allocate far beyond its rows. The cases run in a child
process, so that a crash in compiled code is reported (with the case that caused it) instead of
ending the caller.

``fuzz_plugin`` draws mutations from ``random.Random(seed)``; the project's own suite draws
them with hypothesis (``chooser="hypothesis"``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import MmropeError, PluginError
from ._mutations import CORRUPT_ROWS, REFUSED, Case, applicable, is_grid

#: A call may take this long (seconds) and raise the process's peak memory this much (bytes):
#: the batches are a few hundred tokens, so anything sized from a corrupt number shows.
CALL_SECONDS = 5.0
MEMORY_GROWTH = 512 * 2**20

UNPICKLED = "example cases reach the fuzzing process"


@dataclasses.dataclass(frozen=True)
class FuzzFinding:
    """One case that broke a rule: the example, what was mutated, and what happened."""

    case: str
    mutations: tuple[str, ...]
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case} [{', '.join(self.mutations)}]: {self.rule}: {self.detail}"


def fuzz_plugin(name: str, *, cases: Sequence[Any] | None = None, seed: int = 0, examples: int = 100,
                chooser: str = "random", timeout: float = 600.0,
                tally: dict[str, int] | None = None) -> list[FuzzFinding]:
    """Fuzz plugin ``name`` (an installed entry point) with ``examples`` corrupt batches made from
    its example cases (or ``cases``, which must pickle) in a child process; return what broke a
    rule. A child that dies is a finding naming the case it was computing. ``tally``, when given,
    gets the number of cases run from each example case."""
    with tempfile.TemporaryDirectory(prefix="mmrope-fuzz-") as folder:
        trace, report = os.path.join(folder, "trace"), os.path.join(folder, "report")
        try:
            payload = pickle.dumps((name, cases, seed, examples, chooser, trace, report))
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
            return pickle.load(file)


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
    name, cases, seed, examples, chooser, trace, report = pickle.loads(sys.stdin.buffer.read())
    torch.set_num_threads(2)
    fuzzer = _Fuzzer(name, trace)
    _cap_address_space()
    findings = fuzzer.run(cases, seed, examples, chooser)
    with open(report, "wb") as file:
        pickle.dump(findings, file)


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


class _RandomChoices:
    """The choices a mutation makes, from a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.rng.randrange(len(options))]

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


class _HypothesisChoices:
    """The same choices drawn by hypothesis (``st.data()``)."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies

        self.data, self.strategies = data, strategies

    def choice(self, options: Sequence[Any]) -> Any:
        return options[self.data.draw(self.strategies.integers(0, len(options) - 1))]

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(self.strategies.integers(low, high))


class _Fuzzer:
    def __init__(self, name: str, trace: str) -> None:
        self.name, self.trace = name, open(trace, "w")  # noqa: SIM115 (closed with the process)
        self.findings: list[FuzzFinding] = []
        self.engines: dict[str, tuple[Any, Any]] = {}

    def run(self, cases: Sequence[Any] | None, seed: int, examples: int, chooser: str) -> list[FuzzFinding]:
        from ..manager import PluginManager

        manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": self.name})
        if cases is None:
            cases = [case for result in manager.results_of(self.name, "example_cases") if result for case in result]
        bases: list[Case] = []
        rng = random.Random(seed)
        for case in cases:
            try:
                bases.extend(self.bases(case, manager, rng))
            except Exception as exc:  # the plugin's own examples: reported, the others fuzzed
                self.findings.append(FuzzFinding(case.name, (), "example cases build, process and batch",
                                                 f"{type(exc).__name__}: {exc}"))
        if not bases:
            return self.findings
        self.baseline = _peak_memory()
        self.sweep(bases)
        if chooser == "hypothesis":
            self.run_hypothesis(bases, seed, examples)
        else:
            choices = _RandomChoices(rng)
            for _ in range(examples):
                self.one(bases, choices)
        return self.findings

    def run_hypothesis(self, bases: list[Case], seed: int, examples: int) -> None:
        from hypothesis import HealthCheck, Phase, given, settings, strategies
        from hypothesis import seed as seeded

        @seeded(seed)
        @settings(max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
                  suppress_health_check=list(HealthCheck))
        @given(strategies.data())
        def draw(data: Any) -> None:
            self.one(bases, _HypothesisChoices(data))

        draw()

    def bases(self, case: Any, manager: Any, rng: random.Random) -> list[Case]:
        from ..engine import RopeEngine

        processor, config = case.build()
        fast = RopeEngine.from_processor(processor, config, plugin_manager=manager)
        try:
            reference = RopeEngine.from_processor(processor, config, plugin_manager=manager,
                                                  implementation="reference")
        except MmropeError:  # a plugin with one implementation: no second opinion
            reference = None
        self.engines[case.name] = (fast, reference)
        outputs = [dict(fast.process(**sample)) for sample in case.samples(processor, rng)]
        bases = [Case(case.name, "batch", None, None, {}, {}, outputs)]
        for side in ("right", "left"):
            ids, mask, inputs = fast.batch(outputs, side)
            bases.append(Case(case.name, "position_ids", ids, mask, inputs, {}))
            if fast.rope_kind == "mrope":
                bases.append(Case(case.name, "rope_index", ids, mask, fast.rope_index_kwargs(inputs), {}))
        if case.batches is not None and fast.rope_kind == "mrope":
            for _ in range(3):
                sample = dict(case.batches(processor, config, rng))
                ids, mask = sample.pop("input_ids"), sample.pop("attention_mask", None)
                bases.append(Case(case.name, "rope_index", ids, mask, sample, {}))
        return bases

    def sweep(self, bases: list[Case]) -> None:
        """Each of :data:`CORRUPT_ROWS` in place of the first row of each grid key, once per case."""
        done = set()
        for base in bases:
            for key, value in base.inputs.items():
                if base.call == "batch" or (base.case, key) in done or not is_grid(key, value):
                    continue
                done.add((base.case, key))
                for row in CORRUPT_ROWS:
                    grid = value.clone()
                    grid[0] = torch.tensor(row)
                    self.check(dataclasses.replace(base, inputs={**base.inputs, key: grid}), (f"{key}[0] = {row}",))

    def one(self, bases: list[Case], choices: Any) -> None:
        base = choices.choice(bases)
        case = dataclasses.replace(base, inputs=dict(base.inputs), outputs=[dict(o) for o in base.outputs])
        names = []
        for _ in range(choices.integer(0, 2)):  # none: the valid batch itself, compared with the reference
            mutation = choices.choice(applicable(case))
            # a mutation that does not apply to what an earlier one left is passed over
            with contextlib.suppress(AttributeError, IndexError, KeyError, RuntimeError, TypeError, ValueError,
                                     NotImplementedError):
                names.append(mutation(case, choices))
        self.check(case, tuple(names))

    def check(self, case: Case, names: tuple[str, ...]) -> None:
        fast, reference = self.engines[case.case]
        self.trace.write(f"{case.case} {case.call} [{', '.join(names)}]\n")
        self.trace.flush()
        got = self.judged(fast, case, names)
        if not isinstance(got, BaseException):
            self.check_result(fast, case, names, got)
        if reference is None:
            return
        want = self.judged(reference, case, names)  # the reference engine is fuzzed too
        if case.call == "batch":
            return
        if isinstance(got, BaseException):
            if not isinstance(want, BaseException) and _in_range(want) and isinstance(got, MmropeError):
                self.found(case, names, "results are the reference's", f"the engine refuses what the reference "
                           f"computes ({type(got).__name__}: {str(got)[:200]})")
            return
        if isinstance(want, BaseException):
            if _reference_failed(want):
                return
            self.found(case, names, "results are the reference's", f"the reference refuses the input "
                       f"({type(want).__name__}: {str(want)[:200]}) but the engine returns positions")
        elif not _equal(got, want):
            self.found(case, names, "results are the reference's", "the positions differ from the reference's")

    def check_result(self, engine: Any, case: Case, names: tuple[str, ...], got: Any) -> None:
        """What a result must be whatever the reference says."""
        refused = [name for name in names if name.startswith(REFUSED)
                   and (engine.rope_kind == "mrope" or "_grid_thw" not in name)]  # 1-D positions read no grid
        if refused:
            self.found(case, names, "an input that cannot be read is refused", f"{refused[0]} gave a result")
        if case.call == "batch":
            problem = _batch_problem(case.outputs, got)
            if problem:
                self.found(case, names, "a batch holds its samples as given", problem)
            return
        positions = (got[0] if isinstance(got, tuple) else got).double()
        if not _in_range(got):
            self.found(case, names, "positions lie between 0 and 2**62",
                       f"found {positions.min().item()} to {positions.max().item()}")
        if isinstance(case.ids, torch.Tensor) and case.ids.dtype != torch.int64 and case.ids.device.type != "meta":
            wide = _outcome(lambda: _call(engine, dataclasses.replace(case, ids=case.ids.long())))
            if not isinstance(wide, BaseException) and not _equal(_as_int64(got), _as_int64(wide)):
                self.found(case, names, "positions do not depend on the ids' dtype",
                           f"{case.ids.dtype} ids give other positions than int64 ids")

    def judged(self, engine: Any, case: Case, names: tuple[str, ...]) -> Any:
        """The engine's result or error, after checking the rules every call keeps."""
        before = _snapshot(case)
        start = time.perf_counter()
        outcome = _outcome(lambda: _call(engine, case))
        spent = time.perf_counter() - start
        which = f" ({engine.implementation})"
        if not _same(before, _snapshot(case)):
            self.found(case, names, "inputs are not changed", "the call changed its inputs" + which)
        if spent > CALL_SECONDS:
            self.found(case, names, "a case costs what its rows cost", f"the call took {spent:.1f} s" + which)
        grown = _peak_memory() - self.baseline
        if grown > MEMORY_GROWTH:
            self.found(case, names, "a case costs what its rows cost", f"peak memory grew by {grown >> 20} MiB" + which)
            self.baseline = _peak_memory()
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, MmropeError) or isinstance(outcome, PluginError):
                self.found(case, names, "bad input raises a typed input error",
                           f"{type(outcome).__name__}: {outcome}" + which)
            elif not str(outcome).strip():
                self.found(case, names, "errors say what is wrong", f"{type(outcome).__name__} without a message")
        return outcome

    def found(self, case: Case, names: tuple[str, ...], rule: str, detail: str) -> None:
        self.findings.append(FuzzFinding(case.case, (case.call, *names), rule, detail))


def _call(engine: Any, case: Case) -> Any:
    if case.call == "batch":
        return engine.batch(iter(case.outputs))
    if case.call == "position_ids":
        return engine.compute_position_ids(case.ids, case.mask, case.inputs, case.options or None)
    return engine.get_rope_index(case.ids, case.mask, **case.inputs)


def _batch_problem(outputs: list[dict[str, Any]], got: Any) -> str:
    """Where ``engine.batch``'s result does not hold each sample's ids, mask and media keys."""
    ids, mask, media = got
    for index, output in enumerate(outputs):
        row = output["input_ids"].reshape(-1)
        given = output.get("attention_mask")
        row_mask = torch.ones_like(row) if given is None else given.reshape(-1)
        for span in (slice(0, row.numel()), slice(ids.shape[1] - row.numel(), ids.shape[1])):
            if torch.equal(ids[index, span].long(), row.long()) and torch.equal(mask[index, span].long(), row_mask.long()):
                break
        else:
            return f"sample {index}'s ids or mask are not in row {index}"
    keys = {key for output in outputs for key, value in output.items()
            if value is not None and key not in ("input_ids", "attention_mask")}
    return "" if keys == set(media) else f"the media keys are {sorted(media)}, the samples hold {sorted(keys)}"


def _reference_failed(error: BaseException) -> bool:
    """A typed error the reference implementation raised because its own code failed on the input
    (chained from that failure): there is no reference result to hold the engine to."""
    return isinstance(error, MmropeError) and error.__cause__ is not None and not isinstance(
        error.__cause__, MmropeError)


def _in_range(result: Any) -> bool:
    """Positions between 0 and 2**62: none wrapped around or overflowed."""
    positions = (result[0] if isinstance(result, tuple) else result).double()
    return not positions.numel() or bool(((positions >= 0) & (positions < 2.0**62)).all())


def _as_int64(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_as_int64(item) for item in result)
    return result.long() if not result.dtype.is_floating_point else result


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # each is judged by the caller
        return exc


def _peak_memory() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- comparing ---------------------------------------------------------------------------------------

def _snapshot(case: Case) -> Any:
    return _copy((case.ids, case.mask, case.inputs, case.outputs))


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.device.type, value.dtype, tuple(value.shape),
                None if value.device.type == "meta" else value.detach().clone())
    if isinstance(value, np.ndarray):
        return ("array", value.copy())
    if isinstance(value, Mapping):
        return ("dict", tuple((key, _copy(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_copy(item) for item in value))
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b) if a.dtype.is_complex or not a.dtype.is_floating_point
                                                 else torch.equal(a.nan_to_num(), b.nan_to_num())))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _equal(got: Any, want: Any) -> bool:
    if isinstance(got, tuple):
        return isinstance(want, tuple) and len(got) == len(want) and all(_equal(a, b) for a, b in zip(got, want))
    return (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.dtype == want.dtype
            and got.shape == want.shape and bool(torch.equal(got, want)))
