"""The conformance suite: every plugin shipped here passes it, and it catches broken plugins."""

import os
import subprocess
import sys

import pytest

from conftest import DISTS
from mmrope_core.testing import check_plugin

pytest_plugins = ["pytester"]


def test_the_test_toy_plugin_conforms(make_manager):
    assert check_plugin("toy", manager=make_manager(MMROPE_LOAD_PLUGINS="toy")) == []


def test_violations_name_the_plugin_the_hook_and_the_rule(make_manager):
    violations = check_plugin("nonconforming", manager=make_manager(MMROPE_LOAD_PLUGINS="nonconforming"))
    broken = {(v.plugin, v.hook, v.rule) for v in violations}
    assert ("nonconforming", "bind_rope_index", "returns None for processors it does not handle") in broken
    assert ("nonconforming", "get_rope_index_kwargs", "does not change its inputs") in broken
    assert ("nonconforming", "bind_rope_index", "left and right padding give the same valid positions") in broken
    assert ("nonconforming", "bind_rope_index", "position_ids equal the text row over rope_index's positions") in broken
    assert ("nonconforming", "bind_rope_index", "packed token types equal each sample's token types") in broken
    packing = [v.detail for v in violations if v.rule == "a packed segment equals its sample alone"]
    assert {detail.split(":")[0] for detail in packing} == {"cu_seqlens", "segment_ids"}
    message = str(next(v for v in violations if v.rule == "does not change its inputs"))
    assert message.startswith("plugin nonconforming: get_rope_index_kwargs broke rule 'does not change its inputs' on Nonconforming")


def test_a_plugin_that_does_not_load_is_reported(make_manager):
    with pytest.warns(Warning):
        violations = check_plugin("broken_import", manager=make_manager(MMROPE_LOAD_PLUGINS="broken_import"))
    assert [v.rule for v in violations] == ["the plugin loads"]
    assert "ModuleNotFoundError" in violations[0].detail


def test_mmrope_check_command():
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DISTS), os.environ.get("PYTHONPATH", "")])}
    good = subprocess.run([sys.executable, "-m", "mmrope_core.cli", "check", "toy"],
                          capture_output=True, text=True, env=environment)
    assert good.returncode == 0 and "toy: conforms" in good.stdout, good.stdout + good.stderr
    bad = subprocess.run([sys.executable, "-m", "mmrope_core.cli", "check", "nonconforming"],
                         capture_output=True, text=True, env=environment)
    assert bad.returncode == 1 and "plugin nonconforming: get_rope_index_kwargs broke rule" in bad.stdout


def test_the_pytest_fixtures_are_registered_and_always_unregister(pytester):
    pytester.makepyfile(
        """
        import pytest
        from mmrope_core import hookimpl

        class Extra:
            @hookimpl
            def varlen_keys(self, processor):
                return ["extra"]

        seen = []

        def test_register(mmrope_plugin_manager, mmrope_register):
            seen.append(mmrope_plugin_manager)
            mmrope_register(Extra(), "extra")
            assert "extra" in {p.name for p in mmrope_plugin_manager.plugins()}
            raise RuntimeError("fail inside the test")

        def test_unregistered_afterwards():
            assert "extra" not in {p.name for p in seen[0].plugins()}

        def test_conformance_fixture(mmrope_conformance):
            with pytest.raises(AssertionError, match="conformance violation"):
                mmrope_conformance("no_such_plugin")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1)
