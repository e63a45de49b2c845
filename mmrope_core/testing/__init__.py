"""Testing tools for plugin authors: a conformance suite and pytest fixtures.

    from mmrope_core.testing import assert_conforms

    def test_my_plugin_conforms():
        assert_conforms("my_vl")          # the plugin's own example cases
"""

from .conformance import Violation, assert_conforms, check_plugin

__all__ = ["Violation", "assert_conforms", "check_plugin"]
