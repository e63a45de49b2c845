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
def test_strict_mode_lists_the_failure_and_fails(strict):
    result = mmrope("plugins", MMROPE_LOAD_PLUGINS="toy,broken_import", MMROPE_STRICT_PLUGINS=strict)
    assert (result.returncode != 0) == (strict == "1")
    assert "Traceback" not in result.stderr
    assert any(line.startswith("broken_import") and "failed: ModuleNotFoundError" in line
               for line in result.stdout.splitlines())
    assert ("MMROPE_STRICT_PLUGINS is set" in result.stderr) == (strict == "1")


def test_version_from_the_command_and_the_module():
    from mmrope_core import __version__

    for command in ([sys.executable, "-m", "mmrope_core", "--version"], [sys.executable, "-m", "mmrope_core.cli", "--version"]):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"mmrope {__version__}"


def test_python_dash_m_runs_the_command():
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DISTS), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "mmrope_core", "plugins", "--json"], capture_output=True, text=True,
                            env={**environment, "MMROPE_LOAD_PLUGINS": "toy"})
    assert result.returncode == 0, result.stderr
    assert "toy" in {entry["name"] for entry in json.loads(result.stdout)}


def test_check_of_an_unknown_name_lists_the_installed_plugins():
    result = mmrope("check", "tyo", MMROPE_DISABLE_PLUGINS="broken_import,blocked,unknown_hook")
    assert result.returncode == 2
    assert "no installed mmrope plugin is named 'tyo'" in result.stderr
    assert "toy (mmrope-test-plugins)" in result.stderr and "nonconforming (mmrope-test-plugins)" in result.stderr


@pytest.mark.parametrize("command", ["demo", "check"])
def test_demo_and_check_without_pillow_name_the_extra_to_install(command):
    code = ("import sys; sys.modules['PIL'] = None; from mmrope_core.cli import main; "
            f"sys.exit(main({[command] + (['qwen_vl'] if command == 'check' else [])!r}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    assert "needs Pillow" in result.stderr and "pip install 'mmrope-core[demo]'" in result.stderr


def test_check_says_what_it_checked_and_quiet_gives_the_verdict_alone():
    result = mmrope("check", "toy", MMROPE_DISABLE_PLUGINS="broken_import,blocked,unknown_hook")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("Checking plugin toy (mmrope-test-plugins 1.0): the conformance rules")
    assert "  - packed rows (cu_seqlens, segment_ids): each segment = its sample alone" in lines
    toy = next(line for line in lines if line.strip().startswith("Toy ") and "ToyProcessor" in line)
    assert toy.split()[1:5] == ["ToyProcessor", "mrope", "2", "7"]  # processor, kind, samples, checks
    fuzzed = next(line for line in lines if line.startswith("Fuzz cases ("))
    count = int(fuzzed.removeprefix("Fuzz cases (").split(";")[0])
    assert count >= 300  # the random examples, and the corrupt rows swept beside them
    table = lines[lines.index(fuzzed) + 2:]
    table = table[: table.index("")]
    assert all(line.split()[0] == "Toy" for line in table) and sum(int(line.split()[-1]) for line in table) == count
    assert lines[-1].startswith(f"toy: conforms (1 example processor, 8 conformance checks, {count} fuzz cases, ")
    quiet = mmrope("check", "toy", "--quiet", MMROPE_DISABLE_PLUGINS="broken_import,blocked,unknown_hook")
    assert quiet.returncode == 0 and len(quiet.stdout.splitlines()) == 1
    assert quiet.stdout.startswith(f"toy: conforms (1 example processor, 8 conformance checks, {count} fuzz cases, ")


def test_check_of_a_nonconforming_plugin_lists_each_violation_then_the_verdict():
    result = mmrope("check", "nonconforming", "--quiet", MMROPE_DISABLE_PLUGINS="broken_import,blocked,unknown_hook")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[-1].startswith("nonconforming: ") and " violation(s) (" in lines[-1]
    assert all(line.startswith("plugin nonconforming: ") for line in lines[:-1]) and len(lines) > 1
