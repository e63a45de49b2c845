"""The plugin as the ``mmrope`` command and the conformance suite see it."""

import subprocess
import sys


def test_the_plugin_conforms(mmrope_conformance):
    mmrope_conformance("qwen3_omni")


def test_check_takes_a_distribution_name_and_prints_no_transformers_warnings():
    result = subprocess.run([sys.executable, "-m", "mmrope_core", "check", "mmrope-qwen3-omni"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("qwen3_omni: conforms (2 example processors, ")
    assert "[transformers]" not in result.stdout + result.stderr


def test_verify_reports_where_vllm_places_omni_samples_otherwise():
    import json

    result = subprocess.run([sys.executable, "-m", "mmrope_core", "verify", "--family", "Qwen3-Omni", "--samples", "30",
                             "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fast_agrees"] and report["convention"] == "vllm-0.33" and 0 < report["differ"] <= 30
