"""A data collator for transformers' ``Trainer`` or TRL's ``SFTTrainer`` (``data_collator=``):
one processor output per sample in, a padded batch with position ids in the layout the model
takes out.

    python examples/data_collator.py
"""

import random

from mmrope_core import RopeEngine
from mmrope_qwen_vl.examples import build, image_samples


class MropeCollator:
    def __init__(self, engine, padding_side="right"):
        self.engine, self.padding_side = engine, padding_side

    def __call__(self, features):
        """``features``: processor outputs, ``input_ids`` ``(1, L)`` each, with their media."""
        input_ids, attention_mask, inputs = self.engine.batch(features, padding_side=self.padding_side)
        position_ids = self.engine.compute_position_ids(input_ids, attention_mask, inputs)
        if self.engine.rope_kind == "mrope":
            position_ids = position_ids.transpose(0, 1)  # (B, 4, L) -> (4, B, L): row 0 is the text row
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                "labels": labels, **inputs}


def main(count=4):
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    features = [engine.process(**call) for _ in range(count // 2) for call in image_samples(processor, rng)]
    batch = MropeCollator(engine)(features)
    print({key: tuple(value.shape) for key, value in batch.items()})
    return engine, features, batch


if __name__ == "__main__":
    main()
