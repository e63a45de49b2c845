"""Sequence and context parallel: every rank builds the same packed row, its positions computed
on the whole row (each segment as its sample alone), and keeps its own cut of it, with the whole
row's boundaries for attention.

    python examples/sequence_parallel.py
"""

import random

import torch

from mmrope_core import RopeEngine
from mmrope_core.collators import PackedCollator
from mmrope_core.parallel import split_batch
from mmrope_qwen_vl.examples import build, image_samples


def main(size=2):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    outputs = [engine.process(**call) for call in image_samples(processor, random.Random(0))]
    batches = []
    for rank in range(size):  # in training, one rank per process: torch.distributed.get_rank(group)
        collator = PackedCollator(engine, split=("zigzag", size, rank))
        batch = collator(outputs)  # this rank's tokens: input_ids (1, T / size), position_ids (4, 1, T / size)
        batches.append(batch)
    # where one process builds the batch and hands it on: the padded row uncut, cut for each rank
    whole = PackedCollator(engine, split=("zigzag", size, None))(outputs)
    for rank, batch in enumerate(batches):
        part = split_batch(whole, scheme="zigzag", size=size, rank=rank)  # the collator's batch for that rank
        assert torch.equal(part["position_ids"], batch["position_ids"])
    # a rank's part ends mid-row, where a model shifting its labels itself would pair two chunks' tokens:
    # shift_labels, each token's target on the whole row, travel with it; model(**batch) hands them its loss
    for batch in batches:
        assert batch["shift_labels"].shape == batch["labels"].shape
    print(f"{len(outputs)} samples in a padded row of {whole['input_ids'].shape[1]} tokens, segments at "
          f"{whole['cu_seqlens_padded'].tolist()}: {size} ranks of {batches[0]['input_ids'].shape[1]} tokens each")
    return engine, outputs, whole, batches


if __name__ == "__main__":
    main()
