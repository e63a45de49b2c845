"""Padded against padding-free (packed) training batches of Qwen2.5-VL on CPU with sdpa: the
share of padding in the padded batches, and the real tokens per second of a forward and backward
pass over the same samples, collated by ``PaddedCollator`` and ``PackedCollator``, for two random
two-layer models: a tiny one (hidden size 64, the processor's vocabulary of 16), whose time is
mostly attention, and a wider one (hidden size 256, a vocabulary of 32768), whose time is mostly
per-token layers, as in real models. Sample lengths are drawn log-uniformly between 64 and 2048
tokens (text around one image of 16 to 64 placeholder tokens), batches of 8; each batch is timed
both ways in turn and the fastest of ``--repeat`` rounds is kept. Prints the ratios measured in
this run (about five minutes on one core).

    python benchmarks/padding_free.py [--batches 3] [--repeat 2]
"""

from __future__ import annotations

import argparse
import functools
import math
import random

import torch
import transformers

from mmrope_core.collators import PackedCollator, PaddedCollator
from mmrope_qwen_vl.examples import build
from timing import engine, environment, timed

PATCH = 3 * 2 * 14 * 14  # what one row of pixel_values holds for Qwen2.5-VL's processor


MODELS = {"tiny": {"hidden_size": 64, "intermediate_size": 128, "vocab_size": None},
          "wider": {"hidden_size": 256, "intermediate_size": 1024, "vocab_size": 32768}}


def random_model(processor, hidden_size, intermediate_size, vocab_size):
    tokenizer = processor.tokenizer
    config = transformers.Qwen2_5_VLConfig(
        text_config={"hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab_size or len(tokenizer),
                     "max_position_embeddings": 8192,
                     "rope_parameters": {"rope_type": "default", "mrope_section": [s * hidden_size // 128
                                                                                   for s in (4, 6, 6)]}},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                       "out_hidden_size": hidden_size},
        image_token_id=processor.image_token_id, video_token_id=processor.video_token_id,
        vision_start_token_id=tokenizer.convert_tokens_to_ids(tokenizer.vision_start_token))
    torch.manual_seed(0)
    return transformers.Qwen2_5_VLForConditionalGeneration(config).train()


def sample(processor, rng, length):
    """One processor output of ``length`` tokens: text, one image inside vision markers, text."""
    tokenizer = processor.tokenizer
    start, end = tokenizer.convert_tokens_to_ids([tokenizer.vision_start_token, tokenizer.vision_end_token])
    words = tokenizer.convert_tokens_to_ids(["the", "cat", "sat", "on", "a", "mat"])
    a, b = rng.randint(4, 8), rng.randint(4, 8)
    before = rng.randint(4, 32)
    row = [rng.choice(words) for _ in range(before)] + [start] + [processor.image_token_id] * a * b + [end]
    row += [rng.choice(words) for _ in range(max(1, length - len(row)))]
    ids = torch.tensor([row])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "image_grid_thw": torch.tensor([[1, 2 * a, 2 * b]]),
            "pixel_values": torch.randn(4 * a * b, PATCH)}


def step(model, batch):
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    processor, _ = build("Qwen2.5-VL")
    rng = random.Random(0)
    batches = []
    for _ in range(args.batches):
        lengths = [round(math.exp(rng.uniform(math.log(64), math.log(2048)))) for _ in range(args.batch_size)]
        batches.append([sample(processor, rng, length) for length in lengths])
    print(f"{environment()}\n")
    print(f"Qwen2.5-VL, 2 layers, sdpa, forward + backward; batches of {args.batch_size}, lengths log-uniform "
          f"in [64, 2048]")
    print(f"{'model':<8}{'batch':<7}{'tokens':>8}{'padded to':>11}{'padding':>9}{'padded tok/s':>14}"
          f"{'packed tok/s':>14}{'packed/padded':>15}")
    for name, sizes in MODELS.items():
        model = random_model(processor, **sizes)
        rope = engine(processor, model.config, "qwen_vl")
        padded, packed = PaddedCollator(rope), PackedCollator(rope)
        totals = {"tokens": 0, "slots": 0, "padded": 0.0, "packed": 0.0}
        for index, samples in enumerate(batches):
            tokens = sum(s["input_ids"].shape[1] for s in samples)
            pad_batch, pack_batch = {**padded(samples), "use_cache": False}, packed(samples)
            slots = pad_batch["input_ids"].numel()
            best = timed({"padded": functools.partial(step, model, pad_batch),
                          "packed": functools.partial(step, model, pack_batch)}, repeat=args.repeat, block=1)
            totals["tokens"] += tokens
            totals["slots"] += slots
            totals["padded"] += best["padded"]
            totals["packed"] += best["packed"]
            print(f"{name:<8}{index:<7}{tokens:>8}{pad_batch['input_ids'].shape[1]:>11}{1 - tokens / slots:>9.0%}"
                  f"{tokens / best['padded']:>14.0f}{tokens / best['packed']:>14.0f}"
                  f"{best['padded'] / best['packed']:>14.2f}x")
        print(f"{name:<8}{'all':<7}{totals['tokens']:>8}{'':>11}{1 - totals['tokens'] / totals['slots']:>9.0%}"
              f"{totals['tokens'] / totals['padded']:>14.0f}{totals['tokens'] / totals['packed']:>14.0f}"
              f"{totals['padded'] / totals['packed']:>14.2f}x")


if __name__ == "__main__":
    main()
