"""Testing tools for plugin authors: a conformance suite and pytest fixtures.

    from mmrope_core.testing import assert_conforms

    def test_my_plugin_conforms():
        assert_conforms("my_vl")          # the plugin's own example cases

Importing this package imports nothing heavy; the suite loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["CheckReport", "Violation", "assert_conforms", "check_plugin", "run_checks"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'mmrope_core.testing' has no attribute {name!r}")
    from . import conformance

    return getattr(conformance, name)


if TYPE_CHECKING:
    from .conformance import CheckReport, Violation, assert_conforms, check_plugin, run_checks
