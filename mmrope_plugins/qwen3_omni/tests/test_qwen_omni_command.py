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


def test_verify_reports_where_vllm_and_sglang_place_omni_samples_otherwise():
    import json

    def verify(name):
        result = subprocess.run([sys.executable, "-m", "mmrope_core", "verify", "--family", name, "--samples", "30",
                                 "--json"], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        return json.loads(result.stdout)

    report = verify("Qwen3-Omni")
    vllm, sglang = report["conventions"]
    assert report["fast_agrees"] and report["checked"] == ["transformers", "vllm-0.34", "sglang-0.5.23"]
    assert 0 < vllm["differ"] <= 30 and vllm["refused"] == 0
    # SGLang never places a video with its audio (about half the samples); it truncates the others' fractions
    assert 0 < sglang["refused"] < 30 and sglang["refused_note"].startswith("use_audio_in_video=True")
    assert sglang["differ"] > 0 and sglang["largest_shift"] < 1
    # its replies are decoded elsewhere than a prefill puts them: the advice names generated_mask and says why
    assert sglang["reads_generated_mask"] and not vllm["reads_generated_mask"]
    assert "convention='sglang' and pass each rollout's response mask as generated_mask" in report["advice"][1]
    assert "decodes some replies elsewhere than a prefill of the whole sequence puts them" in report["advice"][1]
    assert "generated_mask" not in report["advice"][0]
    older = verify("Qwen2.5-Omni")
    assert older["checked"] == ["transformers", "vllm-0.34"]
    assert "SGLang 0.5.23 has no Qwen2.5-Omni model" in older["not_offered"]["SGLang"]
