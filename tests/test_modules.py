"""The shape of the code: small modules (Python under ~450 lines, C under ~900) and no import
cycle in any package, the core's, each plugin's and the examples'."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = {"mmrope_core": ROOT / "mmrope_core",
            **{path.name: path for path in sorted((ROOT / "mmrope_plugins").glob("*/mmrope_*")) if path.is_dir()}}
SOURCES = [path for root in (ROOT / "mmrope_core", ROOT / "mmrope_plugins", ROOT / "examples")
           for path in sorted(root.rglob("*")) if path.suffix in (".py", ".c", ".h") and "tests" not in path.parts]


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_modules_stay_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= (450 if path.suffix == ".py" else 900), f"{lines} lines: split it by what its parts do"


def runtime_imports(tree):
    """The import statements that run, not those under ``if TYPE_CHECKING:``."""
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for child in block.body for node in ast.walk(child)}
    return [node for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only]


def import_graph(name, path):
    """Each module of the package and the modules of the package it imports (deferred imports
    included; a module's own packages, which are initialised before it, left out)."""
    modules = {}
    for file in path.rglob("*.py"):
        parts = [name, *file.relative_to(path).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    graph = {}
    for module, file in modules.items():
        package = (module if file.name == "__init__.py" else module.rpartition(".")[0]).split(".")
        imported = set()
        for node in runtime_imports(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            imported.update(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                            for alias in node.names)
        graph[module] = {other for other in imported
                         if other in modules and other != module and not module.startswith(other + ".")}
    return graph


def cycle_in(graph):
    """One import cycle of ``graph`` as the modules along it, or None."""
    state, trail = {}, []

    def visit(module):
        state[module] = "open"
        trail.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == "open":
                return trail[trail.index(other):] + [other]
            found = None if other in state else visit(other)
            if found:
                return found
        state[module] = "done"
        trail.pop()
        return None

    return next((found for module in sorted(graph) if module not in state for found in [visit(module)] if found), None)


@pytest.mark.parametrize("name", PACKAGES)
def test_no_package_imports_itself_in_a_cycle(name):
    cycle = cycle_in(import_graph(name, PACKAGES[name]))
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None
