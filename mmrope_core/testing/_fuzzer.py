"""The fuzzer of :mod:`.fuzz`, as it runs in the child process: example cases made into bases,
mutations drawn and applied, and every rule checked on each case."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import MmropeError, PackingUnsupportedError, PluginError
from ._collated import COLLATOR_CALLS, collated_problem, media_of
from ._direct import ModelPositions
from ._mutations import CORRUPT_ROWS, REFUSED, Case, applicable, grid_keys
from ._outcomes import (
    _agrees,
    _alone,
    _as_int64,
    _batch_problem,
    _call,
    _copied,
    _equal,
    _in_range,
    _int64_ids,
    _judge,
    _kind,
    _laid_out,
    _outcome,
    _peak_memory,
    _reference_failed,
    _same,
    _snapshot,
    _timed_media,
    _unpadded,
)
from ._packed import (
    CORRUPT,
    KEEPS_LAYOUT,
    STYLES,
    corrupted,
    layout_mutations,
    merged_media,
    packed_case,
    packed_problem,
)

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


@dataclasses.dataclass
class _Subjects:
    """What one example case's batches are fed to, and what their results are held to."""

    fast: Any
    reference: Any  # the reference implementation, or None where the plugin has one implementation
    model: ModelPositions | None  # the model's own positions, or None where transformers has no model class for it
    vllm: Any = None  # the engine of convention="vllm", where the family offers it
    collators: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)

    def engine(self, case: Case) -> Any:
        if case.call in COLLATOR_CALLS:
            return self.collators[case.call, case.options.get("padding_side", "")]
        return self.vllm if case.convention == "vllm" else self.fast


