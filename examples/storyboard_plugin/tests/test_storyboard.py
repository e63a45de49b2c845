"""Storyboard against its model's own get_rope_index: generated samples of text and boards, batched
with padding on either side and packed, through the engine, on the compiled loops and in numpy,
and its reference implementation; its processor; packed rows at the tiny model; the conformance
suite and ``mmrope verify``."""

import random
import subprocess
import sys

import importlib_metadata
import numpy as np
import pytest
import torch

from mmrope_core import (
    InvalidInputError,
    PlaceholderMismatchError,
    PluginManager,
    RopeEngine,
    UnknownKeywordError,
    compiled,
)
from mmrope_core.collators import PackedCollator
from mmrope_core.testing import assert_conforms
from mmrope_core.tiny import padded_batch
from mmrope_core.verify import verify
from mmrope_storyboard import MEDIA_KEYS, TOKENS, board_batch, board_samples, build
from mmrope_storyboard.modeling import StoryboardModel


@pytest.fixture(scope="module")
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "storyboard"})


@pytest.fixture(scope="module")
def engine(manager):
    processor, config = build()
    return RopeEngine.from_processor(processor, config, plugin_manager=manager)


@pytest.fixture(scope="module")
def model(engine):
    torch.manual_seed(0)
    return StoryboardModel(engine.config).eval()


@pytest.fixture(scope="module")
def ids(engine):
    return engine.processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))


def test_it_is_an_installed_distribution_with_an_entry_point():
    entry_points = {ep.name: ep for ep in importlib_metadata.entry_points(group="mmrope")}
    assert entry_points["storyboard"].dist.metadata["Name"] == "mmrope-storyboard"


def test_discovering_it_imports_neither_torch_nor_transformers_and_modeling_registers_it():
    code = (
        "import sys, importlib_metadata; "
        "[entry] = [ep for ep in importlib_metadata.entry_points(group='mmrope') if ep.name == 'storyboard']; "
        "entry.load(); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules)); "
        "import mmrope_storyboard.modeling; from transformers import AutoConfig; "
        "print(type(AutoConfig.for_model('storyboard')).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["[]", "StoryboardConfig"]


def joined(samples):
    """The samples' rows, and their media in one batch, in order."""
    media = {key: torch.cat([sample[key] for sample in samples if key in sample]) for key in MEDIA_KEYS
             if any(key in sample for sample in samples)}
    return [sample["input_ids"][0].tolist() for sample in samples], media


@pytest.mark.differential
@pytest.mark.parametrize("loops", [
    pytest.param("compiled", marks=pytest.mark.mmrope_applies(compiled.available(), "the compiled loops")), "numpy"])
def test_positions_equal_the_models_own_get_rope_index(engine, model, loops, monkeypatch):
    if loops == "numpy":
        monkeypatch.setattr(compiled, "native", None)
    rng = random.Random(f"storyboard {loops}")
    for index in range(100):
        rows, inputs = joined([board_batch(engine.processor, engine.config, rng) for _ in range(rng.randint(1, 4))])
        input_ids, mask = padded_batch(rows, 0, left=rng.random() < 0.5)
        want, want_deltas = model.get_rope_index(input_ids, attention_mask=mask, **inputs)
        positions, deltas = engine.get_rope_index(input_ids, mask, **inputs)
        valid = mask.bool()
        assert torch.equal(positions[:, valid], want[:, valid]), f"batch {index}"
        assert torch.equal(deltas.flatten(), want_deltas.flatten()), f"batch {index}"
        packed = torch.tensor([[token for row in rows for token in row]])
        bounds = torch.tensor([0, *np.cumsum([len(row) for row in rows])])
        in_row, in_row_deltas = engine.get_rope_index(packed, cu_seqlens=bounds, **inputs)
        assert torch.equal(in_row[:, 0], want[:, valid]), f"batch {index}"
        assert torch.equal(in_row_deltas.flatten(), want_deltas.flatten()), f"batch {index}"


def test_the_reference_implementation_is_the_models_own_and_refuses_as_the_kernel_does(engine, manager, ids):
    reference = RopeEngine.from_processor(engine.processor, engine.config, plugin_manager=manager,
                                          implementation="reference")
    assert reference.implementation == "reference"
    rng = random.Random("storyboard reference")
    for _ in range(20):
        rows, inputs = joined([board_batch(engine.processor, engine.config, rng) for _ in range(2)])
        input_ids, mask = padded_batch(rows, 0, left=True)
        positions, deltas = reference.get_rope_index(input_ids, mask, **inputs)
        want, want_deltas = engine.get_rope_index(input_ids, mask, **inputs)
        valid = mask.bool()
        assert torch.equal(positions[:, valid], want[:, valid]) and torch.equal(deltas, want_deltas)
    input_ids, media = truncated(engine, ids)
    with pytest.raises(PlaceholderMismatchError, match="sample 0, board at token"):
        reference.get_rope_index(input_ids, **media)


def test_mmrope_verify_finds_the_fast_kernel_equal_to_the_reference(engine, manager):
    report = verify(engine.processor, engine.config, samples=30, plugin_manager=manager)
    assert report.fast_equal == 30 and report.implementation == "fast"


def test_the_processor_lays_boards_out_as_the_model_reads_them(engine, model):
    processor = engine.processor
    for seed in range(6):
        outputs = [processor(**sample) for sample in board_samples(processor, random.Random(seed))]
        for side in ("left", "right"):
            input_ids, mask, inputs = engine.batch(outputs, side)
            kwargs = engine.rope_index_kwargs(inputs)
            want, want_deltas = model.get_rope_index(input_ids, attention_mask=mask, **kwargs)
            positions, deltas = engine.get_rope_index(input_ids, mask, **kwargs)
            assert torch.equal(positions[:, mask.bool()], want[:, mask.bool()])
            assert torch.equal(deltas.flatten(), want_deltas.flatten())


def test_a_packed_row_trains_each_sample_as_it_is_alone(engine, model):
    processor = engine.processor
    samples = [processor(**sample) for sample in board_samples(processor, random.Random("packed"))]
    batch = PackedCollator(engine)(samples)
    assert batch["position_ids"].shape[0] == 4 and "attention_mask" not in batch
    media_keys = ("pixel_values", *MEDIA_KEYS)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False,
                       **{key: batch[key] for key in media_keys}).last_hidden_state
        start = 0
        for sample in samples:
            alone = model(input_ids=sample["input_ids"], use_cache=False,
                          **{key: sample[key] for key in media_keys}).last_hidden_state
            end = start + alone.shape[1]
            assert torch.allclose(packed[:, start:end], alone, atol=1e-5)
            start = end
        # the positions matter: the row counted on as text gives other states
        plain = model(input_ids=batch["input_ids"], use_cache=False,
                      position_ids=torch.arange(batch["input_ids"].shape[1])[None]).last_hidden_state
    assert not torch.allclose(plain, packed, atol=1e-3)


