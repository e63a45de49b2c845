"""``RopeEngine.from_pretrained`` with a hub id, as model cards show it, read from a local Hugging
Face cache laid out as huggingface_hub lays it out (nothing here reaches the hub); and every
failure a typed error naming the path or id and what to do."""

import fnmatch
import os
import subprocess
import sys

import pytest
import torch

from mmrope_core import PretrainedLoadError, RopeEngine
from mmrope_core.pretrained import HUB_FILES
from mmrope_core.tiny import processors_without_torchvision

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root, repo_id, family="Qwen2.5-VL"):
    """A cache holding ``repo_id``'s processor and config, as ``hf download`` leaves it."""
    from mmrope_qwen_vl.examples import build

    processor, config = build(family)
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    processor.save_pretrained(snapshot)
    config.save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def test_a_hub_id_is_read_from_the_cache_with_only_processor_and_config_files(tmp_path, monkeypatch):
    snapshot = hub_cache(tmp_path, "tiny-org/Qwen2.5-VL-tiny")
    # what the docs tell users to fetch is everything these were saved as: no weights among them
    assert all(any(fnmatch.fnmatch(name, pattern) for pattern in HUB_FILES) for name in os.listdir(snapshot))
    import transformers.utils.hub as transformers_hub

    asked = []
    download = transformers_hub.hf_hub_download

    def recording(repo_id, filename, *args, **kwargs):
        asked.append(filename)
        return download(repo_id, filename, *args, **kwargs)

    monkeypatch.setattr(transformers_hub, "hf_hub_download", recording)
    with processors_without_torchvision():
        engine = RopeEngine.from_pretrained("tiny-org/Qwen2.5-VL-tiny", cache_dir=tmp_path)
    assert type(engine.processor).__name__ == "Qwen2_5_VLProcessor" and engine.plugin_name == "qwen_vl"
    assert engine.config.model_type == "qwen2_5_vl"
    assert asked and not [name for name in asked if name.endswith((".safetensors", ".bin", ".pt", ".gguf"))]
    assert engine.compute_position_ids(torch.ones(1, 3, dtype=torch.long), None).shape == (1, 4, 3)


def test_hf_hub_offline_and_the_cache_of_the_environment_are_honoured(tmp_path):
    hub_cache(tmp_path, "tiny-org/Qwen2.5-VL-tiny")
    script = ("from mmrope_core import RopeEngine\n"
              "from mmrope_core.tiny import processors_without_torchvision\n"
              "with processors_without_torchvision():\n"
              "    print(RopeEngine.from_pretrained('tiny-org/Qwen2.5-VL-tiny').plugin_name)\n"
              "RopeEngine.from_pretrained('tiny-org/not-downloaded')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert result.stdout.strip() == "qwen_vl", result.stderr
    assert "PretrainedLoadError: the processor and config of the hub model 'tiny-org/not-downloaded' are not in " \
           f"the local Hugging Face cache ({tmp_path}) and the hub is switched off (HF_HUB_OFFLINE=1)" in result.stderr
    assert "hf download tiny-org/not-downloaded --include '*.json'" in result.stderr


@pytest.mark.parametrize("name, message", [
    ("/models/Qwen2.5-VL-7B-Instruct", r"there is no directory '/models/Qwen2.5-VL-7B-Instruct'\. Pass the directory "
                                       r"a checkpoint was saved to .*or a hub id such as"),
    ("checkpoints/run-1/step-100", r"there is no directory 'checkpoints/run-1/step-100'"),
    ("~/models/qwen", r"there is no directory '~/models/qwen'"),
    ("not a hub id", r"'not a hub id' is neither a directory nor a hub id"),
    ("tiny-org/not-downloaded", r"hub model 'tiny-org/not-downloaded' are not in the local Hugging Face cache .*"
                                r"`hf download tiny-org/not-downloaded --include '\*.json' '\*.jinja'"),
])
def test_what_cannot_be_loaded_is_named_with_what_to_do(name, message, tmp_path):
    with pytest.raises(PretrainedLoadError, match=message) as raised:
        RopeEngine.from_pretrained(name, cache_dir=tmp_path)
    assert isinstance(raised.value, OSError)  # what transformers raises for these: callers' handlers still apply
    if "not in the local Hugging Face cache" in str(raised.value):
        assert f"cache ({tmp_path})" in str(raised.value)  # the cache asked for, not the environment's


def test_a_directory_without_a_processor_says_what_it_needs(tmp_path):
    with pytest.raises(PretrainedLoadError, match=r"cannot load a processor and a config from the directory .* It "
                                                  r"needs the files save_pretrained writes"):
        RopeEngine.from_pretrained(tmp_path)


def test_a_directory_is_read_as_it_was_saved(tmp_path):
    snapshot = hub_cache(tmp_path, "tiny-org/Qwen2-VL-tiny", family="Qwen2-VL")
    with processors_without_torchvision():
        engine = RopeEngine.from_pretrained(snapshot)
    assert engine.config.model_type == "qwen2_vl"
