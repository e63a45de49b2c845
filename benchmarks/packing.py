"""Packed rows: one (1, 65536) row of 16 samples with images and videos, one packed engine call
vs the transformers reference called once per segment, for ``get_rope_index`` and for
``compute_position_ids`` (what trainers call); samples of one length (4096 tokens each) and of
lengths between 2500 and 5700 tokens, as packing makes them. Then 15 of the latter packed with
``segment_ids`` into four rows of 16384 tokens, each row filled with whole samples and padded
at its end ("neat packing"). Prints the ratios measured in this run. The packed calls take
about a millisecond, so each time is the fastest of 20 rounds of 5 calls: on a machine whose
speed changes from second to second, fewer rounds left the ratio moving by a fifth between runs.

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
    reference = engine(processor, config, "qwen_vl", implementation="reference")
    print(f"{environment()}\n")
    print("Qwen2.5-VL packed samples, images + videos: the reference called per segment")
    print(f"{'segments':<18}{'call':<24}{'reference':>12}{'fast':>12}{'ref/fast':>10}")
    rng = random.Random(0)
    varied = [rng.randint(2500, 5700) for _ in range(15)]
    layouts = (("16 x 4096", [[4096] * 16]), ("2500 to 5700", [[*varied, 65536 - sum(varied)]]),
               ("4 rows, padded", rows_of(varied, 16384)))
    for name, rows in layouts:
        t = compare(processor, fast, reference, rows, random.Random(0), args.repeat)
        for call in ("get_rope_index", "compute_position_ids"):
            t_ref, t_fast = t[f"reference {call}"], t[f"fast {call}"]
            print(f"{name:<18}{call:<24}{t_ref * 1e3:>10.1f}ms{t_fast * 1e3:>10.2f}ms{t_ref / t_fast:>9.1f}x")


def rows_of(lengths, width):
    """Sample lengths filling rows of ``width`` tokens in order, each row as full as whole samples make it."""
    rows = [[]]
    for length in lengths:
        if sum(rows[-1]) + length > width:
            rows.append([])
        rows[-1].append(length)
    return rows


def compare(processor, fast, reference, rows, rng, repeat) -> dict[str, float]:
    """Seconds per call: one packed engine call against the reference called per segment. One
    row that its samples fill is packed with ``cu_seqlens``; rows to pad, with ``segment_ids``."""
    width = max(sum(lengths) for lengths in rows)
    samples = [sample(processor, rng, length) for lengths in rows for length in lengths]
    ids = torch.full((len(rows), width), processor.tokenizer.pad_token_id)
    segment_ids = torch.zeros(len(rows), width, dtype=torch.long)
    for r, lengths in enumerate(rows):
        segment_ids[r, : sum(lengths)] = torch.repeat_interleave(torch.arange(1, len(lengths) + 1), torch.tensor(lengths))
    ids[segment_ids > 0] = torch.cat([s[0] for s in samples])
    if len(rows) == 1:
        packing = {"cu_seqlens": torch.tensor([0, *rows[0]]).cumsum(0)}
    else:
        packing = {"segment_ids": segment_ids}
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

    positions, _ = fast.get_rope_index(ids, **packing, **packed_kwargs)
    assert torch.equal(positions, reference.get_rope_index(ids, **packing, **packed_kwargs)[0])
    return timed({
        "reference get_rope_index": lambda: per_segment(lambda row, kwargs: reference.get_rope_index(row, **kwargs)),
        "fast get_rope_index": lambda: fast.get_rope_index(ids, **packing, **packed_kwargs),
        "reference compute_position_ids": lambda: per_segment(
            lambda row, kwargs: reference.compute_position_ids(row, None, kwargs)),
        "fast compute_position_ids": lambda: fast.compute_position_ids(ids, None, packed_kwargs, **packing),
    }, repeat)


if __name__ == "__main__":
    main()
