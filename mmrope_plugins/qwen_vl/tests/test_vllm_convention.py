"""convention="vllm": the positions vLLM 0.33 computes for the Qwen-VL families, derived here from
its rules on short sequences (text after a run resumes one past the run's largest position on any
axis; Qwen2.5-VL's temporal ids are trunc(frame * float64(seconds) * tokens_per_second))."""

import functools
import random

import numpy as np
import pytest
import torch

from mmrope_core import PluginManager, RopeEngine, UnknownConventionError
from mmrope_qwen_vl.examples import build
from mmrope_qwen_vl.samples import random_batch


@functools.cache
def engines(name):
    processor, config = build(name)
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    return (RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm"),
            RopeEngine.from_processor(processor, config, plugin_manager=manager))


def row(processor, layout, frames=0, per_frame=0):
    """Token ids of ``layout``: t text, [ ] vision start/end, i an image token, v a video run of
    ``frames`` frames of ``per_frame`` tokens (per-frame families: one run per frame)."""
    tokenizer = processor.tokenizer
    word = tokenizer.convert_tokens_to_ids("cat")
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    ids = []
    for c in layout:
        ids += {"t": [word], "[": [start], "]": [end], "i": [processor.image_token_id],
                "v": [processor.video_token_id] * (frames * per_frame)}[c]
    return torch.tensor([ids])


def vllm_positions(layout_runs, length):
    """The rule, token by token: ``layout_runs`` are (first token, temporal ids per frame, h', w')
    of each media run in order; text counts on; a run's tokens are start + (t, h, w); text after
    it resumes at the run's largest position + 1."""
    positions = torch.zeros(3, length, dtype=torch.long)
    at, position = 0, 0
    for first, temporal, height, width in layout_runs:
        positions[:, at:first] = torch.arange(position, position + first - at)
        position += first - at
        t = torch.tensor(temporal).repeat_interleave(height * width)
        h = torch.arange(height).repeat_interleave(width).repeat(len(temporal))
        w = torch.arange(width).repeat(height * len(temporal))
        tokens = len(temporal) * height * width
        positions[:, first : first + tokens] = torch.stack([t, h, w]) + position
        position = int(positions[:, first : first + tokens].max()) + 1
        at = first + tokens
    positions[:, at:] = torch.arange(position, position + length - at)
    return positions, int(positions.max()) + 1 - length


@pytest.mark.differential
@pytest.mark.parametrize("grid, shift", [((3, 4, 4), 1), ((6, 4, 4), 4), ((3, 8, 8), 0), ((1, 4, 4), 0)])
def test_qwen2_vl_text_after_a_video_resumes_past_its_last_frame(grid, shift):
    vllm, transformers = engines("Qwen2-VL")
    frames, height, width = grid[0], grid[1] // 2, grid[2] // 2
    ids = row(vllm.processor, "ttt[v]tt", frames, height * width)
    kwargs = {"video_grid_thw": torch.tensor([grid])}
    positions, deltas = vllm.get_rope_index(ids, **kwargs)
    want, want_delta = vllm_positions([(4, list(range(frames)), height, width)], ids.shape[1])
    assert torch.equal(positions[:, 0], want) and deltas.tolist() == [[want_delta]]
    # transformers resumes max(h', w') past the run's start: the tokens after differ by the shift
    theirs, _ = transformers.get_rope_index(ids, **kwargs)
    assert (positions[:, 0, -3:] - theirs[:, 0, -3:]).unique().tolist() == [shift]


@pytest.mark.differential
@pytest.mark.parametrize("seconds, dtype", [(0.7, torch.float32), (0.04, torch.float32), (0.5, torch.float32),
                                            (1 / 3, torch.float64), (2.0, torch.float32)])
def test_qwen2_5_vl_temporal_ids_are_truncated_in_float64(seconds, dtype):
    vllm, _ = engines("Qwen2.5-VL")
    per_second = vllm.config.vision_config.tokens_per_second
    frames = 16
    ids = row(vllm.processor, "t[v]t", frames, 4)
    kwargs = {"video_grid_thw": torch.tensor([[frames, 4, 4]]), "second_per_grid_ts": torch.tensor([seconds], dtype=dtype)}
    scale = float(torch.tensor(seconds, dtype=dtype)) * per_second  # float(second_per_grid_ts) * tokens_per_second
    temporal = [int(frame * scale) for frame in range(frames)]
    positions, deltas = vllm.get_rope_index(ids, **kwargs)
    want, want_delta = vllm_positions([(2, temporal, 2, 2)], ids.shape[1])
    assert torch.equal(positions[:, 0], want) and deltas.tolist() == [[want_delta]]


