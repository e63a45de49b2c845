"""The ``mmrope`` command, run as users run it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import DISTS


def mmrope(*args, **env):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DISTS), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run([sys.executable, "-m", "mmrope_core.cli", *args], capture_output=True, text=True, env=environment)


def test_help_works_even_with_broken_plugins_installed():
    result = mmrope("--help", MMROPE_STRICT_PLUGINS="1")
    assert result.returncode == 0
    assert "plugins" in result.stdout and "demo" in result.stdout


def test_plugins_json_lists_every_state():
    result = mmrope("plugins", "--json", MMROPE_DISABLE_PLUGINS="blocked")
    assert result.returncode == 0, result.stderr
    plugins = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert plugins["toy"]["status"] == "active" and plugins["toy"]["distribution"] == "mmrope-test-plugins"
    assert plugins["blocked"]["status"] == "disabled"
    assert plugins["broken_import"]["status"] == "failed"
    assert "ModuleNotFoundError" in plugins["broken_import"]["reason"]
    assert "broken_import" in result.stderr  # the warning names it


def test_plugins_table_shows_status_and_hooks():
    result = mmrope("plugins", MMROPE_LOAD_PLUGINS="toy,broken_import")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS", "PROCESSORS"]
    toy = next(line for line in lines if line.startswith("toy "))
    assert "active" in toy and "bind_rope_index" in toy and "ToyProcessor" in toy
    assert any(line.startswith("broken_import") and "failed: ModuleNotFoundError" in line for line in lines)


@pytest.mark.parametrize("strict", ["0", "1"])
def test_strict_mode_makes_plugins_fail_loudly(strict):
    result = mmrope("plugins", MMROPE_LOAD_PLUGINS="broken_import", MMROPE_STRICT_PLUGINS=strict)
    assert (result.returncode != 0) == (strict == "1")
    if strict == "1":
        assert "PluginLoadError" in result.stderr


def test_demo_shows_every_installed_family():
    environment = {**os.environ, "MMROPE_LOAD_PLUGINS": "qwen_vl,gemma4"}
    result = subprocess.run([sys.executable, "-m", "mmrope_core.cli", "demo"], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr
    for family in ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3.5", "GLM-4V", "Gemma4"):
        assert f"=== {family} " in result.stdout
    assert result.stdout.count("equal to the transformers reference: yes") == 5
    assert "6 of 6 families shown." in result.stdout


def test_demo_reports_a_broken_example_and_goes_on():
    result = mmrope("demo", MMROPE_LOAD_PLUGINS="toy,gemma4")
    assert result.returncode == 1
    assert "=== Toy " in result.stdout and "failed:" in result.stdout
    assert "1 of 2 families shown." in result.stdout
