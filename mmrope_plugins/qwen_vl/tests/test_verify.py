"""``mmrope verify`` on the Qwen-VL families: fast against the reference, transformers against vLLM
and SGLang."""

import json
import subprocess
import sys

import torch

from mmrope_core import PluginManager, RopeBinding, hookimpl
from mmrope_core.kernel import RopeKernel
from mmrope_core.tiny import processors_without_torchvision
from mmrope_core.verify import verify
from mmrope_qwen_vl.examples import build, one_sample


def mmrope(*args):
    return subprocess.run([sys.executable, "-m", "mmrope_core", *args], capture_output=True, text=True)


def test_verify_a_family_reports_which_conventions_it_checked_and_where_they_differ():
    result = mmrope("verify", "--family", "Qwen2.5-VL", "--samples", "40", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fast_agrees"] and report["fast_equal"] == 40
    assert report["checked"] == ["transformers", "vllm-0.34", "sglang-0.5.23"] and report["not_offered"] == {}
    vllm, sglang = report["conventions"]
    assert vllm["convention"] == "vllm-0.34" and vllm["rules"] == "vllm-0.33" and sglang["rules"] == "sglang-0.5.23"
    for compared in (vllm, sglang):
        assert 0 < compared["differ"] < 40 and compared["tokens_shifted"] > 0 and compared["largest_shift"] > 0
        assert compared["deltas_differ"] == compared["differ"]  # a shift after a video moves the largest position
    assert "convention='vllm'" in report["advice"][0] and "generated_mask" not in report["advice"][0]
    # SGLang decodes each reply after a prefill of its turn: the advice names the mask that says which tokens
    assert "convention='sglang' and pass each rollout's response mask as generated_mask" in report["advice"][1]
    assert not sglang["reads_generated_mask"] and "only generated_mask tells" not in report["advice"][1]
    text = mmrope("verify", "--family", "Qwen2.5-VL", "--samples", "10").stdout
    assert "conventions checked: transformers, vllm-0.34, sglang-0.5.23" in text
    assert "transformers vs vllm-0.34 (the rules of vllm-0.33): " in text and "transformers vs sglang-0.5.23: " in text


def test_verify_a_model_directory_reads_what_the_family_shows(tmp_path):
    processor, config = build("Qwen2-VL")
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    from_path = mmrope("verify", str(tmp_path), "--samples", "30", "--json")
    from_family = mmrope("verify", "--family", "Qwen2-VL", "--samples", "30", "--json")
    assert from_path.returncode == 0, from_path.stderr
    path_report, family_report = json.loads(from_path.stdout), json.loads(from_family.stdout)
    assert path_report == family_report and path_report["conventions"][0]["differ"] > 0


def test_verify_says_the_same_positions_for_per_frame_families():
    result = mmrope("verify", "--family", "GLM-4V", "--samples", "20")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("0/20 samples differ") == 2 and result.stdout.count("either convention") == 2


class Shifted(RopeKernel):
    """Counts tokens from ``offset``: a stand-in for a fast kernel that drifted from its reference."""

    def __init__(self, offset):
        self.offset = offset

    def rope_index(self, input_ids, attention_mask=None, *, cu_seqlens=None, **ignored):
        positions = torch.arange(input_ids.shape[1]).expand(3, *input_ids.shape) + self.offset
        return positions, torch.full((input_ids.shape[0], 1), self.offset)


class Drifted:
    @hookimpl(tryfirst=True)
    def bind_rope_index(self, processor, options):
        if type(processor).__name__ != "Qwen2VLProcessor":
            return None
        offset = 1 if options.get("implementation", "fast") == "fast" else 0
        return RopeBinding("mrope", Shifted(offset), options.get("implementation", "fast"))


def test_a_fast_kernel_that_differs_from_its_reference_fails_the_verification(capsys):
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    processor, config = build("Qwen2-VL")
    with manager.registered(Drifted(), "drifted"):
        report = verify(processor, config, samples=5, plugin_manager=manager, batches=one_sample)
    assert report.fast_equal == 0 and report.fast_differs == [0, 1, 2, 3, 4] and not report.fast_agrees
    assert report.conventions == [] and report.checked == ["transformers"]
    assert set(report.not_offered) == {"vLLM", "SGLang"} and "offers 'transformers'" in report.not_offered["vLLM"]
    assert "please report it" in report.advice()[0] and report.advice()[-1].startswith("No SGLang convention")


def test_verify_names_what_is_installed_for_an_unknown_family():
    result = mmrope("verify", "--family", "Qwen9-VL")
    assert result.returncode == 2 and "no installed family is named 'Qwen9-VL'" in result.stderr
    assert "Qwen2-VL" in result.stderr.split("installed:")[1]


def test_a_processor_without_a_generator_is_named():
    import pytest

    from mmrope_core import MmropeError

    processor, config = build("Qwen2-VL")
    with processors_without_torchvision(), pytest.raises(MmropeError, match="generates samples for"):
        verify(type("OtherProcessor", (type(processor),), {})(processor.image_processor, processor.tokenizer,
                                                                video_processor=processor.video_processor), config,
               samples=1)


def test_verify_takes_a_model_type_and_refuses_what_it_cannot_load(tmp_path):
    by_type = mmrope("verify", "--family", "qwen2_5_vl", "--samples", "5", "--json")
    assert by_type.returncode == 0, by_type.stderr
    assert json.loads(by_type.stdout)["processor"] == "Qwen2_5_VLProcessor"
    (tmp_path / "config.json").write_text("{}")
    unloadable = mmrope("verify", str(tmp_path))
    assert unloadable.returncode == 2 and "cannot load a processor and a config from" in unloadable.stderr
    assert "Traceback" not in unloadable.stderr
    none = mmrope("verify", "--family", "Qwen2-VL", "--samples", "0")
    assert none.returncode == 2 and "is not a positive number of samples" in none.stderr


def test_a_model_directory_gets_the_generator_of_its_own_model_type():
    from mmrope_core.verify import generator_for

    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl,transformers"})
    for name in ("Qwen3-VL", "Qwen3.5-MoE", "GLM-4.6V"):
        processor, config = build(name)
        assert generator_for(processor, config, manager) is one_sample, name  # not another model type's
