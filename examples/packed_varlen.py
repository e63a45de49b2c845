"""Pack samples into one row, as flash-attention's varlen kernels take them: positions restart
at 0 in every segment, and transformers finds the segments where the text row (row 0) restarts.

    python examples/packed_varlen.py
"""

import itertools
import random

import torch

from mmrope_core import RopeEngine
from mmrope_qwen_vl.examples import build, image_samples

PER_TOKEN = ("input_ids", "attention_mask", "mm_token_type_ids")


def pack(engine, outputs):
    """Processor outputs, one per sample -> one ``(1, T)`` row for the model, and ``cu_seqlens``."""
    rows = [output["input_ids"][0] for output in outputs]
    cu_seqlens = torch.tensor([0, *itertools.accumulate(len(row) for row in rows)])
    inputs = engine.collate([{k: v for k, v in output.items() if k not in PER_TOKEN} for output in outputs])
    input_ids = torch.cat(rows)[None]
    position_ids = engine.compute_position_ids(input_ids, None, inputs, cu_seqlens=cu_seqlens)  # (1, 4, T)
    # the model: (4, 1, T), no attention mask (flash-attention varlen, or sdpa's packed mask), use_cache=False
    return {"input_ids": input_ids, "position_ids": position_ids.transpose(0, 1), **inputs}, cu_seqlens


def main(count=3):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    outputs = [engine.process(**call) for call in image_samples(processor, rng) * count][:count]
    packed, cu_seqlens = pack(engine, outputs)
    for index, output in enumerate(outputs):  # each segment holds what its sample gets alone
        alone = engine.compute_position_ids(output["input_ids"], output["attention_mask"],
                                            {k: v for k, v in output.items() if k not in PER_TOKEN})
        segment = packed["position_ids"][:, 0, cu_seqlens[index] : cu_seqlens[index + 1]]
        assert torch.equal(segment, alone[0])
    print(f"{count} samples packed into {tuple(packed['input_ids'].shape)}, cu_seqlens {cu_seqlens.tolist()}: "
          f"every segment's positions equal its sample's alone")
    return engine, outputs, packed, cu_seqlens


if __name__ == "__main__":
    main()
