"""Corrupt batches of every installed family, drawn by hypothesis and fed to the engines in a child
process (``mmrope_core.testing.fuzz``): nothing crashes, stalls, allocates beyond its rows, changes
its inputs or differs from the reference; everything else is a typed input error."""

import pytest

from mmrope_core.testing.fuzz import fuzz_plugin

# corrupt batches per plugin: a few minutes in all on two cores
EXAMPLES = {"qwen_vl": 1200, "qwen3_omni": 800, "gemma4": 200, "transformers": 600}


@pytest.mark.parametrize("plugin", sorted(EXAMPLES))
def test_no_corrupt_batch_crashes_stalls_or_is_silently_wrong(plugin):
    findings = fuzz_plugin(plugin, seed=20261202, examples=EXAMPLES[plugin], chooser="hypothesis")
    assert findings == [], "\n".join(map(str, findings))


@pytest.mark.parametrize("flaw, rule", [
    ("crash", "no input ends the process"),
    ("untyped", "bad input raises a typed input error"),
    ("mutates", "inputs are not changed"),
    ("wrong", "results are the reference's"),
    ("slow", "a case costs what its rows cost"),
    ("greedy", "a case costs what its rows cost"),
])
def test_the_fuzzer_finds_each_kind_of_flaw(test_dists, monkeypatch, flaw, rule):
    monkeypatch.setenv("MMROPE_TEST_FLAW", flaw)
    findings = fuzz_plugin("fragile", seed=1, examples=12)
    assert rule in {finding.rule for finding in findings}, findings


def test_a_flawless_plugin_gives_no_finding(test_dists, monkeypatch):
    monkeypatch.delenv("MMROPE_TEST_FLAW", raising=False)
    assert fuzz_plugin("fragile", seed=1, examples=40) == []
