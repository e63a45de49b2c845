"""Sequence and context parallel: what one rank's batch costs. A (1, 65536) row of 16 Qwen2.5-VL
samples with images and videos (ids and grids; positions depend on nothing else), cut for rank 3
of 8 by each scheme:

- ``split_batch`` of the whole batch vs cutting it by hand, ``value[..., index]`` for every
  per-token tensor with the index computed once beforehand;
- ``PackedCollator(split=...)`` vs the unsplit collator, next-token labels shifted and that cut
  by hand;
- the rank's batch's bytes vs the whole batch's (per-token tensors; media are kept whole);
- peak memory: ``PackedCollator(split=...)`` vs building the whole padded row (rank None) and
  cutting it with ``split_batch``, and the unsplit collator for scale. Each variant runs once in
  a fresh process (warmed up by one call first); its peak resident memory beyond what the process
  held before the call is read from ``/proc/self/status`` (``VmHWM`` after resetting it), with
  every block of 64 KiB or more mapped afresh so that none hides in memory freed before.

Prints the ratios measured in this run, on one torch thread: what PyTorch's DataLoader gives each
worker, where collators run.

    python benchmarks/parallel.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys

import torch
from packing import sample as packing_sample
from timing import engine, environment, timed

from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import SCHEMES, split_batch, split_index
from mmrope_qwen_vl.examples import build

SIZE, RANK, SAMPLES, LENGTH = 8, 3, 16, 4096
PER_TOKEN = ("input_ids", "labels", "shift_labels", "position_ids")


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


def with_shift_labels(batch):
    """The unsplit batch with the next-token labels the split collator adds, made by hand."""
    return {**batch, "shift_labels": torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)}


def nbytes(batch):
    return sum(batch[key].numel() * batch[key].element_size() for key in PER_TOKEN)


#: the ways to a rank's batch whose peak memory is measured, each in a process of its own
MEMORY_VARIANTS = {
    "split": lambda qwen, scheme: PackedCollator(qwen, split=(scheme, SIZE, RANK)),
    "whole + split_batch": lambda qwen, scheme: lambda samples: split_batch(
        PackedCollator(qwen, split=(scheme, SIZE, None))(samples), scheme=scheme, size=SIZE, rank=RANK),
    "unsplit": lambda qwen, scheme: PackedCollator(qwen, flash_attn_kwargs=True),
}


def setup():
    torch.set_num_threads(1)
    processor, config = build("Qwen2.5-VL")
    qwen = engine(processor, config, "qwen_vl")
    rng = random.Random(0)
    return qwen, [sample(processor, rng) for _ in range(SAMPLES)]


def measure_peak(scheme: str, variant: str) -> None:
    """Print the peak resident bytes of one call of ``variant`` beyond what the process held before."""
    qwen, samples = setup()
    call = MEMORY_VARIANTS[variant](qwen, scheme)
    call(samples)  # the first call's lazy imports and caches are not the batch's
    before = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # the high-water mark from here
    batch = call(samples)
    held = sum(batch[key].numel() * batch[key].element_size() for key in PER_TOKEN if key in batch)
    print(_status("VmHWM") - before, held)


def _status(key: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key))


def peaks(scheme: str) -> dict[str, tuple[int, int]]:
    """Each variant's (peak bytes, per-token output bytes), each measured in a fresh process."""
    measured = {}
    for variant in MEMORY_VARIANTS:
        done = subprocess.run([sys.executable, __file__, "--measure-memory-of", scheme, variant], check=True,
                              capture_output=True, text=True, env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)})
        peak, size = done.stdout.split()[-2:]
        measured[variant] = (int(peak), int(size))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--measure-memory-of", nargs=2, metavar=("SCHEME", "VARIANT"))
    args = parser.parse_args()
    if args.measure_memory_of:
        measure_peak(*args.measure_memory_of)
        return
    qwen, samples = setup()
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
                   "collator by hand": lambda index=unsplit_index, whole=whole: by_hand(with_shift_labels(whole(samples)),
                                                                                        index)},
                  args.repeat)
        mine = split_batch(row, scheme=scheme, size=SIZE, rank=RANK)
        print(f"{scheme:<12}{t['split_batch'] * 1e3:>11.2f}ms{t['by hand'] * 1e3:>8.2f}ms"
              f"{t['split_batch'] / t['by hand']:>7.2f}x{t['collator'] * 1e3:>10.1f}ms"
              f"{t['collator by hand'] * 1e3:>9.1f}ms{t['collator'] / t['collator by hand']:>7.2f}x"
              f"{nbytes(mine) / nbytes(row):>20.3f}")
    print("\npeak memory of one call beyond what the process held (MiB); ratios to the whole padded row "
          "built and cut")
    print(f"{'scheme':<12}{'split':>8}{'whole + split_batch':>21}{'ratio':>8}{'unsplit':>9}{'ratio':>8}"
          f"{'rank output':>13}")
    for scheme in SCHEMES:
        measured = peaks(scheme)
        split, cut, unsplit = (measured[variant][0] for variant in MEMORY_VARIANTS)
        print(f"{scheme:<12}{split / 2**20:>8.2f}{cut / 2**20:>21.2f}{split / cut:>7.2f}x{unsplit / 2**20:>9.2f}"
              f"{split / unsplit:>7.2f}x{measured['split'][1] / 2**20:>13.2f}")


if __name__ == "__main__":
    main()
