"""Storyboard against its model's own get_rope_index: generated samples of text and boards, batched
with padding on either side and packed, through the engine, on the compiled loops and in numpy;
its processor; packed rows at the tiny model; the conformance suite."""

import random

import importlib_metadata
import numpy as np
import pytest
import torch

from mmrope_core import PlaceholderMismatchError, PluginManager, RopeEngine, compiled
from mmrope_core.collators import PackedCollator
from mmrope_core.testing import assert_conforms
from mmrope_core.tiny import padded_batch
from mmrope_storyboard import (
    MEDIA_KEYS,
    MELS_PER_TOKEN,
    MERGE,
    TOKENS,
    StoryboardModel,
    board_samples,
    board_tokens,
    build,
)


@pytest.fixture(scope="module")
def engine():
    processor, config = build()
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "storyboard"})
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


def random_sample(rng, ids):
    """Text and up to three boards (random grids, pace and narration), laid out as the processor lays them out."""
    start_id, end_id, panel_id, narration_id = ids
    row, boards = [rng.randrange(10, 16) for _ in range(rng.randint(0, 5))], []
    for _ in range(rng.randint(0, 3)):
        grid = (rng.randint(1, 6), MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3))
        seconds = float(np.float32(rng.choice((0.25, 0.5, 1.0, 2 / 3, 1.3, rng.uniform(0.1, 3)))))
        mels = rng.randint(1, 12 * MELS_PER_TOKEN)
        boards.append((grid, seconds, mels))
        row += [start_id, *board_tokens(grid, seconds, mels, panel_id, narration_id), end_id]
        row += [rng.randrange(10, 16) for _ in range(rng.randint(0, 4))]
    return row or [11], boards


def media(boards):
    if not boards:
        return {}
    return {"panel_grid_thw": torch.tensor([grid for grid, _, _ in boards]),
            "seconds_per_panel": torch.tensor([seconds for _, seconds, _ in boards], dtype=torch.float32),
            "narration_lengths": torch.tensor([mels for _, _, mels in boards])}


@pytest.mark.differential
@pytest.mark.parametrize("loops", ["compiled", "numpy"])
def test_positions_equal_the_models_own_get_rope_index(engine, model, ids, loops, monkeypatch):
    if loops == "numpy":
        monkeypatch.setattr(compiled, "native", None)
    else:
        assert compiled.available(), "the compiled loops are not loaded"
    rng = random.Random(f"storyboard {loops}")
    for index in range(100):
        samples = [random_sample(rng, ids) for _ in range(rng.randint(1, 4))]
        inputs = media([board for _, boards in samples for board in boards])
        input_ids, mask = padded_batch([row for row, _ in samples], 0, left=rng.random() < 0.5)
        want, want_deltas = model.get_rope_index(input_ids, attention_mask=mask, **inputs)
        positions, deltas = engine.get_rope_index(input_ids, mask, **inputs)
        valid = mask.bool()
        assert torch.equal(positions[:, valid], want[:, valid]), f"batch {index}"
        assert torch.equal(deltas.flatten(), want_deltas.flatten()), f"batch {index}"
        packed = torch.tensor([[token for row, _ in samples for token in row]])
        bounds = torch.tensor([0, *np.cumsum([len(row) for row, _ in samples])])
        in_row, in_row_deltas = engine.get_rope_index(packed, cu_seqlens=bounds, **inputs)
        assert torch.equal(in_row[:, 0], want[:, valid]), f"batch {index}"
        assert torch.equal(in_row_deltas.flatten(), want_deltas.flatten()), f"batch {index}"


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


def test_a_truncated_board_is_refused_by_name(engine, ids):
    rng = random.Random(3)
    row, boards = random_sample(rng, ids)
    while not boards:
        row, boards = random_sample(rng, ids)
    cut = row[: row.index(ids[1])]  # the first board's end marker and what follows gone
    with pytest.raises(PlaceholderMismatchError, match="sample 0, board at token"):
        engine.get_rope_index(torch.tensor([cut]), **media(boards[:1]))


def test_the_plugin_conforms():
    assert_conforms("storyboard")
