"""pytest fixtures for mmrope plugin authors; registered through the ``pytest11`` entry point
(or ``pytest -p mmrope_core.testing.pytest_plugin``).

Every pytest run of a machine with mmrope-core installed loads this module, so it imports only
pytest: mmrope, torch and the plugins load when a test asks for a fixture.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "differential: compares a fast implementation with the installed transformers reference "
        "(run on every supported transformers)",
    )
    config.addinivalue_line(
        "markers",
        "mmrope_applies(condition, reason): the test applies only where condition holds (a model "
        "type the installed transformers has); elsewhere it is deselected, not run",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a test of something this transformers lacks is not a test here: deselected, never skipped
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        marks = list(item.iter_markers("mmrope_applies"))
        if any(not mark.args for mark in marks):
            raise pytest.UsageError(f"{item.nodeid}: mmrope_applies needs a condition: mmrope_applies(condition, reason)")
        (kept if all(mark.args[0] for mark in marks) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture
def mmrope_plugin_manager() -> Any:
    """A fresh plugin manager over the installed entry points, independent of every other test."""
    from mmrope_core import PluginManager

    return PluginManager(env=dict(os.environ))


@pytest.fixture
def mmrope_register(mmrope_plugin_manager: Any) -> Iterator[Callable[[Any, str], None]]:
    """``register(plugin, name)`` on :func:`mmrope_plugin_manager`; unregistered after the test,
    whatever happens in it."""
    names: list[str] = []

    def register(plugin: Any, name: str) -> None:
        mmrope_plugin_manager.register(plugin, name)
        names.append(name)

    try:
        yield register
    finally:
        for name in reversed(names):
            mmrope_plugin_manager.unregister(name)


@pytest.fixture
def mmrope_conformance() -> Callable[..., None]:
    """``mmrope_conformance("my_vl")`` fails the test with every conformance violation listed."""
    from mmrope_core.testing import assert_conforms

    return assert_conforms
