"""A data collator for transformers' ``Trainer`` or TRL's ``SFTTrainer`` (``data_collator=``):
one processor output per sample in, a padded batch with position ids in the layout the model
takes out.

    python examples/data_collator.py
"""

import random

from mmrope_core import RopeEngine
from mmrope_core.collators import PaddedCollator
from mmrope_qwen_vl.examples import build, image_samples


def main(count=4):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    features = [engine.process(**call) for _ in range(count // 2) for call in image_samples(processor, rng)]
    collator = PaddedCollator(engine, padding_side="right")
    batch = collator(features)  # input_ids, attention_mask, position_ids (4, B, L), labels, the media
    print({key: tuple(value.shape) for key, value in batch.items()})
    return engine, features, batch


if __name__ == "__main__":
    main()
