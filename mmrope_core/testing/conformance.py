"""The rules every plugin must keep, checked on inputs generated from its example processors."""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import random
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..engine import RopeEngine
from ..errors import MmropeError, PackingUnsupportedError
from ..independence import probe
from ..manager import PluginManager
from ..positions import text_positions
from ..types import ExampleCase, RopeBinding, ValidationPolicy


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule: which hook of which plugin, on which example, and what happened."""

    plugin: str
    hook: str
    rule: str
    detail: str
    case: str = ""

    def __str__(self) -> str:
        where = f" on {self.case}" if self.case else ""
        return f"plugin {self.plugin}: {self.hook} broke rule '{self.rule}'{where}: {self.detail}"


class _ForeignProcessor:
    """A processor no plugin should claim."""

    image_token = "<foreign>"
    tokenizer = None


@dataclasses.dataclass
class CaseChecked:
    """What the conformance rules were checked on for one example case."""

    case: str
    processor: str = "-"
    kind: str = "-"
    samples: int = 0
    checks: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


@dataclasses.dataclass
class CheckReport:
    """What :func:`run_checks` checked: each example case, the fuzz cases per example, the time,
    and every violation found."""

    plugin: str
    cases: list[CaseChecked] = dataclasses.field(default_factory=list)
    fuzzed: dict[str, int] = dataclasses.field(default_factory=dict)
    unjudged: dict[str, int] = dataclasses.field(default_factory=dict)
    violations: list[Violation] = dataclasses.field(default_factory=list)
    seconds: float = 0.0


def check_plugin(
    name: str,
    *,
    cases: Sequence[ExampleCase] | None = None,
    manager: PluginManager | None = None,
    seed: int = 0,
    fuzz_examples: int = 300,
) -> list[Violation]:
    """Run every conformance rule on plugin ``name`` (an entry-point or registered name).

    ``cases`` default to the plugin's own ``example_cases``. ``manager`` defaults to a fresh one
    that loads only this plugin from the installed entry points. ``fuzz_examples`` corrupt
    batches are then fed to the installed entry point ``name`` in a child process
    (:func:`~mmrope_core.testing.fuzz.fuzz_plugin`); 0 skips the fuzzing.
    """
    return run_checks(name, cases=cases, manager=manager, seed=seed, fuzz_examples=fuzz_examples).violations


def run_checks(
    name: str,
    *,
    cases: Sequence[ExampleCase] | None = None,
    manager: PluginManager | None = None,
    seed: int = 0,
    fuzz_examples: int = 300,
) -> CheckReport:
    """:func:`check_plugin`, reporting what was checked besides what broke."""
    started = time.perf_counter()
    report = CheckReport(name)
    manager = manager or PluginManager(env={"MMROPE_LOAD_PLUGINS": name})
    info = {plugin.name: plugin for plugin in manager.plugins()}.get(name)
    if info is None or info.status != "active":
        state = "not installed" if info is None else f"{info.status}: {info.reason}"
        report.violations.append(Violation(name, "entry point", "the plugin loads", state))
        return report
    checker = _Checker(name, manager, random.Random(seed))
    checked = checker.example_cases() if cases is None else cases
    if not checked:
        checker.fail("example_cases", "examples exist", "the plugin offers no example case to check it on")
    for case in checked:
        case_started = time.perf_counter()
        checker.check_case(case)
        checker.checked[-1].seconds = time.perf_counter() - case_started
    checker.check_foreign()
    report.cases = checker.checked
    if fuzz_examples and info.distribution:  # a child process finds installed entry points only
        from .fuzz import UNPICKLED, fuzz_plugin

        for finding in fuzz_plugin(name, cases=cases, seed=seed, examples=fuzz_examples, tally=report.fuzzed,
                                   unjudged=report.unjudged):
            if finding.rule == UNPICKLED:  # the caller's cases, not the plugin, cannot reach the child
                warnings.warn(f"{name}: not fuzzed: {finding.detail}", stacklevel=2)
                continue
            checker.violations.append(Violation(name, "kernel (fuzzed)", finding.rule,
                                                f"[{', '.join(finding.mutations)}] {finding.detail}", finding.case))
    report.violations = checker.violations
    report.seconds = time.perf_counter() - started
    return report


def assert_conforms(name: str, **kwargs: Any) -> None:
    """Raise ``AssertionError`` listing every violation of plugin ``name``."""
    violations = check_plugin(name, **kwargs)
    if violations:
        raise AssertionError(f"{len(violations)} conformance violation(s):\n" + "\n".join(f"  - {v}" for v in violations))


class _Checker:
    def __init__(self, name: str, manager: PluginManager, rng: random.Random) -> None:
        self.name, self.manager, self.rng = name, manager, rng
        self.violations: list[Violation] = []
        self.checked: list[CaseChecked] = []
        self.case = ""

    def ran(self, check: str) -> None:
        """Record that ``check`` ran on the case under way."""
        self.checked[-1].checks.append(check)

    def fail(self, hook: str, rule: str, detail: str) -> None:
        self.violations.append(Violation(self.name, hook, rule, detail, self.case))

    def own(self, hook: str, **kwargs: Any) -> list[Any]:
        """Results of this plugin's implementation of ``hook`` alone (wrappers of its own applied)."""
        try:
            return self.manager.results_of(self.name, hook, **kwargs)
        except Exception as exc:
            self.fail(hook, "hooks do not raise on valid input", f"{type(exc).__name__}: {exc}")
            return []

    def example_cases(self) -> list[ExampleCase]:
        cases: list[ExampleCase] = []
        for result in self.own("example_cases"):
            if result is None:
                continue
            if not isinstance(result, Iterable) or not all(isinstance(case, ExampleCase) for case in result):
                self.fail("example_cases", "returns a list of ExampleCase", f"got {result!r}")
                continue
            cases.extend(result)
        return cases

    def check_foreign(self) -> None:
        self.case = "a processor of no family"
        self.checked.append(CaseChecked(self.case, "_ForeignProcessor", checks=["every hook returns None"]))
        foreign = _ForeignProcessor()
        for hook, kwargs in (
            ("bind_rope_index", {"processor": foreign, "config": None, "options": {}}),
            ("get_rope_index_kwargs", {"processor": foreign, "multi_modal_inputs": {}, "mm_processor_kwargs": {}}),
            ("validate_inputs_policy", {"processor": foreign}),
            ("varlen_keys", {"processor": foreign}),
        ):
            for result in self.own(hook, **kwargs):
                if result is not None:
                    self.fail(hook, "returns None for processors it does not handle", f"returned {result!r}")
        self.case = ""

    def check_case(self, case: ExampleCase) -> None:
        self.case = case.name
        self.checked.append(CaseChecked(case.name))
        try:
            processor, config = case.build()
        except Exception as exc:
            self.fail("example_cases", "example processors build offline", f"{type(exc).__name__}: {exc}")
            return
        self.checked[-1].processor = type(processor).__name__
        if not self.check_hook_types(processor, config):
            return
        try:
            engine = RopeEngine.from_processor(processor, config, plugin_manager=self.manager)
            outputs = [engine.process(**sample) for sample in case.samples(processor, self.rng)]
        except MmropeError as exc:
            self.fail("bind_rope_index", "an engine builds for its own processor", f"{type(exc).__name__}: {exc}")
            return
        self.checked[-1].kind, self.checked[-1].samples = engine.rope_kind, len(outputs)
        if engine.plugin_name != self.name:
            self.fail("bind_rope_index", "claims its own processors", f"the engine was bound by {engine.plugin_name}")
            return
        if len(outputs) < 2:
            self.fail("example_cases", "examples hold at least two samples", f"got {len(outputs)}")
            return
        self.check_kwargs_do_not_mutate(processor, outputs)
        self.check_positions(engine, outputs)
        self.case = ""

    def check_hook_types(self, processor: Any, config: Any) -> bool:
        self.ran("hook return types")
        bindings = [r for r in self.own("bind_rope_index", processor=processor, config=config, options={}) if r is not None]
        if not bindings:
            self.fail("bind_rope_index", "claims its own processors", f"returned None for {type(processor).__name__}")
            return False
        if not all(isinstance(b, RopeBinding) for b in bindings):
            self.fail("bind_rope_index", "returns a RopeBinding or None", f"got {bindings!r}")
            return False
        for policy in self.own("validate_inputs_policy", processor=processor):
            if policy is not None and not isinstance(policy, ValidationPolicy):
                self.fail("validate_inputs_policy", "returns a ValidationPolicy or None", f"got {policy!r}")
        for keys in self.own("varlen_keys", processor=processor):
            if keys is not None and (isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable)
                                     or not all(isinstance(key, str) for key in keys)):
                self.fail("varlen_keys", "returns key names or None", f"got {keys!r}")
        return True

    def check_kwargs_do_not_mutate(self, processor: Any, outputs: Sequence[Mapping[str, Any]]) -> None:
        self.ran("hooks leave their inputs unchanged")
        for output in outputs:
            inputs = {k: v for k, v in output.items() if k not in ("input_ids", "attention_mask")}
            before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            keys = list(inputs)
            for result in self.own("get_rope_index_kwargs", processor=processor, multi_modal_inputs=inputs,
                                   mm_processor_kwargs={}):
                if result is not None and not isinstance(result, Mapping):
                    self.fail("get_rope_index_kwargs", "returns a dict or None", f"got {type(result).__name__}")
            if list(inputs) != keys or any(not _same(before[k], inputs[k]) for k in keys):
                self.fail("get_rope_index_kwargs", "does not change its inputs", "multi_modal_inputs changed in the call")

    def check_positions(self, engine: RopeEngine, outputs: Sequence[Mapping[str, Any]]) -> None:
        hook = "bind_rope_index"
        self.ran("positions: shape, dtype, determinism, batch = each sample alone, left = right padding")
        try:
            right = engine.batch(outputs, "right")
            left = engine.batch(outputs, "left")
        except MmropeError as exc:
            self.fail("varlen_keys", "declared varlen keys collate", str(exc))
            return
        try:
            batched = engine.compute_position_ids(*right)
            again = engine.compute_position_ids(*right)
            left_positions = engine.compute_position_ids(*left)
            alone = [engine.compute_position_ids(*engine.batch([output])) for output in outputs]
        except MmropeError as exc:
            self.fail(hook, "computes positions for its own examples", f"{type(exc).__name__}: {exc}")
            return
        rows = engine.binding.kernel.rope_rows if engine.binding.kernel is not None else 3
        expected_shape = (*right[0].shape[:1], rows + 1, right[0].shape[1]) if engine.rope_kind == "mrope" else tuple(right[0].shape)
        if tuple(batched.shape) != expected_shape:
            self.fail(hook, "output shape", f"expected {expected_shape}, got {tuple(batched.shape)}")
            return
        if batched.dtype != engine.position_dtype or (not engine.position_dtype.is_floating_point
                                                      and batched.dtype != torch.int64):
            self.fail(hook, "int64 positions unless the kernel declares another dtype",
                      f"got {batched.dtype}, the kernel declares {engine.position_dtype}")
        if not torch.equal(batched, again):
            self.fail(hook, "determinism", "two calls on the same batch differ")
        for index, (single, output) in enumerate(zip(alone, outputs)):
            n = output["input_ids"].shape[1]
            if not torch.equal(_valid(batched, right[1], index), _valid(single, None, 0)):
                self.fail(hook, "batched results equal per-sample results", f"sample {index} ({n} tokens) differs")
            if not torch.equal(_valid(batched, right[1], index), _valid(left_positions, left[1], index)):
                self.fail(hook, "left and right padding give the same valid positions", f"sample {index} differs")
        if engine.rope_kind == "mrope":
            self.check_rope_index(engine, outputs, {"right": right, "left": left})
        self.check_packing(engine, outputs, right[2], alone)
        self.ran("the engine pickles")
        try:
            # what an unpickled engine is rebuilt from, rebuilt here with this checker's plugins
            _rebuild, (processor, config, options) = pickle.loads(pickle.dumps(engine.__reduce__()))
            clone = RopeEngine.from_processor(processor, config, plugin_manager=self.manager, **options)
            if not torch.equal(clone.compute_position_ids(*right), batched):
                self.fail(hook, "the engine pickles", "the unpickled engine computes other positions")
        except Exception as exc:
            self.fail(hook, "the engine pickles", f"{type(exc).__name__}: {exc}")

    def check_rope_index(self, engine: RopeEngine, outputs: Sequence[Mapping[str, Any]], batches) -> None:
        """``get_rope_index`` as the model's method returns it, and the four rows of
        ``compute_position_ids`` made of it: the text row over its positions."""
        hook = "bind_rope_index"
        rule = "position_ids equal the text row over rope_index's positions"
        self.ran("get_rope_index: layout, = compute_position_ids' rows, batch = each sample alone")
        for side, (ids, mask, inputs) in batches.items():
            try:
                positions, deltas = engine.get_rope_index(ids, mask, **engine.rope_index_kwargs(inputs))
                four = engine.compute_position_ids(ids, mask, inputs)
            except MmropeError as exc:
                self.fail(hook, "get_rope_index computes its own examples", f"{type(exc).__name__}: {exc}")
                return
            rows = engine.binding.kernel.rope_rows if engine.binding.kernel is not None else 3
            if positions.shape != (rows, *ids.shape) or deltas.shape != (ids.shape[0], 1):
                self.fail(hook, "get_rope_index returns (3, B, L) (a kernel's rope_rows) and (B, 1)",
                          f"got {tuple(positions.shape)} and {tuple(deltas.shape)}")
                return
            text = torch.empty_like(ids)
            text_positions(mask.bool(), out=text)
            if not (torch.equal(four[:, 0], text.to(four.dtype))
                    and torch.equal(four[:, 1:], positions.transpose(0, 1).to(four.dtype))):
                self.fail(hook, rule, f"they differ on the batch padded on the {side}")
        ids, mask, inputs = batches["right"]
        positions, deltas = engine.get_rope_index(ids, mask, **engine.rope_index_kwargs(inputs))
        for index, output in enumerate(outputs):
            one = engine.batch([output])
            single, single_deltas = engine.get_rope_index(one[0], one[1], **engine.rope_index_kwargs(one[2]))
            if not (torch.equal(_valid(positions.transpose(0, 1), mask, index), _valid(single.transpose(0, 1), None, 0))
                    and torch.equal(deltas[index], single_deltas[0])):
                self.fail(hook, "get_rope_index of a batch equals that of each sample", f"sample {index} differs")

    def check_packing(self, engine: RopeEngine, outputs, multi_modal_inputs, alone) -> None:
        """The samples packed into one row back to back (``cu_seqlens``), and with a token outside
        every segment before each (``segment_ids``): each segment gets its sample's positions, in
        ``compute_position_ids`` and in ``get_rope_index`` (deltas per segment)."""
        self.ran("packed rows (cu_seqlens, segment_ids): each segment = its sample alone")
        self.ran("a kernel declaring samples_independent gives a sample its positions alone wherever it stands")
        if getattr(engine.binding.kernel, "samples_independent", None) is True and probe(engine) is False:
            self.fail("bind_rope_index", "a kernel declaring samples_independent keeps to it",
                      "a sample of its example cases gets other positions twice in a batch, after another sample or "
                      "padded on the left than alone; declare samples_independent = None (shown by mmrope) or False")
        if not engine.samples_independent:  # refused as a whole, by name
            try:
                engine.compute_position_ids(outputs[0]["input_ids"], None, None,
                                            cu_seqlens=torch.tensor([0, outputs[0]["input_ids"].shape[-1]]))
            except PackingUnsupportedError:
                return
            self.fail("bind_rope_index", "packed samples compute", "a kernel whose samples depend on one another "
                                                                   "placed a packed row")
            return
        rows = [output["input_ids"][0][_mask_of(output)] for output in outputs]
        lengths = [row.numel() for row in rows]
        cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
        gap = rows[0][:1]  # any token: tokens outside segments are not read
        with_gaps = torch.cat([piece for row in rows for piece in (gap, row)]).unsqueeze(0)
        segment_ids = torch.cat([piece for k, length in enumerate(lengths, start=1)
                                 for piece in (torch.zeros(1, dtype=torch.long), torch.full((length,), k))]).unsqueeze(0)
        starts = cu_seqlens[:-1].tolist()
        layouts = (
            ("cu_seqlens", torch.cat(rows).unsqueeze(0), {"cu_seqlens": cu_seqlens}, starts),
            ("segment_ids", with_gaps, {"segment_ids": segment_ids}, [start + k for k, start in enumerate(starts, 1)]),
        )
        single_rope = []
        if engine.rope_kind == "mrope":
            for output in outputs:
                one = engine.batch([output])
                single_rope.append(engine.get_rope_index(one[0], one[1], **engine.rope_index_kwargs(one[2])))
        for style, ids, packing, firsts in layouts:
            try:
                packed = engine.compute_position_ids(ids, None, multi_modal_inputs, **packing)  # type: ignore[arg-type]
                rope = (engine.get_rope_index(ids, **packing, **engine.rope_index_kwargs(multi_modal_inputs))
                        if engine.rope_kind == "mrope" else None)
            except MmropeError as exc:
                self.fail("bind_rope_index", "packed samples compute", f"{style}: {type(exc).__name__}: {exc}")
                continue
            for index, (single, start) in enumerate(zip(alone, firsts)):
                segment = packed[0][..., start : start + lengths[index]]
                if not torch.equal(segment, _valid(single, None, 0)):
                    self.fail("bind_rope_index", "a packed segment equals its sample alone",
                              f"{style}: segment {index} differs")
                if rope is None:
                    continue
                positions, deltas = single_rope[index]
                if not (torch.equal(rope[0][:, 0, start : start + lengths[index]], positions[:, 0])
                        and torch.equal(rope[1][index], deltas[0])):
                    self.fail("bind_rope_index", "get_rope_index of a packed segment equals its sample alone",
                              f"{style}: segment {index} differs")


def _mask_of(output: Mapping[str, Any]) -> torch.Tensor:
    mask = output.get("attention_mask")
    return torch.ones_like(output["input_ids"][0], dtype=torch.bool) if mask is None else mask[0].bool()


def _valid(positions: torch.Tensor, mask: torch.Tensor | None, row: int) -> torch.Tensor:
    """The positions of sample ``row``'s valid tokens, with the axes first."""
    sample = positions[row]
    if mask is None:
        return sample
    return sample[..., mask[row].bool()]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


