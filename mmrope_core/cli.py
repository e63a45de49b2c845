"""``mmrope`` command line: list plugins, show positions for each installed family.

Nothing is imported from plugins until a subcommand needs them, so ``mmrope --help`` works
whatever state the plugins are in.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmrope", description="Multimodal RoPE position ids from plugins.")
    commands = parser.add_subparsers(dest="command", required=True)
    plugins = commands.add_parser("plugins", help="list installed plugins, their state and hooks")
    plugins.add_argument("--json", action="store_true", help="print JSON instead of a table")
    demo = commands.add_parser("demo", help="build tiny processors of every installed family and show their positions")
    demo.add_argument("--seed", type=int, default=0, help="seed of the generated prompts and images")
    check = commands.add_parser("check", help="run the conformance checks on an installed plugin")
    check.add_argument("name", help="the plugin's entry-point name (see `mmrope plugins`)")
    check.add_argument("--seed", type=int, default=0, help="seed of the generated samples")
    args = parser.parse_args(argv)
    if args.command == "plugins":
        return _plugins(args.json)
    if args.command == "check":
        return _check(args.name, args.seed)
    return _demo(args.seed)


def _check(name: str, seed: int) -> int:
    from .testing import check_plugin

    violations = check_plugin(name, seed=seed)
    for violation in violations:
        print(violation)
    print(f"{name}: {'conforms' if not violations else f'{len(violations)} violation(s)'}")
    return 1 if violations else 0


def _plugins(as_json: bool) -> int:
    from .manager import get_plugin_manager

    infos = get_plugin_manager().plugins()
    if as_json:
        print(json.dumps([info.as_dict() for info in infos], indent=2))
        return 0
    if not infos:
        print("No mmrope plugins installed (entry-point group 'mmrope').")
        return 0
    rows = [("NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS", "PROCESSORS")]
    for info in infos:
        status = info.status if info.status == "active" else f"{info.status}: {info.reason}"
        rows.append((info.name, info.distribution or "-", info.version or "-", status,
                     ", ".join(info.hooks) or "-", ", ".join(info.processors) or "-"))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    return 0


def _demo(seed: int) -> int:
    from .demo import run

    return run(seed, out=sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
