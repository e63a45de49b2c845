"""The Makefile's environments: CPU torch on any machine (the CPU wheel index where it answers,
else the plain pin), and a demo environment holding what the demo needs and nothing that shadows
a family's plugin."""

import functools
import http.server
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target, **variables):
    """The commands ``make`` would run to build ``target`` from nothing."""
    result = subprocess.run(["make", "-n", "-B", target, *(f"{name}={value}" for name, value in variables.items())],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.fixture
def cpu_index(tmp_path):
    """A wheel index on this machine that answers for torch."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<html></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("target", [".venv-demo/.installed", ".venv/.installed", ".venv-oldest/.installed",
                                    ".venv-trainers/.installed"])
def test_torch_comes_from_the_cpu_index_where_it_answers(target, cpu_index):
    commands = dry_run(target, TORCH_CPU_INDEX=cpu_index)
    torch = [line for line in commands if "grep '^torch=='" in line]
    assert len(torch) == 1 and f"--index-url {cpu_index}" in torch[0]
    # installed first, so that no requirement pulls another torch
    assert commands.index(torch[0]) < min(index for index, line in enumerate(commands) if " -r " in line)


def test_torch_is_the_plain_pin_where_the_cpu_index_does_not_answer():
    torch = [line for line in dry_run(".venv-demo/.installed", TORCH_CPU_INDEX="http://127.0.0.1:9")
             if "grep '^torch=='" in line]
    assert len(torch) == 1 and "--index-url" not in torch[0]


def test_the_demo_environment_holds_only_what_the_demo_imports():
    pinned = {re.split(r"[=<>]", line)[0] for line in (ROOT / "requirements" / "demo.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert pinned == {"torch", "transformers", "pluggy", "importlib-metadata", "numpy", "pillow", "tokenizers",
                      "setuptools"}
    installed = " ".join(dry_run(".venv-demo/.installed", TORCH_CPU_INDEX="http://127.0.0.1:9"))
    assert "mmrope_plugins/qwen_vl" in installed and "mmrope_plugins/transformers" in installed
    assert "third_party_plugin" not in installed  # its PaddleOCR-VL binding would shadow mmrope-transformers'


def test_this_environment_holds_the_releases_the_trl_install_command_pins():
    """The newest environment installs TRL by the command docs/trainers.md gives."""
    import importlib.metadata
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "trainers"))
    try:
        from install_commands import commands
    finally:
        sys.path.pop(0)
    pins = dict(word.split("==") for arguments in commands()["trl"] for word in arguments if "==" in word)
    assert set(pins) == {"trl", "transformers"}
    assert {package: importlib.metadata.version(package) for package in pins} == pins
