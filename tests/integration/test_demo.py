"""``mmrope demo`` over the families installed here."""

import os
import subprocess
import sys

import pytest
from conftest import DISTS

from mmrope_gemma4.examples import builds_offline


def test_demo_shows_every_installed_family():
    environment = {**os.environ, "MMROPE_LOAD_PLUGINS": "qwen_vl,gemma4"}
    result = subprocess.run([sys.executable, "-m", "mmrope_core.cli", "demo"], capture_output=True, text=True, env=environment)
    assert result.returncode == (0 if builds_offline() else 1), result.stdout + result.stderr
    mrope = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3-VL-MoE", "Qwen3.5", "Qwen3.5-MoE", "GLM-4V",
             "GLM-4V-MoE", "GLM-4.6V")
    families = (*mrope, "Gemma4")
    for family in families:
        assert f"=== {family} " in result.stdout
    assert result.stdout.count("equal to the transformers reference: yes") == len(mrope)  # Gemma4 is 1-D
    shown = len(families) - (not builds_offline())  # Gemma4's failure to build is reported, not shown
    assert f"{shown} of {len(families)} families shown." in result.stdout
    assert "[transformers]" not in result.stdout + result.stderr


@pytest.mark.mmrope_applies(builds_offline(), "a Gemma4Processor that builds without torchvision")
def test_demo_reports_a_broken_example_and_goes_on():
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DISTS), os.environ.get("PYTHONPATH", "")]),
                   "MMROPE_LOAD_PLUGINS": "toy,gemma4"}
    result = subprocess.run([sys.executable, "-m", "mmrope_core", "demo"], capture_output=True, text=True, env=environment)
    assert result.returncode == 1
    assert "=== Toy " in result.stdout and "failed:" in result.stdout
    assert "1 of 2 families shown." in result.stdout


def test_demo_names_the_plugin_that_binds_another_plugins_example():
    # the third-party example and mmrope-transformers both claim PaddleOCRVLProcessor
    environment = {**os.environ, "MMROPE_LOAD_PLUGINS": "paddleocr_vl,transformers"}
    result = subprocess.run([sys.executable, "-m", "mmrope_core.cli", "demo"], capture_output=True, text=True,
                            env=environment)
    assert "note: plugin paddleocr_vl binds PaddleOCRVLProcessor, not transformers whose example this is; " \
           "MMROPE_DISABLE_PLUGINS=paddleocr_vl leaves it to transformers" in result.stdout
    assert result.stdout.count("note: plugin") == 1
