"""Ship an mmrope engine to Ray actors: each actor computes the positions of the batches it is
sent, the same as the engine in this process.

    python examples/ray_actors.py
"""

import os

# read when ray is imported: a local node on 127.0.0.1 that writes no token file and reports nothing
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import random

import ray
import torch

from mmrope_core import RopeEngine
from mmrope_qwen_vl.examples import build
from mmrope_qwen_vl.samples import random_batch


def positions(engine, batch):
    inputs = {key: value for key, value in batch.items() if key not in ("input_ids", "attention_mask")}
    return engine.compute_position_ids(batch["input_ids"], batch["attention_mask"], inputs)


@ray.remote
class PositionWorker:
    def __init__(self, engine):
        self.engine = engine  # arrives pickled: rebuilt from its processor and config with this worker's plugins

    def positions(self, batch):
        return positions(self.engine, batch)


def main(count=8):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    batches = [random_batch(processor, rng, max_batch=4, max_videos=2) for _ in range(count)]  # images, timed videos

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20)
    try:
        workers = [PositionWorker.remote(engine) for _ in range(2)]
        remote = ray.get([workers[index % 2].positions.remote(batch) for index, batch in enumerate(batches)])
    finally:
        if started:
            ray.shutdown()

    local = [positions(engine, batch) for batch in batches]
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(remote, local))
    print(f"{count} batches, {sum(p.shape[0] for p in remote)} samples: positions from 2 Ray actors "
          f"equal the engine in this process")
    return remote, local


if __name__ == "__main__":
    main()
