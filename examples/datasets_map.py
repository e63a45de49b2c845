"""Add position ids to a Hugging Face ``datasets.Dataset`` of processed samples with
``Dataset.map(num_proc=2)``; equal to computing them one sample at a time in this process.

    python examples/datasets_map.py
"""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import random

import datasets
import torch

from mmrope_core import RopeEngine
from mmrope_qwen3_omni.examples import audio_and_image_samples, build

PER_TOKEN = ("input_ids", "attention_mask")


def processed_samples(processor, count, seed=0):
    """One processor call per sample (image and audio, audio alone, text alone), as lists."""
    rng, rows = random.Random(seed), []
    while len(rows) < count:
        for call in audio_and_image_samples(processor, rng):
            output = processor(**call)
            rows.append({key: value[0].tolist() if key in PER_TOKEN else value.tolist() for key, value in output.items()})
    return rows[:count]


def add_position_ids(batch, engine):
    """A batch of rows (dict of column lists) -> ``position_ids``, ``(4, L)`` per sample, from one
    padded call. Columns a text-only sample lacks hold None there."""
    samples = []
    for row in range(len(batch["input_ids"])):
        sample = {key: torch.tensor(batch[key][row]) for key in batch if batch[key][row] is not None}
        samples.append({**sample, **{key: sample[key][None] for key in PER_TOKEN}})
    input_ids, attention_mask, inputs = engine.batch(samples, padding_side="right")
    positions = engine.compute_position_ids(input_ids, attention_mask, inputs)
    return {"position_ids": [positions[row, :, : len(ids)].tolist() for row, ids in enumerate(batch["input_ids"])]}


def serial_position_ids(engine, row):
    inputs = {key: torch.tensor(value) for key, value in row.items() if key not in PER_TOKEN and value is not None}
    return engine.compute_position_ids(torch.tensor([row["input_ids"]]), torch.tensor([row["attention_mask"]]),
                                       inputs)[0]


def main(count=24):
    processor, config = build("Qwen3-Omni")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rows = processed_samples(processor, count)

    dataset = datasets.Dataset.from_list(rows)
    mapped = dataset.map(add_position_ids, batched=True, batch_size=8, num_proc=2, fn_kwargs={"engine": engine})
    pipeline = [torch.tensor(row, dtype=engine.position_dtype) for row in mapped["position_ids"]]

    serial = [serial_position_ids(engine, row) for row in rows]
    assert len(pipeline) == count and all(torch.equal(a, b) for a, b in zip(pipeline, serial))
    print(f"{count} processed samples: position ids from Dataset.map(num_proc=2) equal the serial ones")
    return pipeline, serial


if __name__ == "__main__":
    main()
