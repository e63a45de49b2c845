"""mmrope-gemma4 with a real Gemma4Processor built offline."""

import functools
import random

import numpy as np
import pytest
import torch

from mmrope_core import PluginManager, RopeEngine, RopeIndexUnavailableError
from mmrope_core.tiny import processors_without_torchvision, random_image
from mmrope_gemma4.examples import builds_offline

pytestmark = pytest.mark.mmrope_applies(builds_offline(), "a Gemma4Processor that builds without torchvision")


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "gemma4"})


@functools.cache
def built(with_audio_tokens=True):
    from mmrope_gemma4.examples import build

    return build(with_audio_tokens=with_audio_tokens)


@pytest.fixture
def engine(manager):
    processor, config = built()
    return RopeEngine.from_processor(processor, config, plugin_manager=manager)


def one_d(mask):
    return (mask.long().cumsum(1) - 1).clamp(min=0)


@pytest.mark.parametrize("counts", [(1,), (2,), (0,), (2, 1, 0), (0, 3)])
@pytest.mark.parametrize("side", ["left", "right"])
def test_positions_are_1d_over_valid_tokens(engine, counts, side):
    processor = engine.processor
    processor.tokenizer.padding_side = side
    rng = random.Random(str(counts))
    texts = [" ".join(["the cat"] + [processor.image_token] * n + ["sat"] * (i + 1)) for i, n in enumerate(counts)]
    images = [[random_image(rng, 48, 64) for _ in range(n)] for n in counts]
    batch = processor(text=texts, images=images if any(counts) else None, padding=True, return_tensors="pt")
    positions = engine.compute_position_ids(batch["input_ids"], batch["attention_mask"], dict(batch))
    assert engine.rope_kind == "1d" and engine.plugin_name == "gemma4"
    assert positions.shape == batch["input_ids"].shape and positions.dtype == torch.int64
    assert torch.equal(positions, one_d(batch["attention_mask"]))
    image_tokens = (batch["input_ids"] == processor.image_token_id).sum(1)
    assert image_tokens.gt(0).tolist() == [n > 0 for n in counts]  # real expanded placeholders


def test_get_rope_index_is_not_offered(engine):
    with pytest.raises(RopeIndexUnavailableError, match=r"Gemma4Processor uses 1-D RoPE .*compute_position_ids"):
        engine.get_rope_index(torch.tensor([[1, 2, 3]]))


def test_collapsed_placeholders_pass_the_engines_processor_call(engine):
    processor = engine.processor
    image = random_image(random.Random(0), 64, 48)
    text = ["the cat sat on a mat"]  # the trainer collapsed the image placeholder away
    with pytest.raises(ValueError, match="number of"):
        processor(text=text, images=[[image]], return_tensors="pt")
    batch = engine.process(text=text, images=[[image]], return_tensors="pt")
    assert batch["pixel_values"].shape[0] == 1
    assert "validate_inputs" not in vars(processor)  # the user's processor is untouched
    with pytest.raises(ValueError, match="number of"):
        processor(text=text, images=[[image]], return_tensors="pt")


def test_placeholders_spread_differently_over_samples_pass(engine):
    processor = engine.processor
    rng = random.Random(1)
    images = [[random_image(rng, 48, 48)], [random_image(rng, 48, 48)]]
    text = [f"a {processor.image_token} {processor.image_token} cat", "the mat"]
    with pytest.raises(ValueError):
        processor(text=text, images=images, padding=True, return_tensors="pt")
    batch = engine.process(text=text, images=images, padding=True, return_tensors="pt")
    assert int((batch["input_ids"][0] == processor.image_token_id).sum()) > 0


@pytest.mark.parametrize(
    "call, message",
    [
        ({"text": ["<|image|> <|image|> cat"], "images": [[np.zeros((32, 32, 3), dtype=np.uint8)]]},
         "2 <\\|image\\|> placeholders but only 1 image was given"),
        ({}, "at least one of text, images"),
        ({"text": [1, 2]}, "string or a list of strings"),
    ],
)
def test_what_is_still_checked(engine, call, message):
    with pytest.raises(ValueError, match=message):
        engine.process(**call)


def test_image_only_tokenizers_work_through_the_engine(manager):
    processor, config = built(with_audio_tokens=False)
    engine = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    image = random_image(random.Random(2), 48, 48)
    with pytest.raises(ValueError, match="Audio inputs were provided"):  # transformers' own check
        processor(text=[f"a {processor.image_token} cat"], images=[[image]], return_tensors="pt")
    batch = engine.process(text=[f"a {processor.image_token} cat"], images=[[image]], return_tensors="pt")
    assert int((batch["input_ids"] == processor.image_token_id).sum()) > 0
    with pytest.raises(ValueError, match="audio was given but the tokenizer lacks"):
        engine.process(text=["a cat"], audio=[np.zeros(1600, dtype=np.float32)])


def test_collate_pads_token_types_and_audio_of_samples_of_different_lengths(engine):
    processor = engine.processor
    rng = random.Random(3)
    samples = [
        processor(text=[f"the {processor.image_token} cat"], images=[[random_image(rng, 48, 48)]], return_tensors="pt"),
        processor(text=[f"a {processor.audio_token} long sentence about the cat and the mat"],
                  audio=[np.sin(np.arange(16000 * 2) / 30).astype(np.float32)], return_tensors="pt"),
    ]
    inputs = [{k: v for k, v in sample.items() if k not in ("input_ids", "attention_mask")} for sample in samples]
    batch = engine.collate(inputs)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    assert lengths[0] != lengths[1]
    assert batch["mm_token_type_ids"].shape == (2, max(lengths))
    for row, sample in enumerate(samples):
        n = sample["input_ids"].shape[1]
        assert torch.equal(batch["mm_token_type_ids"][row, :n], sample["mm_token_type_ids"][0])
        assert batch["mm_token_type_ids"][row, n:].eq(0).all()
    assert torch.equal(batch["pixel_values"], samples[0]["pixel_values"])
    assert torch.equal(batch["input_features"], samples[1]["input_features"])


def test_from_pretrained_round_trip(manager, tmp_path):
    processor, config = built()
    processor.save_pretrained(tmp_path)
    config.save_pretrained(tmp_path)
    with processors_without_torchvision():
        engine = RopeEngine.from_pretrained(str(tmp_path), plugin_manager=manager)
    assert type(engine.processor).__name__ == "Gemma4Processor" and engine.rope_kind == "1d"
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])
    assert torch.equal(engine.compute_position_ids(torch.ones(2, 4, dtype=torch.long), mask), one_d(mask))


def test_the_plugin_conforms(mmrope_conformance):
    mmrope_conformance("gemma4")


def test_mmrope_check_command():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mmrope_core", "check", "gemma4"], capture_output=True, text=True)
    assert result.returncode == 0 and "gemma4: conforms" in result.stdout, result.stdout + result.stderr


def test_both_implementations_name_the_masks_positions(manager):
    from mmrope_core import InvalidInputError

    processor, config = built()
    for implementation in ("fast", "reference"):
        engine = RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation=implementation)
        mask = torch.tensor([[0, 1, 1, 1]])
        assert torch.equal(engine.compute_position_ids(torch.ones(1, 4, dtype=torch.long), mask, {}), one_d(mask))
    with pytest.raises(InvalidInputError, match="implementation='turbo' is not an implementation of Gemma4Processor"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, implementation="turbo")


def test_verify_has_nothing_to_compare_for_1d_positions():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mmrope_core", "verify", "--family", "gemma4", "--samples", "3"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Nothing to compare: 1-D positions from the attention mask" in result.stdout
