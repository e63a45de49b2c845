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
    assert ("nonconforming", "bind_rope_index", "a kernel declaring samples_independent keeps to it") in broken
    for rule in ("a packed segment equals its sample alone", "get_rope_index of a packed segment equals its sample alone"):
        packing = [v.detail for v in violations if v.rule == rule]
        assert {detail.split(":")[0] for detail in packing} == {"cu_seqlens", "segment_ids"}
    message = str(next(v for v in violations if v.rule == "does not change its inputs"))
    assert message.startswith("plugin nonconforming: get_rope_index_kwargs broke rule 'does not change its inputs' on Nonconforming")


def test_each_rule_is_caught_when_broken(make_manager):
    import re
    from pathlib import Path

    import mmrope_core.testing.conformance as conformance

    source = Path(conformance.__file__).read_text()
    rules = set(re.findall(r'self\.fail\([^,]+, "([^"]+)"', source)) | {"position_ids equal the text row over rope_index's positions"}
    broken = set()
    for name in ("nonconforming", "unruly"):
        broken |= {v.rule for v in check_plugin(name, manager=make_manager(MMROPE_LOAD_PLUGINS=name))}
    not_shown_here = {
        # the engine refuses these results itself (PluginContractError), before the suite compares them
        "output shape", "get_rope_index returns (3, B, L) (a kernel's rope_rows) and (B, 1)",
        "int64 positions unless the kernel declares another dtype",
        # a plugin breaking one of these ends its check there (not shown by these two plugins)
        "returns a list of ExampleCase", "example processors build offline", "an engine builds for its own processor",
        "claims its own processors", "returns a RopeBinding or None", "hooks do not raise on valid input",
        "computes positions for its own examples", "get_rope_index computes its own examples",
        "declared varlen keys collate", "packed samples compute",
    }
    assert not_shown_here <= rules
    assert rules - not_shown_here <= broken, sorted(rules - not_shown_here - broken)


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


def test_a_kernel_wrong_only_in_its_packed_rope_index_is_caught(make_manager):
    """The four rows of packed rows are right, the three rows of get_rope_index 1000 too high."""
    import mmrope_test_toy as toy

    from mmrope_core import ExampleCase, RopeBinding, hookimpl

    class OffByAThousand(toy.DirectKernel):
        def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **inputs):
            positions, deltas = super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens, **inputs)
            return (positions + 1000 if cu_seqlens is not None else positions), deltas

    class Plugin:
        @hookimpl
        def bind_rope_index(self, processor):
            if isinstance(processor, toy.ToyProcessor):
                return RopeBinding("mrope", OffByAThousand(places_packed_rows=True))
            return None

        @hookimpl
        def example_cases(self):
            return [ExampleCase("Off", build=lambda: (toy.ToyProcessor(), None),
                                samples=lambda processor, rng: [{"text": ["a b"]}, {"text": ["c d e f"]}])]

    manager = make_manager(MMROPE_LOAD_PLUGINS="")
    with manager.registered(Plugin(), "off"):
        violations = check_plugin("off", manager=manager)
    assert {v.rule for v in violations} == {"get_rope_index of a packed segment equals its sample alone"}