def _scales_in_float32():
    """Whether the installed transformers' Qwen2.5-VL scales frames in float32 (5.10 truncates
    whole seconds instead)."""
    return getattr(engines("Qwen2.5-VL")[1].binding.kernel, "family", None) is not None and \
        not engines("Qwen2.5-VL")[1].binding.kernel.family.temporal.whole_seconds


@pytest.mark.mmrope_applies(_scales_in_float32(), "a transformers that scales Qwen2.5-VL's frames in float32")
def test_the_float64_rule_differs_from_transformers_float32_where_it_rounds_the_other_way():
    vllm, transformers = engines("Qwen2.5-VL")
    per_second = vllm.config.vision_config.tokens_per_second
    # 0.7 s: in float32, frame 5 * (tokens_per_second * 0.7) rounds up to a whole number, in float64 not
    frame = 5
    float32 = int(np.float32(frame) * (np.float32(per_second) * np.float32(0.7)))
    float64 = int(frame * (float(np.float32(0.7)) * per_second))
    assert float32 == float64 + 1
    ids = row(vllm.processor, "t[v]t", 6, 4)
    kwargs = {"video_grid_thw": torch.tensor([[6, 4, 4]]), "second_per_grid_ts": torch.tensor([0.7])}
    ours, theirs = vllm.get_rope_index(ids, **kwargs)[0], transformers.get_rope_index(ids, **kwargs)[0]
    frame_five = slice(2 + 5 * 4, 2 + 6 * 4)
    assert ours[0, 0, frame_five].unique().tolist() == [2 + float64]
    assert theirs[0, 0, frame_five].unique().tolist() == [2 + float32]


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen3-VL", "GLM-4V"])
def test_per_frame_families_are_the_same_in_both_conventions(name):
    vllm, transformers = engines(name)
    rng = random.Random(f"vllm {name}")
    for index in range(20):
        batch = random_batch(vllm.processor, rng, max_batch=4, max_frames=8)
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        kwargs = {key: value for key, value in batch.items() if value is not None}
        got, want = vllm.get_rope_index(ids, mask, **kwargs), transformers.get_rope_index(ids, mask, **kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"batch {index}"


@pytest.mark.differential
@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL"])
def test_batched_padded_packed_and_four_rows_are_each_sample_as_vllm_computes_it(name):
    """vLLM computes each request alone: a padded batch, a packed row and the four-row layout give
    each sample what it gets alone."""
    vllm, _ = engines(name)
    rng = random.Random(f"vllm layouts {name}")
    for index in range(20):
        batch = random_batch(vllm.processor, rng, max_batch=4, max_frames=8)
        ids, mask = batch.pop("input_ids"), batch.pop("attention_mask")
        kwargs = {key: value for key, value in batch.items() if value is not None}
        positions, deltas = vllm.get_rope_index(ids, mask, **kwargs)
        four = vllm.compute_position_ids(ids, mask, kwargs)
        valid = mask.bool()
        assert torch.equal(four[:, 1:].transpose(0, 1)[:, valid], positions[:, valid]), f"batch {index}"
        rows = [ids[r][valid[r]] for r in range(ids.shape[0])]
        joined = torch.cat(rows)[None]
        cu_seqlens = torch.tensor([0, *np.cumsum([r.numel() for r in rows])])
        packed, packed_deltas = vllm.get_rope_index(joined, cu_seqlens=cu_seqlens, **kwargs)
        assert torch.equal(packed[:, 0], positions[:, valid]) and torch.equal(packed_deltas, deltas), f"batch {index}"


def test_the_reference_has_no_vllm_convention_and_unknown_conventions_are_named():
    processor, config = build("Qwen2-VL")
    manager = PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl"})
    with pytest.raises(UnknownConventionError, match="implementation='reference' is transformers' own"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm",
                                  implementation="reference")
    with pytest.raises(UnknownConventionError, match=r"'sglang-0.4' is unknown; Qwen2-VL offers 'transformers', "
                                                     r"'vllm-0.33', 'vllm-0.34', 'sglang-0.5.23' \(vllm means "
                                                     r"'vllm-0.34'; sglang means 'sglang-0.5.23'\)"):
        RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="sglang-0.4")
    explicit = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm-0.33")
    assert "vLLM 0.33 convention" in repr(explicit) and explicit.convention == "vllm-0.33"
    # vLLM 0.34 changed no position rule: its name computes 0.33's positions, and "vllm" means it
    newest = RopeEngine.from_processor(processor, config, plugin_manager=manager, convention="vllm")
    assert newest.convention == "vllm-0.34" and "vLLM 0.34 convention (the rules of vLLM 0.33)" in repr(newest)
    assert newest.binding.kernel.family == explicit.binding.kernel.family
    # 1-D positions are the same in vLLM: a text-only engine takes the convention
    assert RopeEngine.from_processor(None, plugin_manager=manager, convention="vllm").rope_kind == "1d"