def truncated(engine, ids):
    """A sample cut inside its first board: its end marker and what follows gone."""
    rng = random.Random(3)
    sample = board_batch(engine.processor, engine.config, rng)
    while "panel_grid_thw" not in sample:
        sample = board_batch(engine.processor, engine.config, rng)
    row = sample["input_ids"][0].tolist()
    panels = int(sample["panel_grid_thw"][0, 0])
    media = {"panel_grid_thw": sample["panel_grid_thw"][:1], "panel_times": sample["panel_times"][:panels],
             "narration_lengths": sample["narration_lengths"][:1]}
    return torch.tensor([row[: row.index(ids[1])]]), media


def test_a_truncated_board_is_refused_by_name(engine, ids):
    input_ids, media = truncated(engine, ids)
    with pytest.raises(PlaceholderMismatchError, match="sample 0, board at token"):
        engine.get_rope_index(input_ids, **media)


def test_panels_shown_for_uneven_times_sit_at_their_own_time_stamps(engine, model, ids):
    start, end, panel, narration = ids
    processor = engine.processor
    panels = [np.full((28, 28, 3), 40 * index, np.uint8) for index in range(4)]
    # shown 0.5, 0, 2.25 and 1 seconds: stamps 0, 0.5, 0.5, 2.75; temporal ids 0, 1, 1, 5 (two a second)
    outputs = processor(text=["a <|board|> b"], boards=[(panels, [0.5, 0.0, 2.25, 1.0], np.zeros(16000, np.float32))])
    assert outputs["panel_times"].tolist() == [0.0, 0.5, 0.5, 2.75]
    kwargs = engine.rope_index_kwargs(outputs)
    positions, deltas = engine.get_rope_index(outputs["input_ids"], outputs["attention_mask"], **kwargs)
    want, want_deltas = model.get_rope_index(outputs["input_ids"], attention_mask=outputs["attention_mask"], **kwargs)
    assert torch.equal(positions, want) and torch.equal(deltas, want_deltas)
    row = outputs["input_ids"][0].tolist()
    assert row[1:] == [start, panel, panel, panel, narration, narration, panel, end, row[-1]]
    # text, the marker, the block from 2: the panels of second 0 (ids 0, 1, 1), that second's two
    # narration tokens, the panel of second 2 (id 5); the end marker and text past it
    assert positions[0, 0].tolist() == [0, 1, 2, 3, 3, 2, 3, 7, 8, 9]
    with pytest.raises(ValueError, match="shows each of its 4 panels for some seconds"):
        processor(text=["<|board|>"], boards=[(panels, [1.0, 1.0], np.zeros(16000, np.float32))])


