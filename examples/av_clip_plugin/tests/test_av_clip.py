"""AV-Clip against its rule written plainly, token by token: generated samples of text and clips,
batched with padding on either side and packed, through the engine and the kernel, on the compiled
loops and in numpy; its processor through the engine; what it refuses; the conformance suite."""

import random

import numpy as np
import pytest
import torch

from mmrope_av_clip import MELS_PER_TOKEN, MERGE, PER_SECOND, TOKENS, build, clip_tokens
from mmrope_core import PlaceholderMismatchError, PluginManager, RopeEngine, compiled
from mmrope_core.testing import assert_conforms
from mmrope_core.tiny import padded_batch


def reference(row, clips, ids):
    """One sample's positions ``(3, n)`` and delta by AV-Clip's rule, token by token: text and
    markers count on; in a clip, frame ``f``'s tokens sit at ``(start + trunc(f * seconds * 4),
    start + line, start + column)`` and sound token ``i`` at ``start + i``, where ``start`` is one
    past the clip's marker; its end marker one past the clip's largest position."""
    start_id, end_id, frame_id, sound_id = ids
    positions, following, clips = [], 0, iter(clips)
    for token in row:
        if token == start_id:
            grid, seconds, _ = next(clips)
            positions.append((following,) * 3)
            start, frames_seen, sounds, opened = following + 1, 0, 0, len(positions)
        elif token == frame_id:
            width = grid[2] // MERGE
            frame, inside = divmod(frames_seen, grid[1] // MERGE * width)
            temporal = int(frame * (float(np.float32(seconds)) * PER_SECOND))
            positions.append((start + temporal, start + inside // width, start + inside % width))
            frames_seen += 1
        elif token == sound_id:
            positions.append((start + sounds,) * 3)
            sounds += 1
        elif token == end_id:
            largest = max(max(position) for position in positions[opened:])
            positions.append((largest + 1,) * 3)
            following = largest + 2
        else:
            positions.append((following,) * 3)
            following += 1
    positions = torch.tensor(positions, dtype=torch.long).t()
    return positions, int(positions.max()) + 1 - len(row)


def random_sample(rng, ids):
    """Text and up to three clips (random grids, seconds and sound), laid out as the processor lays them out."""
    start_id, end_id, frame_id, sound_id = ids
    row, clips = [rng.randrange(10, 40) for _ in range(rng.randint(0, 5))], []
    for _ in range(rng.randint(0, 3)):
        grid = (rng.randint(1, 5), MERGE * rng.randint(1, 3), MERGE * rng.randint(1, 3))
        seconds = rng.choice((0.5, 1.0, 2 / 3, 0.04, 1.3, rng.uniform(0.1, 3)))
        mels = rng.randint(1, 20 * MELS_PER_TOKEN)
        clips.append((grid, seconds, mels))
        row += [start_id, *clip_tokens(grid, float(np.float32(seconds)), mels, frame_id, sound_id), end_id]
        row += [rng.randrange(10, 40) for _ in range(rng.randint(0, 4))]
    return row or [11], clips


def media(clips):
    if not clips:
        return {}
    return {"video_grid_thw": torch.tensor([grid for grid, _, _ in clips]),
            "second_per_grids": torch.tensor([seconds for _, seconds, _ in clips], dtype=torch.float32),
            "audio_seqlens": torch.tensor([mels for _, _, mels in clips])}


@pytest.fixture(scope="module")
def engine():
    processor, config = build()
    return RopeEngine.from_processor(processor, config, plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "av_clip"}))


@pytest.fixture(scope="module")
def ids(engine):
    return engine.processor.tokenizer.convert_tokens_to_ids(list(TOKENS.values()))


@pytest.mark.differential
@pytest.mark.parametrize("loops", ["compiled", "numpy"])
def test_positions_follow_the_rule_token_by_token(engine, ids, loops, monkeypatch):
    if loops == "numpy":
        monkeypatch.setattr(compiled, "native", None)
    elif not compiled.available():
        pytest.skip("the compiled loops are not loaded")
    rng = random.Random(f"av clip {loops}")
    for index in range(150):
        samples = [random_sample(rng, ids) for _ in range(rng.randint(1, 5))]
        wanted = [reference(row, clips, ids) for row, clips in samples]
        inputs = media([clip for _, clips in samples for clip in clips])
        left = rng.random() < 0.5
        input_ids, mask = padded_batch([row for row, _ in samples], 0, left=left)
        positions, deltas = engine.get_rope_index(input_ids, mask, **inputs)
        four = engine.compute_position_ids(input_ids, mask, inputs)
        packed = torch.tensor([[token for row, _ in samples for token in row]])
        bounds = torch.tensor([0, *np.cumsum([len(row) for row, _ in samples])])
        in_row, in_row_deltas = engine.get_rope_index(packed, cu_seqlens=bounds, **inputs)
        for sample, (want, delta) in enumerate(wanted):
            valid = mask[sample].bool()
            where = f"batch {index}, sample {sample}"
            assert torch.equal(positions[:, sample, valid], want) and int(deltas[sample]) == delta, where
            assert torch.equal(four[sample, 1:, valid], want), where
            assert torch.equal(in_row[:, 0, bounds[sample] : bounds[sample + 1]], want), where
            assert int(in_row_deltas[sample]) == delta, where


def test_the_processor_lays_clips_out_as_the_rule_reads_them(engine, ids):
    rng = random.Random("av clip processor")
    processor = engine.processor
    for _ in range(10):
        outputs = [engine.process(**sample) for sample in processor_samples(processor, rng)]
        input_ids, mask, inputs = engine.batch(outputs, "left")
        positions, deltas = engine.get_rope_index(input_ids, mask, **engine.rope_index_kwargs(inputs))
        clips = list(zip(inputs["video_grid_thw"].tolist(), inputs["second_per_grids"].tolist(),
                         inputs["audio_seqlens"].tolist()))
        for sample, output in enumerate(outputs):
            row = output["input_ids"][0].tolist()
            mine = clips[: row.count(ids[0])]
            clips = clips[len(mine):]
            want, delta = reference(row, mine, ids)
            assert torch.equal(positions[:, sample, mask[sample].bool()], want) and int(deltas[sample]) == delta


def processor_samples(processor, rng):
    from mmrope_av_clip import clip_samples

    return clip_samples(processor, rng)


def test_a_truncated_clip_is_refused_by_name(engine, ids):
    row, clips = random_sample(random.Random(3), ids)
    while not clips:
        row, clips = random_sample(random.Random(len(row)), ids)
    cut = row[: row.index(ids[1])]  # the first clip's end marker and what follows gone
    with pytest.raises(PlaceholderMismatchError, match="sample 0, clip at token"):
        engine.get_rope_index(torch.tensor([cut]), **media(clips[:1]))


def test_the_plugin_conforms():
    assert_conforms("av_clip")