class _Fuzzer:
    def __init__(self, name: str, trace: str, vllm_as_transformers: Sequence[str] = ()) -> None:
        self.name, self.trace = name, open(trace, "w")  # noqa: SIM115 (closed with the process)
        self.findings: list[FuzzFinding] = []
        #: cases whose result the model's own code could not give, by example, what and error
        self.unjudged: dict[str, int] = {}
        self.subjects: dict[str, _Subjects] = {}
        self.vllm_as_transformers = frozenset(vllm_as_transformers)

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
        self.sweep(bases)
        kinds: dict[str, list[Case]] = {}
        for base in bases:
            kinds.setdefault(_kind(base), []).append(base)
        groups = [group for kind, group in sorted(kinds.items()) for _ in range(2 if kind == "engine" else 1)]
        if chooser == "hypothesis":
            self.run_hypothesis(groups, seed, examples)
        else:
            choices = _RandomChoices(rng)
            for _ in range(examples):
                self.one(groups, choices)
        return self.findings

    def run_hypothesis(self, groups: list[list[Case]], seed: int, examples: int) -> None:
        from hypothesis import HealthCheck, Phase, given, settings, strategies
        from hypothesis import seed as seeded

        @seeded(seed)
        @settings(max_examples=examples, deadline=None, database=None, phases=(Phase.generate,),
                  suppress_health_check=list(HealthCheck))
        @given(strategies.data())
        def draw(data: Any) -> None:
            self.one(groups, _HypothesisChoices(data))

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
        subjects = self.subjects[case.name] = _Subjects(fast, reference,
                                                        ModelPositions.of(processor, config, fast.rope_kind,
                                                                          fast.batch_layout.media))
        outputs = [dict(fast.process(**sample)) for sample in case.samples(processor, rng)]
        bases = [Case(case.name, "batch", None, None, {}, {}, outputs)]
        for side in ("right", "left"):
            ids, mask, inputs = fast.batch(outputs, side)
            bases.append(Case(case.name, "position_ids", ids, mask, inputs, {}))
            if fast.rope_kind == "mrope":
                bases.append(Case(case.name, "rope_index", ids, mask, fast.rope_index_kwargs(inputs), {}))
        generated = []
        if case.batches is not None and fast.rope_kind == "mrope":
            for _ in range(4):
                sample = dict(case.batches(processor, config, rng))
                ids, mask = sample.pop("input_ids"), sample.pop("attention_mask", None)
                generated.append((ids, mask, sample))
            bases += [Case(case.name, "rope_index", ids, mask, sample, {}) for ids, mask, sample in generated[:3]]
        bases += self.packed_bases(case.name, fast, outputs, generated, rng)
        bases += self.collator_bases(case.name, subjects, outputs)
        if fast.rope_kind == "mrope":
            try:
                subjects.vllm = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm")
            except MmropeError:  # a family without vLLM's rules refuses the convention
                pass
            else:
                bases += [dataclasses.replace(base, convention="vllm") for base in bases
                          if base.call in ("position_ids", "rope_index")]
        return [dataclasses.replace(base, media=fast.batch_layout.media) for base in bases]

    @staticmethod
    def packed_bases(name: str, fast: Any, outputs: list[dict[str, Any]], generated: list[tuple[Any, Any, dict]],
                     rng: random.Random) -> list[Case]:
        """The samples packed in rows: the processor's outputs for compute_position_ids, the
        generated samples (videos, audio) for get_rope_index, each segment's media its sample's."""
        pad = getattr(getattr(fast.processor, "tokenizer", None), "pad_token_id", None) or 0
        alone = [(_unpadded(output["input_ids"], output.get("attention_mask")), media_of(output)) for output in outputs]
        samples = {"position_ids": (alone * 2, fast.collate([media for _, media in alone * 2]))}
        if generated:
            flags = {key: value for key, value in generated[0][2].items() if not isinstance(value, torch.Tensor)}
            same = [(_unpadded(ids, mask), {k: v for k, v in sample.items() if v is not None})
                    for ids, mask, sample in generated
                    if all(sample.get(key) == value for key, value in flags.items())]
            samples["rope_index"] = (same, merged_media([media for _, media in same]))
        return [packed_case(name, call, segments, inputs, style, 2, pad, rng.randint(0, 3))
                for call, (segments, inputs) in samples.items() for style in STYLES]

    def collator_bases(self, name: str, subjects: _Subjects, outputs: list[dict[str, Any]]) -> list[Case]:
        from ..collators import PackedCollator, PaddedCollator

        bases = []
        for side in ("right", "left"):
            subjects.collators["PaddedCollator", side] = PaddedCollator(subjects.fast, padding_side=side)
            bases.append(Case(name, "PaddedCollator", None, None, {}, {"padding_side": side}, outputs))
        try:
            subjects.collators["PackedCollator", ""] = PackedCollator(subjects.fast, flash_attn_kwargs=True)
        except MmropeError:  # a model whose layers cannot keep packed segments apart is refused here
            return bases
        return [*bases, Case(name, "PackedCollator", None, None, {}, {}, outputs)]

    def sweep(self, bases: list[Case]) -> None:
        """Every base as it is; each of :data:`CORRUPT_ROWS` in place of the first row of each grid
        key once per example case; each corrupt layout of :data:`CORRUPT` once per call."""
        done: set[tuple[Any, ...]] = set()
        for base in bases:
            self.check(_copied(base), ())
            # layouts are read before any plugin code runs: once per call, style and kind of RoPE
            layout = (self.subjects[base.case].fast.rope_kind, base.call, base.packed and base.packed.style)
            if base.packed is not None and base.convention == "transformers" and layout not in done:
                done.add(layout)
                for name, corruption in CORRUPT[base.packed.style]:
                    case = _copied(base)
                    self.check(case, (corrupted(case, name, corruption),))
            if base.call != "position_ids" or base.convention != "transformers" or base.packing:
                continue
            grids = set(grid_keys(base))
            for key, value in base.inputs.items():
                if (base.case, key) in done or key not in grids:
                    continue
                done.add((base.case, key))
                for row in CORRUPT_ROWS:
                    grid = value.clone()
                    grid[0] = torch.tensor(row)
                    self.check(dataclasses.replace(base, inputs={**base.inputs, key: grid}), (f"{key}[0] = {row}",))

    def one(self, groups: list[list[Case]], choices: Any) -> None:
        case = _copied(choices.choice(choices.choice(groups)))
        names = []
        for _ in range(choices.integer(0, 2)):  # none: the valid batch itself, compared with the model's
            mutation = choices.choice(layout_mutations(case) + applicable(case))
            # a mutation that does not apply to what an earlier one left is passed over
            with contextlib.suppress(AttributeError, IndexError, KeyError, RuntimeError, TypeError, ValueError,
                                     NotImplementedError):
                names.append(mutation(case, choices))
                if mutation not in KEEPS_LAYOUT:  # the segments' media or tokens are no longer known
                    case.packed = None
        self.check(case, tuple(names))

    def check(self, case: Case, names: tuple[str, ...]) -> None:
        subjects = self.subjects[case.case]
        engine = subjects.engine(case)
        self.trace.write(f"{case.case} {case.call} {case.convention} [{', '.join(names)}]\n")
        self.trace.flush()
        got = self.judged(engine, case, names)
        if not isinstance(got, BaseException):
            self.check_result(engine, case, names, got)
        if case.call in COLLATOR_CALLS:
            if not isinstance(got, BaseException):
                self.check_collated(case, names, got, subjects)
            return
        if case.convention == "vllm":
            self.check_vllm(case, names, got, subjects)
            return
        reference = subjects.reference
        want = None if reference is None else self.judged(reference, case, names)  # the reference engine is fuzzed too
        if case.call == "batch":
            return
        if want is not None:
            self.check_implementations_agree(case, names, got, want)
        if case.packing:
            for result, engine_of in ((got, subjects.fast), (want, reference)):
                if engine_of is not None:
                    self.check_packed(case, names, result, engine_of, subjects.model)
            return
        results = [result for result in (got, want) if result is not None and not isinstance(result, BaseException)]
        if not results:
            return
        if subjects.model is not None:
            own = self.model_result(subjects.model, case, names)
        else:  # no model class to ask: the reference implementation is the judge
            own = None if want is None or isinstance(want, BaseException) else want
        for result in results:
            if own is not None and not _agrees(result, own, exact_dtype=_int64_ids(case)):
                self.found(case, names, "results are the model's own", "the positions differ from what the model "
                           "computes itself")

    def check_implementations_agree(self, case: Case, names: tuple[str, ...], got: Any, want: Any) -> None:
        """The fast and reference implementations accept the same inputs."""
        if isinstance(got, BaseException):
            if not isinstance(want, BaseException) and _in_range(want) and isinstance(got, MmropeError):
                self.found(case, names, "implementations accept the same inputs", f"the engine refuses what the "
                           f"reference computes ({type(got).__name__}: {str(got)[:200]})")
        elif isinstance(want, BaseException) and not _reference_failed(want):
            self.found(case, names, "implementations accept the same inputs", f"the reference refuses the input "
                       f"({type(want).__name__}: {str(want)[:200]}) but the engine returns positions")

    def check_packed(self, case: Case, names: tuple[str, ...], got: Any, engine: Any, model: Any) -> None:
        """A valid packed layout: each segment as its sample alone (the model's own positions, or
        what ``model`` gives), and refused exactly where a segment alone is."""
        if not _laid_out(case):
            return
        exact = [segment for segment in case.packed.segments if segment.exact]
        alone = {id(segment): _outcome(functools.partial(_alone, engine, case, segment)) for segment in exact}
        refused = [k for k, segment in enumerate(case.packed.segments) if segment.exact
                   and isinstance(alone[id(segment)], BaseException)]
        which = f" ({getattr(engine, 'implementation', '')}{', ' + case.convention if case.convention != 'transformers' else ''})"
        if isinstance(got, BaseException):
            # refusing packed rows for the whole model (PackingUnsupportedError) is not refusing this input
            if (isinstance(got, MmropeError) and not isinstance(got, PackingUnsupportedError) and not refused
                    and len(exact) == len(case.packed.segments)):
                self.found(case, names, "a packed row is refused exactly where a sample alone is",
                           f"refused ({type(got).__name__}: {str(got)[:200]}) though each segment alone computes" + which)
            return
        if refused:
            self.found(case, names, "a packed row is refused exactly where a sample alone is",
                       f"segment {refused[0]} alone is refused, packed it is not" + which)
            return
        exact_dtype = _int64_ids(case) and (model is engine or case.convention == "transformers")
        if model is None or model is engine:
            problem = packed_problem(case, got, lambda segment: alone[id(segment)], exact_dtype)
        else:
            problem = packed_problem(case, got, lambda segment: _judge(lambda: _alone(model, case, segment),
                                                                       self.failed(case, names, "a packed segment alone")),
                                     exact_dtype)
        if problem:
            self.found(case, names, "packed segments are their samples alone", problem + which)

    def check_vllm(self, case: Case, names: tuple[str, ...], got: Any, subjects: _Subjects) -> None:
        """No vLLM here: the convention is held to what is known without it. Packed rows are each
        sample alone; where docs/parity.md says vLLM and transformers agree (batches without
        video or audio, and the families given), positions are the model's own."""
        agree = case.case in self.vllm_as_transformers or not _timed_media(case)
        if case.packing:
            self.check_packed(case, names, got, subjects.vllm, subjects.vllm)
            if agree and subjects.model is not None and not isinstance(got, BaseException) and case.packed is not None:
                self.check_packed(case, names, got, subjects.vllm, subjects.model)
            return
        if isinstance(got, BaseException) or not agree or subjects.model is None:
            return
        own = self.model_result(subjects.model, case, names)
        if own is not None and not _agrees(got, own, exact_dtype=False):
            self.found(case, names, "the vLLM convention is transformers' where they agree",
                       "the positions differ from what the model computes itself")

    def check_collated(self, case: Case, names: tuple[str, ...], batch: Any, subjects: _Subjects) -> None:
        collator = subjects.engine(case)
        own = subjects.model if subjects.model is not None else subjects.reference
        problem = collated_problem(case.outputs, batch, collator, own, self.failed(case, names, "a collated sample"))
        if problem:
            self.found(case, names, "a collator's batch holds each sample as it is alone", problem)

    def model_result(self, model: ModelPositions, case: Case, names: tuple[str, ...]) -> Any:
        """What the model computes itself on the case's inputs, or None where it fails (counted)."""
        failed = self.failed(case, names, "the batch")
        if case.call == "position_ids":
            return _judge(lambda: model.position_ids(case.ids, case.mask, case.inputs, case.options), failed)
        return _judge(lambda: model.rope_index(case.ids, case.mask, case.inputs), failed)

    def failed(self, case: Case, names: tuple[str, ...], what: str) -> Any:
        """What counts a case whose reference, the model's own code, fails on ``what``: nothing is
        compared there. On an example's own valid samples (no mutation), where the model must
        compute, it is a finding too: the check it stands for never runs."""
        def count(error: BaseException) -> None:
            key = f"{case.case}: {what} ({type(error).__name__})"
            self.unjudged[key] = self.unjudged.get(key, 0) + 1
            if not names and what != "the batch":
                self.found(case, names, "the model computes each example sample alone",
                           f"its own code fails on {what} ({type(error).__name__}: {str(error)[:200]}), so the "
                           f"result goes unchecked")
        return count

    def check_result(self, engine: Any, case: Case, names: tuple[str, ...], got: Any) -> None:
        """What a result must be whatever the reference says."""
        one_d = getattr(engine, "rope_kind", "mrope") == "1d"
        grids = tuple(f"{REFUSED}{key} " for key, rule in case.media.items() if rule.role == "grid") if one_d else ()
        refused = [name for name in names if name.startswith(REFUSED)
                   and not name.startswith(grids)]  # 1-D positions read no grid
        if refused:
            self.found(case, names, "an input that cannot be read is refused", f"{refused[0]} gave a result")
        if case.call == "batch":
            problem = _batch_problem(case.outputs, got)
            if problem:
                self.found(case, names, "a batch holds its samples as given", problem)
            return
        if case.call in COLLATOR_CALLS:
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
        floor = _peak_memory()  # what the process (this snapshot included) reached before the call
        start = time.perf_counter()
        outcome = _outcome(lambda: _call(engine, case))
        spent = time.perf_counter() - start
        which = f" ({getattr(engine, 'implementation', type(engine).__name__)})"
        if not _same(before, _snapshot(case, copied=False)):
            self.found(case, names, "inputs are not changed", "the call changed its inputs" + which)
        if spent > CALL_SECONDS:
            self.found(case, names, "a case costs what its rows cost", f"the call took {spent:.1f} s" + which)
        grown = _peak_memory() - floor
        if grown > MEMORY_GROWTH:
            self.found(case, names, "a case costs what its rows cost", f"peak memory grew by {grown >> 20} MiB" + which)
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, MmropeError) or isinstance(outcome, PluginError):
                self.found(case, names, "bad input raises a typed input error",
                           f"{type(outcome).__name__}: {outcome}" + which)
            elif not str(outcome).strip():
                self.found(case, names, "errors say what is wrong", f"{type(outcome).__name__} without a message")
        return outcome

    def found(self, case: Case, names: tuple[str, ...], rule: str, detail: str) -> None:
        self.findings.append(FuzzFinding(case.case, (case.call, *names), rule, detail))