def test_bad_panel_times_are_refused_naming_the_board_and_panel(engine):
    sample = board_batch(engine.processor, engine.config, random.Random(5))
    while "panel_grid_thw" not in sample or int(sample["panel_grid_thw"][0, 0]) < 2:
        sample = board_batch(engine.processor, engine.config, random.Random(len(sample["input_ids"][0])))
    inputs = {key: sample[key] for key in MEDIA_KEYS}
    falling = inputs["panel_times"].clone()
    falling[1] = falling[0] - 1
    with pytest.raises(InvalidInputError, match=r"panel_times \(grid 0 of panel_grid_thw, frame 1\)"):
        engine.get_rope_index(sample["input_ids"], **{**inputs, "panel_times": falling})
    with pytest.raises(InvalidInputError, match=r"panel_times has .* time stamps? for the"):
        engine.get_rope_index(sample["input_ids"], **{**inputs, "panel_times": inputs["panel_times"][1:]})


def test_the_plugin_conforms():
    assert_conforms("storyboard")


def test_the_processor_refuses_what_it_would_otherwise_drop_or_misread(engine):
    processor = engine.processor
    narration = np.zeros(16000, np.float32)
    board = ([np.zeros((28, 28, 3), np.uint8)] * 2, [0.5, 0.5], narration)
    with pytest.raises(InvalidInputError, match=r"3 boards are given for the texts' 2 <\|board\|> markers: boards 2 "
                                                r"to 2 have none \(the last text is text 1\)"):
        processor(text=["a <|board|>", "<|board|> b"], boards=[board] * 3)
    with pytest.raises(InvalidInputError, match=r"text 1 holds a <\|board\|> marker with no board"):
        processor(text=["a <|board|>", "b <|board|>"], boards=[board])
    with pytest.raises(InvalidInputError, match="text is a NoneType: give a string or a list of strings"):
        processor(text=None)
    with pytest.raises(InvalidInputError, match="text 0 is a tuple, not a string"):
        processor(text=[("a", "b")])
    uneven = ([np.zeros((28, 28, 3), np.uint8), np.zeros((56, 28, 3), np.uint8)], [0.5, 0.5], narration)
    with pytest.raises(InvalidInputError, match=r"text 1, board 1: panel 1 is \(56, 28, 3\), panel 0 \(28, 28, 3\); "
                                                r"a board's panels are one grid: resize them"):
        processor(text=["a <|board|>", "b <|board|>"], boards=[board, uneven])
    with pytest.raises(InvalidInputError, match=r"text 0, board 0: a board is a \(panels, seconds each is shown, "
                                                r"narration waveform\) triple, got a dict"):
        processor(text=["a <|board|>"], boards=[{"panels": board[0]}])
    with pytest.raises(UnknownKeywordError, match="'padding_sde'; did you mean 'padding_side'"):
        processor(text=["a"], padding_sde="left")
    with pytest.raises(InvalidInputError, match="padding_side='middle'"):
        processor(text=["a"], padding_side="middle")
    with pytest.raises(InvalidInputError, match="padding='max_length': the texts are padded to the longest"):
        processor(text=["a"], padding="max_length")
    with pytest.raises(InvalidInputError, match="padding=False, but the texts are of 2 lengths in tokens: pass padding=True"):
        processor(text=["a", "a b"], padding=False)
    padded = processor(text=["a", "a b"], padding="longest", padding_side="left")
    assert padded["attention_mask"].tolist() == [[0, 1], [1, 1]]


def test_one_text_as_a_string_is_one_sample(engine):
    processor = engine.processor
    board = ([np.zeros((28, 28, 3), np.uint8)] * 2, [0.5, 0.5], np.zeros(16000, np.float32))
    alone, listed = processor(text="a <|board|> b", boards=[board]), processor(text=["a <|board|> b"], boards=[board])
    assert alone.keys() == listed.keys() and alone["input_ids"].shape[0] == 1
    assert all(torch.equal(alone[key], listed[key]) for key in alone)
