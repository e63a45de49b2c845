"""``mmrope verify``: for one processor, how the fast kernel compares with the transformers
reference, and transformers' positions with the rollout engines' (the vLLM and SGLang
conventions), on generated samples."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .conventions import rules
from .engine import RopeEngine
from .errors import InvalidInputError, MmropeError, UnknownConventionError
from .manager import PluginManager, get_plugin_manager
from .types import ExampleCase

#: The rollout engines' conventions compared with transformers', by the names users give them.
ROLLOUT_ENGINES = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclasses.dataclass
class Comparison:
    """How one rollout engine's convention places the samples, against transformers'."""

    convention: str  # the release compared, e.g. "vllm-0.34"
    rules: str  # the release whose rules it follows (itself, or an earlier one)
    differ: int = 0  # samples whose positions differ from transformers'
    tokens_shifted: int = 0  # tokens whose positions differ, over all samples
    largest_shift: float = 0  # the largest difference of one position, over all samples
    deltas_differ: int = 0
    refused: int = 0  # samples the rollout engine never computes (its convention refuses them)
    refused_note: str = ""
    reads_generated_mask: bool = False  # the engine decodes some generated tokens elsewhere than a prefill

    @property
    def engine(self) -> str:
        return ROLLOUT_ENGINES[self.convention.split("-")[0]]

    def line(self, samples: int) -> str:
        named = self.convention + (f" (the rules of {self.rules})" if self.rules != self.convention else "")
        refused = f"; {self.refused} refused ({self.refused_note})" if self.refused else ""
        return (f"transformers vs {named}: {self.differ}/{samples - self.refused} samples differ, {self.tokens_shifted} "
                f"tokens shifted, largest shift {_number(self.largest_shift)}, deltas differ in {self.deltas_differ}"
                f"{refused}")

    def advice(self) -> str:
        alias = next(alias for alias, engine in ROLLOUT_ENGINES.items() if engine == self.engine)
        # SGLang decodes each reply after a prefill of the turn's prompt: the response mask says which tokens
        mask = (" and pass each rollout's response mask as generated_mask (1 where the rollout engine generated the "
                "token)") if alias == "sglang" else ""
        decoded = (f" In this family {self.engine} decodes some replies elsewhere than a prefill of the whole "
                   f"sequence puts them, which only generated_mask tells.") if self.reads_generated_mask else ""
        if self.differ or self.reads_generated_mask:
            return (f"For RL with {self.engine} rollouts, build the trainer's engine with convention='{alias}'{mask}: it "
                    f"gives the positions {self.convention} sampled with, so the response keeps its rotary angles in "
                    f"training.{decoded}")
        return (f"transformers and {self.engine} give these samples the same positions: either convention trains on "
                f"{self.engine} rollouts' positions.")


@dataclasses.dataclass
class Report:
    """What ``mmrope verify`` found; :meth:`as_dict` is its JSON."""

    processor: str
    plugin: str | None
    implementation: str
    samples: int
    fast_equal: int = 0  # samples whose fast positions and deltas equal the reference's
    fast_differs: list[int] = dataclasses.field(default_factory=list)  # the first few that do not
    conventions: list[Comparison] = dataclasses.field(default_factory=list)  # the rollout conventions compared
    not_offered: dict[str, str] = dataclasses.field(default_factory=dict)  # rollout engine -> why the family has none
    note: str = ""

    @property
    def fast_agrees(self) -> bool:
        return self.fast_equal == self.samples

    @property
    def checked(self) -> list[str]:
        """The conventions compared: transformers' and the rollout engines' the family offers."""
        return ["transformers", *(comparison.convention for comparison in self.conventions)]

    def advice(self) -> list[str]:
        lines = []
        if not self.fast_agrees:
            lines.append("The fast kernel differs from the installed transformers' reference: please report it with "
                         "your transformers version, and train with implementation='reference' meanwhile.")
        if self.implementation == "mask":
            lines.append(f"Nothing to compare: {self.note}.")
        lines += [comparison.advice() for comparison in self.conventions]
        lines += [f"No {engine} convention for this family: {why}." for engine, why in self.not_offered.items()]
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "checked": self.checked, "fast_agrees": self.fast_agrees,
                "advice": self.advice()}

    def lines(self) -> list[str]:
        out = [f"{self.processor} (plugin {self.plugin}, {self.implementation}), {self.samples} generated samples",
               f"  fast = transformers reference: {self.fast_equal}/{self.samples}"
               + (f" (first differing: {self.fast_differs})" if self.fast_differs else ""),
               f"  conventions checked: {', '.join(self.checked)}"]
        out += [f"  {comparison.line(self.samples)}" for comparison in self.conventions]
        out += [f"  {line}" for line in self.advice()]
        return out


def verify(processor: Any, config: Any, *, samples: int = 100, seed: int = 0,
           plugin_manager: PluginManager | None = None, batches: Callable[[Any, Any, Any], Mapping[str, Any]] | None = None,
           ) -> Report:
    """Compare, on ``samples`` generated single samples, the fast kernel with the reference and
    the transformers convention with each rollout engine's (the newest vLLM and SGLang releases
    mmrope knows) that the family offers. ``batches`` generates them (default: the generator of
    the installed plugin's example case for this processor class)."""
    plugins = plugin_manager or get_plugin_manager()
    fast = RopeEngine.from_processor(processor, config, plugin_manager=plugins)
    report = Report(type(processor).__name__, fast.plugin_name, fast.implementation, samples)
    if fast.rope_kind != "mrope":
        report.fast_equal = samples  # one implementation: the mask's positions
        report.note = "1-D positions from the attention mask, the same in every convention"
        return report
    reference = RopeEngine.from_processor(processor, config, plugin_manager=plugins, implementation="reference")
    rollouts: list[tuple[Comparison, RopeEngine]] = []
    for alias, engine in ROLLOUT_ENGINES.items():
        try:
            rollout = fast.with_convention(alias)
        except UnknownConventionError as exc:
            report.not_offered[engine] = str(exc)
            continue
        reads_mask = bool(getattr(rollout.binding.kernel, "reads_generated_mask", False))
        rollouts.append((Comparison(rollout.convention, rules(rollout.convention), reads_generated_mask=reads_mask),
                         rollout))
    report.conventions = [comparison for comparison, _ in rollouts]
    generate = batches or generator_for(processor, config, plugins)
    rng = random.Random(seed)
    for index in range(samples):
        batch = dict(generate(processor, config, rng))
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask", None)
        kwargs = {key: value for key, value in batch.items() if value is not None}
        want = reference.get_rope_index(ids, mask, **kwargs)
        got = fast.get_rope_index(ids, mask, **kwargs)
        if all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)):
            report.fast_equal += 1
        elif len(report.fast_differs) < 5:
            report.fast_differs.append(index)
        for comparison, rollout in rollouts:
            _compare(comparison, rollout, ids, mask, kwargs, want)
    return report


