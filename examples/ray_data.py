"""Add position ids to a dataset of processed samples with a Ray Data pipeline; equal to
computing them one sample at a time in this process.

    python examples/ray_data.py
"""

import os

# read when ray is imported: a local node on 127.0.0.1 that writes no token file and reports nothing
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import random

import numpy as np
import ray
import torch

from mmrope_core import RopeEngine
from mmrope_qwen_vl.examples import build, image_samples


def processed_samples(processor, count, seed=0):
    """One processor call per sample, stored without the batch dimension of the ids."""
    rng, rows = random.Random(seed), []
    while len(rows) < count:
        for call in image_samples(processor, rng):
            output = processor(**call)
            rows.append({key: value[0].numpy() if key in ("input_ids", "attention_mask", "mm_token_type_ids")
                         else value.numpy() for key, value in output.items()})
    return rows[:count]


def add_position_ids(batch, engine):
    """A Ray Data batch (dict of columns) -> the same columns and ``position_ids``, ``(4, L)`` per
    sample: the batch is padded, computed in one call and cut back to each sample's length."""
    samples = [{key: torch.as_tensor(np.asarray(batch[key][row]))[None] if key in ("input_ids", "attention_mask")
                else torch.as_tensor(np.asarray(batch[key][row])) for key in batch}
               for row in range(len(batch["input_ids"]))]
    input_ids, attention_mask, inputs = engine.batch(samples, padding_side="right")
    positions = engine.compute_position_ids(input_ids, attention_mask, inputs)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    return {**batch, "position_ids": [positions[row, :, :length].numpy() for row, length in enumerate(lengths)]}


def serial_position_ids(engine, row):
    inputs = {key: torch.as_tensor(value) for key, value in row.items() if key not in ("input_ids", "attention_mask")}
    ids, mask = torch.as_tensor(row["input_ids"])[None], torch.as_tensor(row["attention_mask"])[None]
    return engine.compute_position_ids(ids, mask, inputs)[0].numpy()


def main(count=24):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rows = processed_samples(processor, count)

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20)
    try:
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        dataset = ray.data.from_items(rows).map_batches(add_position_ids, fn_kwargs={"engine": engine},
                                                         batch_size=8, batch_format="numpy")
        pipeline = [row["position_ids"] for row in dataset.take_all()]
    finally:
        if started:
            ray.shutdown()

    serial = [serial_position_ids(engine, row) for row in rows]
    assert len(pipeline) == count and all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(pipeline, serial))
    print(f"{count} processed samples: position ids from the Ray Data pipeline equal the serial ones")
    return pipeline, serial


if __name__ == "__main__":
    main()
