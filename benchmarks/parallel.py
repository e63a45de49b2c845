"""Sequence and context parallel: what one rank's batch costs. A (1, 65536) row of 16 Qwen2.5-VL
samples with images and videos (ids and grids; positions depend on nothing else), cut for rank 3
of 8 by each scheme:

- ``split_batch`` of the whole batch vs cutting it by hand, ``value[..., index]`` for every
  per-token tensor with the index computed once beforehand;
- ``PackedCollator(split=...)`` vs the unsplit collator followed by that cut by hand;
- the rank's batch's bytes vs the whole batch's (per-token tensors; media are kept whole).

Prints the ratios measured in this run, on one torch thread: what PyTorch's DataLoader gives each
worker, where collators run.

    python benchmarks/parallel.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import random

import torch
from packing import sample as packing_sample
from timing import engine, environment, timed

from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import SCHEMES, split_batch, split_index
from mmrope_qwen_vl.examples import build

SIZE, RANK, SAMPLES, LENGTH = 8, 3, 16, 4096
PER_TOKEN = ("input_ids", "labels", "position_ids")


def sample(processor, rng):
    """About ``LENGTH`` tokens (packing.py's samples), lengths that no scheme cuts as they are."""
    ids, images, videos = packing_sample(processor, rng, LENGTH - rng.randint(0, 7))
    out = {"input_ids": ids[None]}
    if images:
        out["image_grid_thw"] = torch.tensor(images)
    if videos:
        out["video_grid_thw"] = torch.tensor(videos)
    return out


def by_hand(batch, index):
    return {**batch, **{key: batch[key][..., index] for key in PER_TOKEN}}


def nbytes(batch):
    return sum(batch[key].numel() * batch[key].element_size() for key in PER_TOKEN)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    processor, config = build("Qwen2.5-VL")
    qwen = engine(processor, config, "qwen_vl")
    rng = random.Random(0)
    samples = [sample(processor, rng) for _ in range(SAMPLES)]
    print(f"{environment()}\n")
    print(f"Qwen2.5-VL, {SAMPLES} samples in one row of {sum(s['input_ids'].shape[1] for s in samples)} tokens, "
          f"rank {RANK} of {SIZE}")
    print(f"{'scheme':<12}{'split_batch':>13}{'by hand':>10}{'ratio':>8}{'collator':>12}{'+ by hand':>11}{'ratio':>8}"
          f"{'rank bytes / whole':>21}")
    for scheme in SCHEMES:
        collator = PackedCollator(qwen, split=(scheme, SIZE, RANK))
        whole = PackedCollator(qwen, flash_attn_kwargs=True)
        # the whole padded row the ranks share: their batches put back together
        padded = {**collator(samples)}
        layout = padded["cu_seqlens_padded"]
        full = {key: torch.empty((*value.shape[:-1], int(layout[-1])), dtype=value.dtype)
                for key, value in padded.items() if key in PER_TOKEN}
        for rank in range(SIZE):
            part = PackedCollator(qwen, split=(scheme, SIZE, rank))(samples)
            for key in PER_TOKEN:
                full[key][..., split_index(layout, scheme=scheme, size=SIZE, rank=rank)] = part[key]
        row = {**padded, **full}
        index = split_index(layout, scheme=scheme, size=SIZE, rank=RANK)
        unsplit = whole(samples)
        unsplit_index = index[index < unsplit["input_ids"].shape[1]]  # what a cut by hand of the unpadded row reads
        t = timed({"split_batch": lambda row=row, scheme=scheme: split_batch(row, scheme=scheme, size=SIZE, rank=RANK),
                   "by hand": lambda row=row, index=index: by_hand(row, index),
                   "collator": lambda collator=collator: collator(samples),
                   "collator by hand": lambda index=unsplit_index, whole=whole: by_hand(whole(samples), index)},
                  args.repeat)
        mine = split_batch(row, scheme=scheme, size=SIZE, rank=RANK)
        print(f"{scheme:<12}{t['split_batch'] * 1e3:>11.2f}ms{t['by hand'] * 1e3:>8.2f}ms"
              f"{t['split_batch'] / t['by hand']:>7.2f}x{t['collator'] * 1e3:>10.1f}ms"
              f"{t['collator by hand'] * 1e3:>9.1f}ms{t['collator'] / t['collator by hand']:>7.2f}x"
              f"{nbytes(mine) / nbytes(row):>20.3f}")


if __name__ == "__main__":
    main()