def _compare(comparison: Comparison, rollout: RopeEngine, ids: Any, mask: Any, kwargs: dict[str, Any],
             want: tuple[torch.Tensor, torch.Tensor]) -> None:
    try:
        theirs, their_deltas = rollout.get_rope_index(ids, mask, **kwargs)
    except InvalidInputError as exc:  # a sample the rollout engine never computes
        comparison.refused += 1
        comparison.refused_note = comparison.refused_note or str(exc).split(":")[0]
        return
    shift = (theirs.double() - want[0].double()).abs().amax(0)
    if mask is not None:
        shift = shift[mask.bool()]
    comparison.differ += bool(shift.any())
    comparison.tokens_shifted += int((shift > 0).sum())
    comparison.largest_shift = max(comparison.largest_shift, float(shift.max()) if shift.numel() else 0.0)
    comparison.deltas_differ += not torch.equal(their_deltas.double(), want[1].double())


def generator_for(processor: Any, config: Any, plugins: PluginManager) -> Callable[[Any, Any, Any], Mapping[str, Any]]:
    """The sample generator of the installed example case whose processor is of this class: of
    the config's model type where one is (a processor class serves several model types)."""
    wanted = type(processor).__name__
    model_type = getattr(config, "model_type", None)
    found = [(built, case) for case in example_cases(plugins) if case.batches is not None
             for built in [case.build()] if type(built[0]).__name__ == wanted]
    same_type = [case for (_, case_config), case in found if getattr(case_config, "model_type", None) == model_type]
    if same_type or found:
        return (same_type or [case for _, case in found])[0].batches  # type: ignore[return-value]
    raise MmropeError(f"no installed plugin generates samples for {wanted}: no example case of this processor class "
                      f"gives batches; pass a generator as mmrope_core.verify.verify(..., batches=)")


def example_cases(plugins: PluginManager) -> list[ExampleCase]:
    return [case for _, cases in plugins.results("example_cases") for case in cases]


def find_case(name: str, plugins: PluginManager) -> ExampleCase | None:
    """The installed example case named ``name``, or else the one whose config has model type
    ``name``."""
    cases = example_cases(plugins)
    for case in cases:
        if case.name == name:
            return case
    for case in cases:
        if getattr(case.build()[1], "model_type", None) == name:
            return case
    return None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"
