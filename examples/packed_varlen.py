"""Pack samples into one padding-free row, as flash-attention's varlen kernels take them:
positions restart at 0 in every segment, and transformers finds the segments where the text row
(row 0) restarts.

    python examples/packed_varlen.py
"""

import random

import torch

from mmrope_core import RopeEngine
from mmrope_core.collators import PackedCollator
from mmrope_qwen_vl.examples import build, image_samples


def main(count=3):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    outputs = [engine.process(**call) for call in image_samples(processor, rng) * count][:count]
    collator = PackedCollator(engine, flash_attn_kwargs=True)
    packed = collator(outputs)  # one (1, T) row: position_ids (4, 1, T), labels, media, no attention_mask
    cu_seqlens = packed["cu_seq_lens_q"]
    for index, output in enumerate(outputs):  # each segment holds what its sample gets alone
        alone = engine.compute_position_ids(output["input_ids"], output["attention_mask"],
                                            {k: v for k, v in output.items() if k not in ("input_ids", "attention_mask")})
        segment = packed["position_ids"][:, 0, cu_seqlens[index] : cu_seqlens[index + 1]]
        assert torch.equal(segment, alone[0])
    print(f"{count} samples packed into {tuple(packed['input_ids'].shape)}, cu_seqlens {cu_seqlens.tolist()}: "
          f"every segment's positions equal its sample's alone")
    return engine, outputs, packed, cu_seqlens


if __name__ == "__main__":
    main()
