"""``mmrope`` command line: list plugins, check one, show positions for each installed family.

Nothing is imported from plugins until a subcommand needs them, so ``mmrope --help`` and
``mmrope --version`` work whatever state the plugins are in.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from . import __version__

# what the tiny offline processors of `demo` and `check` are built with, and where it comes from
_DEMO_MODULES = {"PIL": "Pillow", "tokenizers": "tokenizers"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmrope", description="Multimodal RoPE position ids from plugins.")
    parser.add_argument("--version", action="version", version=f"mmrope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    plugins = commands.add_parser("plugins", help="list installed plugins, their state and hooks")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    plugins.add_argument("--models", action="store_true",
                         help="build every plugin's example processors and list the model type each binds, by which "
                              "plugin and implementation")
    demo = commands.add_parser("demo", help="build tiny processors of every installed family and show their positions")
    demo.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and images")
    check = commands.add_parser("check", help="run the conformance checks on an installed plugin, then fuzz it")
    check.add_argument("name", help="the plugin's entry-point name or its distribution (see `mmrope plugins`)")
    check.add_argument("--seed", type=int, default=0, help="seed of the generated samples")
    check.add_argument("--quiet", "-q", action="store_true", help="print only the verdict line")
    verify = commands.add_parser(
        "verify", help="compare the fast kernel with the transformers reference, and transformers' positions with "
                       "the rollout engines' (the vLLM and SGLang conventions), on generated samples")
    where = verify.add_mutually_exclusive_group(required=True)
    where.add_argument("path", nargs="?", help="a model directory or hub id (its processor and config, no weights)")
    where.add_argument("--family", help="an installed family's example processor, by name (e.g. Qwen2.5-VL, see "
                                        "`mmrope demo`) or model type (e.g. qwen2_5_vl)")
    verify.add_argument("--samples", type=_positive, default=100, help="generated samples (default 100)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the generated samples")
    verify.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if args.command == "plugins" and not args.models:
        return _plugins(args.json)
    missing = _missing_demo_modules()
    if missing:
        print(f"mmrope {args.command} builds tiny processors offline and needs {' and '.join(missing)}: "
              f"pip install 'mmrope-core[demo]'", file=sys.stderr)
        return 2
    _quiet_transformers()
    with warnings.catch_warnings():  # restores showwarning for a caller of main()
        warnings.showwarning = _one_line_warning
        if args.command == "plugins":
            return _models(args.json)
        if args.command == "check":
            return _check(args.name, args.seed, args.quiet)
        if args.command == "verify":
            return _verify(args)
        return _demo(args.seed)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of samples")
    return int(text)


def _one_line_warning(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    # a command's user wants the warning, not the library line that raised it
    print(f"note: {message}", file=sys.stderr)


def _verify(args: argparse.Namespace) -> int:
    from .errors import MmropeError
    from .manager import get_plugin_manager
    from .verify import example_cases, find_case, verify

    if args.path is not None:
        from .pretrained import load_pretrained
        from .tiny import processors_without_torchvision

        try:
            with processors_without_torchvision():  # the processor's videos are not processed here
                processor, config = load_pretrained(args.path)
        except MmropeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        batches = None
    else:
        case = find_case(args.family, get_plugin_manager())
        if case is None:
            names = [case.name for case in example_cases(get_plugin_manager())]
            print(f"no installed family is named {args.family!r} (nor has that model type); installed: "
                  f"{', '.join(names) or 'none'}", file=sys.stderr)
            return 2
        processor, config = case.build()
        batches = case.batches
    try:
        report = verify(processor, config, samples=args.samples, seed=args.seed, batches=batches)
    except MmropeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else "\n".join(report.lines()))
    return 0 if report.fast_agrees else 1


def _check(name: str, seed: int, quiet: bool) -> int:
    from .errors import counted
    from .manager import get_plugin_manager
    from .testing import run_checks

    infos = get_plugin_manager().plugins()
    by_distribution = {info.distribution: info.name for info in infos if info.distribution}
    name = by_distribution.get(name, by_distribution.get(name.replace("_", "-"), name))
    if name not in {info.name for info in infos}:
        installed = ", ".join(f"{info.name} ({info.distribution})" if info.distribution else info.name
                              for info in infos) or "none"
        print(f"no installed mmrope plugin is named {name!r}. Installed: {installed}", file=sys.stderr)
        return 2
    label = next(info.label for info in infos if info.name == name)
    if not quiet:
        print(f"Checking plugin {label}: the conformance rules on its example processors, then fuzzing in a child "
              f"process (corrupt batches and valid ones, each result against the reference).", flush=True)
    report = run_checks(name, seed=seed)
    examples = [case for case in report.cases if case.kind != "-" or case.samples]
    checks = sum(len(case.checks) for case in report.cases)
    fuzzed = sum(report.fuzzed.values())
    if not quiet:
        _print_report(report)
    for violation in report.violations:
        print(violation)
    counts = (f"{counted(len(examples), 'example processor')}, {counted(checks, 'conformance check')}, "
              f"{counted(fuzzed, 'fuzz case')}, {report.seconds:.1f} s")
    verdict = "conforms" if not report.violations else f"{len(report.violations)} violation(s)"
    print(f"{name}: {verdict} ({counts})")
    return 1 if report.violations else 0


def _print_report(report: Any) -> None:
    """What ``mmrope check`` checked, case by case."""
    checks = list(dict.fromkeys(check for case in report.cases for check in case.checks))
    print("\nConformance checks (each example processor, right and left padded, each sample alone, packed):")
    for check in checks:
        print(f"  - {check}")
    table = [("EXAMPLE", "PROCESSOR", "KIND", "SAMPLES", "CHECKS", "TIME")]
    table += [(case.case, case.processor, case.kind, str(case.samples), str(len(case.checks)), f"{case.seconds:.2f} s")
              for case in report.cases]
    _print_table(table)
    if report.fuzzed:
        print(f"\nFuzz cases ({sum(report.fuzzed.values())}; each result and error compared with the reference's):")
        _print_table([("EXAMPLE", "CASES"), *((case, str(count)) for case, count in report.fuzzed.items())])
    if report.unjudged:
        print(f"\nFuzz cases left unchecked ({sum(report.unjudged.values())}; the model's own code failed on them, so "
              f"there was no result to compare with):")
        _print_table([("EXAMPLE: WHAT (ERROR)", "CASES"), *((key, str(count)) for key, count in report.unjudged.items())])
    print()


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def _plugins(as_json: bool) -> int:
    from .manager import get_plugin_manager, strict_plugins

    infos = get_plugin_manager().plugins()
    failed = any(info.status == "failed" for info in infos)
    if as_json:
        print(json.dumps([info.as_dict() for info in infos], indent=2))
    elif not infos:
        print("No mmrope plugins installed (entry-point group 'mmrope').")
    else:
        rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS", "PROCESSORS")]
        for info in infos:
            status = info.status if info.status == "active" else f"{info.status}: {info.reason}"
            rows.append((info.name, info.distribution or "-", info.version or "-", status,
                         ", ".join(info.hooks) or "-", ", ".join(info.processors) or "-"))
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
        for processor, claiming in get_plugin_manager().conflicts().items():
            print(f"conflict: {processor} is claimed by {', '.join(info.label for info in claiming)}; the first "
                  f"that binds it wins. Disable the others with MMROPE_DISABLE_PLUGINS")
    if failed and strict_plugins():
        print("error: a plugin failed to load and MMROPE_STRICT_PLUGINS is set", file=sys.stderr)
        return 1
    return 0


def _models(as_json: bool) -> int:
    from .demo import bound_models

    rows = bound_models()
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0 if all(row["kind"] != "failed" for row in rows) else 1
    table = [("MODEL TYPE", "PROCESSOR", "EXAMPLE OF", "BOUND BY", "KIND", "IMPLEMENTATION", "DESCRIPTION")]
    table += [(row["model_type"], row["processor"], row["example_of"], row["plugin"], row["kind"], row["implementation"],
               row["description"]) for row in rows]
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]) - 1)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0 if all(row["kind"] != "failed" for row in rows) else 1


def _demo(seed: int) -> int:
    from .demo import run

    return run(seed, out=sys.stdout)


def _missing_demo_modules() -> list[str]:
    missing = []
    for module, distribution in _DEMO_MODULES.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(distribution)
    return missing


def _quiet_transformers() -> None:
    # the tiny vocabularies trip transformers' range checks of unrelated token ids in default configs
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()


if __name__ == "__main__":
    sys.exit(main())
