"""``mmrope verify``: for one processor, how the fast kernel compares with the transformers
reference, and transformers' positions with the rollout engine's (the vLLM convention), on
generated samples."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .conventions import ALIASES
from .engine import RopeEngine
from .errors import MmropeError, UnknownConventionError
from .manager import PluginManager, get_plugin_manager
from .types import ExampleCase


@dataclasses.dataclass
class Report:
    """What ``mmrope verify`` found; :meth:`as_dict` is its JSON."""

    processor: str
    plugin: str | None
    implementation: str
    samples: int
    fast_equal: int = 0  # samples whose fast positions and deltas equal the reference's
    fast_differs: list[int] = dataclasses.field(default_factory=list)  # the first few that do not
    convention: str | None = None  # the vLLM convention compared, None where the family has none
    convention_note: str = ""
    differ: int = 0  # samples whose positions differ between the conventions
    tokens_shifted: int = 0  # tokens whose positions differ, over all samples
    largest_shift: float = 0  # the largest difference of one position, over all samples
    deltas_differ: int = 0

    @property
    def fast_agrees(self) -> bool:
        return self.fast_equal == self.samples

    def advice(self) -> list[str]:
        lines = []
        if not self.fast_agrees:
            lines.append("The fast kernel differs from the installed transformers' reference: please report it with "
                         "your transformers version, and train with implementation='reference' meanwhile.")
        if self.implementation == "mask":
            lines.append(f"Nothing to compare: {self.convention_note}.")
        elif self.convention is None:
            lines.append(f"No vLLM convention for this family ({self.convention_note}).")
        elif self.differ:
            lines.append(f"For RL with vLLM rollouts, build the trainer's engine with convention='vllm': it gives the "
                         f"positions {self.convention} sampled with, so the response keeps its rotary angles in training.")
        else:
            lines.append("transformers and vLLM give these samples the same positions: either convention trains on "
                         "the rollout's positions.")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fast_agrees": self.fast_agrees, "advice": self.advice()}

    def lines(self) -> list[str]:
        out = [f"{self.processor} (plugin {self.plugin}, {self.implementation}), {self.samples} generated samples",
               f"  fast = transformers reference: {self.fast_equal}/{self.samples}"
               + (f" (first differing: {self.fast_differs})" if self.fast_differs else "")]
        if self.convention is not None:
            out.append(f"  transformers vs {self.convention}: {self.differ}/{self.samples} samples differ, "
                       f"{self.tokens_shifted} tokens shifted, largest shift {_number(self.largest_shift)}, "
                       f"deltas differ in {self.deltas_differ}")
        out += [f"  {line}" for line in self.advice()]
        return out


def verify(processor: Any, config: Any, *, samples: int = 100, seed: int = 0,
           plugin_manager: PluginManager | None = None, batches: Callable[[Any, Any, Any], Mapping[str, Any]] | None = None,
           ) -> Report:
    """Compare, on ``samples`` generated single samples, the fast kernel with the reference and
    the transformers convention with the vLLM one. ``batches`` generates them (default: the
    generator of the installed plugin's example case for this processor class)."""
    plugins = plugin_manager or get_plugin_manager()
    fast = RopeEngine.from_processor(processor, config, plugin_manager=plugins)
    report = Report(type(processor).__name__, fast.plugin_name, fast.implementation, samples)
    if fast.rope_kind != "mrope":
        report.fast_equal = samples  # one implementation: the mask's positions
        report.convention_note = "1-D positions from the attention mask, the same in every convention"
        return report
    reference = RopeEngine.from_processor(processor, config, plugin_manager=plugins, implementation="reference")
    try:
        rollout: RopeEngine | None = RopeEngine.from_processor(processor, config, plugin_manager=plugins,
                                                               convention="vllm")
        report.convention = ALIASES["vllm"]
    except UnknownConventionError as exc:
        rollout, report.convention_note = None, str(exc)
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
        if rollout is not None:
            theirs, their_deltas = rollout.get_rope_index(ids, mask, **kwargs)
            shift = (theirs.double() - want[0].double()).abs().amax(0)
            if mask is not None:
                shift = shift[mask.bool()]
            report.differ += bool(shift.any())
            report.tokens_shifted += int((shift > 0).sum())
            report.largest_shift = max(report.largest_shift, float(shift.max()) if shift.numel() else 0.0)
            report.deltas_differ += not torch.equal(their_deltas.double(), want[1].double())
    return report


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
