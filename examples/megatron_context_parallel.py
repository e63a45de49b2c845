"""Megatron-core's THD context parallel with M-RoPE positions: a packed row in Megatron's naming,
cut for each rank by mmrope's replacement of ``get_thd_batch_on_this_cp_rank`` (positions on
their last dim; Transformer Engine's partition computed in torch, so this runs without a GPU).

    python examples/megatron_context_parallel.py
"""

import random

import torch

from mmrope_core import RopeEngine
from mmrope_core.collators import PackedCollator
from mmrope_core.integrations.megatron import get_thd_batch_on_this_cp_rank
from mmrope_qwen_vl.examples import build, image_samples


def megatron_batch(engine, outputs, cp_size):
    """One packed row in Megatron's naming, each segment padded to a multiple of 2 * cp_size."""
    whole = PackedCollator(engine, split=("zigzag", cp_size, None))(outputs)  # padded, not cut
    lengths = torch.tensor([output["input_ids"].shape[1] for output in outputs])
    # Megatron's labels are the next token's (its loss does not shift them): the collator's shift_labels,
    # -100 at each segment's last token and on padding, so no segment learns the next one's first token
    labels = whole["shift_labels"]
    batch = {"tokens": whole["input_ids"], "labels": labels, "position_ids": whole["position_ids"],
             "loss_mask": (labels != -100).float()}
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).int()  # the real samples
    cu_seqlens_padded = whole["cu_seqlens_padded"]  # the padded layout, which decides the cut
    max_seqlen = cu_seqlens_padded.diff().max().reshape(1)
    return batch, cu_seqlens, cu_seqlens_padded, max_seqlen


def main(cp_size=2):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    outputs = [engine.process(**call) for call in image_samples(processor, random.Random(0))]
    batch, cu_seqlens, cu_seqlens_padded, max_seqlen = megatron_batch(engine, outputs, cp_size)
    parts = []
    for cp_rank in range(cp_size):  # in training: one rank per process, the size and rank from parallel_state
        part, packed_seq_params = get_thd_batch_on_this_cp_rank(batch, cu_seqlens, cu_seqlens_padded, max_seqlen,
                                                                cp_size=cp_size, cp_rank=cp_rank)
        collated = PackedCollator(engine, split=("zigzag", cp_size, cp_rank))(outputs)  # the same cut
        assert torch.equal(part["position_ids"], collated["position_ids"])
        assert torch.equal(part["labels"], collated["shift_labels"])  # Megatron's labels: the next token's
        parts.append(part)
    print(f"{len(outputs)} samples in a THD row of {batch['tokens'].shape[1]} tokens, {cp_size} ranks: tokens "
          f"{tuple(parts[0]['tokens'].shape)}, position_ids {tuple(parts[0]['position_ids'].shape)} on each")
    return engine, outputs, batch, parts, packed_seq_params


if __name__ == "__main__":
    main()
