"""What a trainer of its own writes instead of verl's per-sample position code: prompts (one
processor call each) and the sampled responses in, the update step's model inputs out.

    python examples/own_trainer.py
"""

import random

import torch
import torch.nn.functional as F

from mmrope_core import RopeEngine
from mmrope_core.tiny import filler_text
from mmrope_qwen_vl.examples import build, image_samples


def model_inputs(engine, prompts, responses):
    """``prompts``: processor keyword arguments per sample; ``responses``: their sampled token ids."""
    outputs = [engine.process(**prompt) for prompt in prompts]  # Gemma4's relaxed check included
    for output, response in zip(outputs, responses):  # each response follows its prompt
        output["input_ids"] = torch.cat([output["input_ids"], response[None]], dim=1)
        output["attention_mask"] = torch.ones_like(output["input_ids"])
        if "mm_token_type_ids" in output:  # one type per token: the response is text
            output["mm_token_type_ids"] = F.pad(output["mm_token_type_ids"], (0, len(response)))
    input_ids, attention_mask, inputs = engine.batch(outputs, padding_side="right")
    position_ids = engine.compute_position_ids(input_ids, attention_mask, inputs)  # (B, 4, L) or (B, L)
    if engine.rope_kind == "mrope":
        position_ids = position_ids.transpose(0, 1)  # the model takes (4, B, L)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, **inputs}


def main():
    processor, config = build("Qwen2.5-VL")  # a tiny real processor; use RopeEngine.from_pretrained(path)
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(0)
    prompts = image_samples(processor, rng)
    responses = [processor.tokenizer(filler_text(rng, rng.randint(2, 9)), return_tensors="pt")["input_ids"][0]
                 for _ in prompts]
    batch = model_inputs(engine, prompts, responses)
    print({key: tuple(value.shape) for key, value in batch.items()})
    return engine, prompts, responses, batch


if __name__ == "__main__":
    main()
