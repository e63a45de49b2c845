"""Padding-free training of an M-RoPE model with TRL's ``SFTTrainer``: the collator packs each
batch into one row with per-segment positions; TRL's own packing stays off.

    python examples/trl_padding_free.py    (needs trl; a tiny random Qwen2.5-VL, on CPU)
"""

import random
import tempfile

import datasets
import torch
import transformers
from trl import SFTConfig, SFTTrainer

from mmrope_core import RopeEngine
from mmrope_core.collators import PackedCollator
from mmrope_qwen_vl.examples import build, image_samples


def tiny_model(processor):
    """A random two-layer Qwen2.5-VL whose token ids are the tiny processor's (use from_pretrained)."""
    tokenizer = processor.tokenizer
    config = transformers.Qwen2_5_VLConfig(
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "vocab_size": len(tokenizer),
                     "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32},
        image_token_id=processor.image_token_id, video_token_id=processor.video_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids(tokenizer.vision_start_token))
    return transformers.Qwen2_5_VLForConditionalGeneration(config)


def main(steps=2):
    processor, _ = build("Qwen2.5-VL")  # a tiny real processor; use AutoProcessor.from_pretrained(path)
    model = tiny_model(processor)
    engine = RopeEngine.from_processor(processor, model.config)
    rng = random.Random(0)
    rows = [dict(engine.process(**call)) for _ in range(2 * steps) for call in image_samples(processor, rng)]
    dataset = datasets.Dataset.from_list(rows).with_format("torch")  # processed rows, read back as tensors

    args = SFTConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=steps, report_to=[], use_cpu=True,
        logging_steps=1, bf16=False,  # float32: TRL's default bf16 agrees with padded training to bf16 rounding only
        remove_unused_columns=False,  # keep the media columns for the collator
        dataset_kwargs={"skip_prepare_dataset": True},  # the rows are processed already
        max_length=None,  # TRL's truncation would cut placeholder runs
    )  # packing and padding_free stay False: the collator packs
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor,
                         data_collator=PackedCollator(engine))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"{steps} padding-free steps, losses {[round(loss, 4) for loss in losses]}")
    assert all(torch.isfinite(torch.tensor(losses)))
    return losses


if __name__ == "__main__":
    main()
