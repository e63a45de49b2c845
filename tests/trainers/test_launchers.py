"""LLaMA-Factory's and ms-swift's own training entry points, run as users run them, each in a
process of its own, on a tiny random Qwen2.5-VL checkpoint saved to disk, on CPU, with their
M-RoPE positions from mmrope: ``python examples/llamafactory_train.py examples/llamafactory_sft.yaml``
(LLaMA-Factory's ``run_exp``) and ``bash examples/swift_sft.sh`` (``swift sft`` with
``--external_plugins``). The checkpoint's special tokens have Qwen's ids, as both frameworks'
Qwen templates hard-code them. ``launch_shim/sitecustomize.py`` lets the frameworks import
without torchvision and torchaudio builds, which this machine's CPU torch lacks, and counts the
calls into mmrope's engine."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from PIL import Image

from mmrope_core.tiny import FILLER_WORDS, processors_without_torchvision

ROOT = Path(__file__).parents[2]
SHIM = Path(__file__).parent / "launch_shim"
#: Qwen's special tokens and their ids in every Qwen2-VL-family checkpoint
QWEN_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
            "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
VOCAB_SIZE = 151936


def tiny_checkpoint(directory: Path) -> Path:
    """A random two-layer Qwen2.5-VL (hidden size 16) with a word-level tokenizer whose special
    tokens have Qwen's ids, saved as a checkpoint: weights, config, processor."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    words = ["[UNK]", *dict.fromkeys((*FILLER_WORDS, "user", "assistant", "system"))]
    vocab = {token: index for index, token in enumerate(words)}
    vocab.update(QWEN_IDS)
    taken = set(vocab.values())
    vocab.update({f"<unused{index}>": index for index in range(max(taken) + 1) if index not in taken})  # no holes
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="[UNK]", pad_token="<|endoftext|>", eos_token="<|im_end|>",
        extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                              "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"})
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN_IDS)})
    with processors_without_torchvision() as video_processor:
        processor = transformers.Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tokenizer,
                                                     video_processor=video_processor)
    config = transformers.Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": VOCAB_SIZE, "max_position_embeddings": 1024,
                     "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2]}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 16,
                       "fullatt_block_indexes": [0]},
        image_token_id=QWEN_IDS["<|image_pad|>"], video_token_id=QWEN_IDS["<|video_pad|>"],
        vision_start_token_id=QWEN_IDS["<|vision_start|>"], tie_word_embeddings=True)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(config).save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def conversations(directory: Path, count: int = 8) -> list[dict]:
    """``count`` one-turn conversations about an image each (images of 56 x 56 pixels: 4 tokens)."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(count):
        image = directory / f"image{index}.png"
        Image.new("RGB", (56, 56), (37 * index % 256, 80, 160)).save(image)
        rows.append({"messages": [{"role": "user", "content": "<image> the cat sat on a mat"},
                                  {"role": "assistant", "content": "the cat looked at it"}],
                     "images": [str(image)]})
    return rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("qwen2_5_vl_tiny"))


def launch(command: list, tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, int]:
    """Run a launcher as a user's shell does (this environment's scripts on PATH, offline), with the
    shim; return its result and the calls into mmrope's engine, over every process it started."""
    calls = tmp_path / "engine_calls"
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])),
                   "HF_HUB_OFFLINE": "1", "MMROPE_ENGINE_CALLS": str(calls), **env}
    result = subprocess.run([str(part) for part in command], cwd=tmp_path, env=environment, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    counted = sum(int(line.split()[1]) for line in calls.read_text().splitlines()) if calls.exists() else 0
    return result, counted


def test_llamafactory_trains_with_its_own_launcher_and_the_example_config(checkpoint, tmp_path):
    data = tmp_path / "data"
    rows = conversations(data)
    (data / "tiny.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"tiny": {
        "file_name": "tiny.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    config = yaml.safe_load((ROOT / "examples" / "llamafactory_sft.yaml").read_text())
    del config["num_train_epochs"], config["save_steps"]
    config.update(model_name_or_path=str(checkpoint), dataset="tiny", dataset_dir=str(data),
                  output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                  gradient_accumulation_steps=1, preprocessing_num_workers=1, logging_steps=1, save_strategy="no",
                  bf16=False)  # (bf16 on a CPU is emulated and slow)
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump(config))
    _, calls = launch([sys.executable, ROOT / "examples" / "llamafactory_train.py", "sft.yaml"], tmp_path,
                      DISABLE_VERSION_CHECK="1")
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 2 and len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert calls >= 2  # every batch's positions came from mmrope's engine


@pytest.mark.skipif(shutil.which("bash") is None, reason="the example is a bash script")
def test_swift_sft_trains_with_the_plugin_flag(checkpoint, tmp_path):
    rows = conversations(tmp_path / "images")
    (tmp_path / "tiny.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    _, calls = launch(["bash", ROOT / "examples" / "swift_sft.sh", checkpoint, "tiny.jsonl", tmp_path / "out",
                       "--template", "qwen2_5_vl", "--tuner_type", "full", "--torch_dtype", "float32",
                       "--max_steps", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                       "--save_strategy", "no", "--logging_steps", "1", "--report_to", "none", "--dataset_num_proc", "1",
                       "--dataloader_num_workers", "0", "--use_hf", "true"], tmp_path)
    logged = [json.loads(line) for path in (tmp_path / "out").rglob("logging.jsonl")
              for line in path.read_text().splitlines()]
    losses = [float(entry["loss"]) for entry in logged if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert calls >= 2  # every batch's positions came from mmrope's engine
