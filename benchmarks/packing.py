"""Packed rows: one (1, 65536) row of 16 samples with images and videos, one packed engine call
vs the transformers reference called once per segment, for ``get_rope_index`` and for
``compute_position_ids`` (what trainers call); samples of one length (4096 tokens each) and of
lengths between 2500 and 5700 tokens, as packing makes them. Prints the ratios measured in this
run. The packed calls take under a millisecond, so each time is the fastest of 20 rounds of 5
calls: on a machine whose speed changes from second to second, fewer rounds left the ratio
moving by a fifth between runs.

    python benchmarks/packing.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import random

import torch

from mmrope_qwen_vl.examples import build
from timing import engine, environment, timed


def sample(processor, rng, length):
    """``length`` tokens: text, 1-3 images and sometimes a video, each inside vision markers."""
    tokenizer = processor.tokenizer
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    word = tokenizer.convert_tokens_to_ids("cat")
    row, images, videos = [word] * 8, [], []
    for _ in range(rng.randint(1, 3)):
        grid = (1, 2 * rng.randint(4, 14), 2 * rng.randint(4, 14))
        images.append(grid)
        row += [start] + [processor.image_token_id] * (grid[1] * grid[2] // 4) + [end] + [word] * rng.randint(8, 64)
    if rng.random() < 0.5:
        grid = (rng.randint(2, 8), 2 * rng.randint(4, 8), 2 * rng.randint(4, 8))
        videos.append(grid)
        row += [start] + [processor.video_token_id] * (grid[0] * grid[1] * grid[2] // 4) + [end]
    row += [word] * (length - len(row))
    return torch.tensor(row[:length]), images, videos


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    processor, config = build("Qwen2.5-VL")
    fast = engine(processor, config, "qwen_vl")
    reference = engine(processor, config, "qwen_vl", impl="reference")
    print(f"{environment()}\n")
    print("Qwen2.5-VL packed 1 x 65536, 16 samples, images + videos: the reference called per segment")
    print(f"{'segments':<18}{'call':<24}{'reference':>12}{'fast':>12}{'ref/fast':>10}")
    rng = random.Random(0)
    varied = [rng.randint(2500, 5700) for _ in range(15)]
    for name, lengths in (("16 x 4096", [4096] * 16), ("2500 to 5700", [*varied, 65536 - sum(varied)])):
        t = compare(processor, fast, reference, lengths, random.Random(0), args.repeat)
        for call in ("get_rope_index", "compute_position_ids"):
            t_ref, t_fast = t[f"reference {call}"], t[f"fast {call}"]
            print(f"{name:<18}{call:<24}{t_ref * 1e3:>10.1f}ms{t_fast * 1e3:>10.2f}ms{t_ref / t_fast:>9.1f}x")


def compare(processor, fast, reference, lengths, rng, repeat) -> dict[str, float]:
    """Seconds per call: one packed engine call against the reference called per segment."""
    samples = [sample(processor, rng, length) for length in lengths]
    ids = torch.cat([s[0] for s in samples]).unsqueeze(0)
    cu_seqlens = torch.tensor([0, *lengths]).cumsum(0)
    images = torch.tensor([g for s in samples for g in s[1]])
    videos = torch.tensor([g for s in samples for g in s[2]])
    seconds = torch.full((videos.shape[0],), 0.5)
    packed_kwargs = {"image_grid_thw": images, "video_grid_thw": videos, "second_per_grid_ts": seconds}

    segments, video_index = [], 0  # each segment's row and arguments, built before any timing
    for row, sample_images, sample_videos in samples:
        kwargs = {"image_grid_thw": torch.tensor(sample_images)}
        if sample_videos:
            kwargs["video_grid_thw"] = torch.tensor(sample_videos)
            kwargs["second_per_grid_ts"] = seconds[video_index : video_index + len(sample_videos)]
            video_index += len(sample_videos)
        segments.append((row.unsqueeze(0), kwargs))

    def per_segment(call):
        for row, kwargs in segments:
            call(row, kwargs)

    positions, _ = fast.get_rope_index(ids, cu_seqlens=cu_seqlens, **packed_kwargs)
    assert torch.equal(positions, reference.get_rope_index(ids, cu_seqlens=cu_seqlens, **packed_kwargs)[0])
    return timed({
        "reference get_rope_index": lambda: per_segment(lambda row, kwargs: reference.get_rope_index(row, **kwargs)),
        "fast get_rope_index": lambda: fast.get_rope_index(ids, cu_seqlens=cu_seqlens, **packed_kwargs),
        "reference compute_position_ids": lambda: per_segment(
            lambda row, kwargs: reference.compute_position_ids(row, None, kwargs)),
        "fast compute_position_ids": lambda: fast.compute_position_ids(ids, None, packed_kwargs, cu_seqlens=cu_seqlens),
    }, repeat)


if __name__ == "__main__":
    main()
