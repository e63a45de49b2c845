"""``mmrope demo``: every installed family's example processors, their positions, and how the
fast implementation compares with the transformers reference."""

from __future__ import annotations

import random
import time
import warnings
from typing import Any, TextIO

import torch

from .engine import RopeEngine
from .errors import MmropeError, UnknownOptionError
from .manager import get_plugin_manager

_COLUMNS = 12


def run(seed: int, out: TextIO) -> int:
    manager = get_plugin_manager()
    cases = [(info, case) for info, result in manager.results("example_cases") for case in result]
    if not cases:
        print("No installed plugin offers example processors; `mmrope plugins` lists what is installed.", file=out)
        return 1
    failures = 0
    for info, case in cases:
        print(f"\n=== {case.name}  (plugin {info.label})", file=out)
        try:
            _show(case, info.name, random.Random(seed), out)
        except Exception as exc:  # one family's failure must not hide the others
            failures += 1
            print(f"  failed: {type(exc).__name__}: {exc}", file=out)
    print(f"\n{len(cases) - failures} of {len(cases)} families shown.", file=out)
    return 1 if failures else 0


def bound_models() -> list[dict[str, str]]:
    """For every installed plugin's example processor: its model type, the plugin that binds it
    (asked as trainers ask, every plugin installed) and what that plugin bound, for ``mmrope
    plugins --models``."""
    manager = get_plugin_manager()
    rows = []
    for info, result in manager.results("example_cases"):
        for case in result:
            row = {"model_type": "-", "processor": "-", "example_of": info.name, "plugin": "-", "kind": "failed",
                   "implementation": "-", "description": ""}
            try:
                processor, config = case.build()
                row["processor"] = type(processor).__name__
                row["model_type"] = str(getattr(config, "model_type", None) or "-")
                with warnings.catch_warnings():  # the description says why a reference was bound
                    warnings.simplefilter("ignore", RuntimeWarning)
                    engine = RopeEngine.from_processor(processor, config)
            except Exception as exc:  # one case's failure must not hide the others
                row["description"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            else:
                row.update(plugin=engine.plugin_name or "-", kind=engine.rope_kind,
                           implementation=engine.implementation, description=engine.binding.description)
            rows.append(row)
    return sorted(rows, key=lambda row: (row["model_type"], row["example_of"]))


def _show(case: Any, example_of: str, rng: random.Random, out: TextIO) -> None:
    processor, config = case.build()
    engine = RopeEngine.from_processor(processor, config)
    if engine.plugin_name != example_of:  # two plugins claim the processor: say which one computes
        print(f"  note: plugin {engine.plugin_name} binds {type(processor).__name__}, not {example_of} whose example "
              f"this is; MMROPE_DISABLE_PLUGINS={engine.plugin_name} leaves it to {example_of}", file=out)
    outputs = [engine.process(**sample) for sample in case.samples(processor, rng)]
    input_ids, attention_mask, multi_modal_inputs = engine.batch(outputs)
    started = time.perf_counter()
    positions = engine.compute_position_ids(input_ids, attention_mask, multi_modal_inputs)
    elapsed = time.perf_counter() - started
    print(f"  {engine!r}", file=out)
    print(f"  input_ids {tuple(input_ids.shape)} -> positions {tuple(positions.shape)} {positions.dtype} "
          f"in {elapsed * 1e3:.2f} ms", file=out)
    if engine.rope_kind == "mrope":
        try:
            reference = RopeEngine.from_processor(processor, config, implementation="reference")
        except UnknownOptionError:
            reference = None
            print("  no transformers reference to compare with: the plugin offers no implementation='reference'", file=out)
    if engine.rope_kind == "mrope" and reference is not None:
        expected = reference.compute_position_ids(input_ids, attention_mask, multi_modal_inputs)
        same = torch.equal(positions, expected)
        print(f"  equal to the transformers reference: {'yes' if same else 'NO'}", file=out)
        if not same:
            raise MmropeError(f"{case.name}: positions differ from the reference")
    tokens = processor.tokenizer.convert_ids_to_tokens(input_ids[0].tolist())
    rows = (["text", "t", "h", "w"] if positions.shape[1] == 4 else ["text", *(f"axis{i}" for i in range(1, positions.shape[1]))]
            ) if positions.dim() == 3 else ["pos"]
    sample = positions[0] if positions.dim() == 3 else positions[:1]
    columns = _shown_columns(tokens)
    print("  sample 0 (long placeholder runs shortened to '..'):", file=out)
    for begin in range(0, len(columns), _COLUMNS):
        chunk = columns[begin : begin + _COLUMNS]
        print("    token " + " ".join(_short(tokens[i]) if i >= 0 else f"{'..':>8}" for i in chunk), file=out)
        for name, row in zip(rows, sample.tolist()):
            print(f"    {name:>5} " + " ".join(f"{_number(row[i]):>8}" if i >= 0 else f"{'..':>8}" for i in chunk), file=out)


def _shown_columns(tokens: list[str], keep: int = 3) -> list[int]:
    """Column indices to print; -1 stands for the middle of a long run of one token."""
    columns: list[int] = []
    start = 0
    while start < len(tokens):
        end = start
        while end < len(tokens) and tokens[end] == tokens[start]:
            end += 1
        if end - start > 2 * keep + 1:
            columns += [*range(start, start + keep), -1, *range(end - keep, end)]
        else:
            columns += range(start, end)
        start = end
    return columns


def _short(token: str) -> str:
    token = token.replace("<|", "").replace("|>", "")
    return f"{token[:8]:>8}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"
