"""Megatron-Bridge's Qwen3-VL and Qwen2.5-VL models taking every M-RoPE position from mmrope, each
segment of a packed row as its sample alone. Call it in your training script before
Megatron-Bridge builds the model (its recipes and training loop unchanged); Megatron-Bridge needs
Transformer Engine, that is a GPU machine.

    python examples/megatron_bridge_qwen_vl.py HF_CHECKPOINT
"""

import sys

from mmrope_core import RopeEngine
from mmrope_core.integrations import megatron_bridge as mmrope_megatron_bridge


def main(hf_checkpoint):
    engine = RopeEngine.from_pretrained(hf_checkpoint)  # the checkpoint the Megatron model is converted from
    mmrope_megatron_bridge.install(engine)  # before Megatron-Bridge builds the model
    print(f"Megatron-Bridge's Qwen3-VL and Qwen2.5-VL positions now come from {engine}")
    return engine


if __name__ == "__main__":
    main(sys.argv[1])
