"""UDOP cannot train a padded batch as its samples alone, on either side: its encoder appends the
image patches after the whole padded row, so the relative position bias between a shorter sample's
text and its patches grows with the padding. Its processor's own padded batch, through a tiny
random model, shows it; the collators refuse both sides, and packed rows (the model places each
row's image itself)."""

from __future__ import annotations

import random

import pytest
import torch
from cases_pad_more_b import udop, udop_calls
from test_padded_batches import SIDES, tiny_of

from mmrope_core import PackingUnsupportedError, PaddingUnsupportedError, RopeEngine
from mmrope_core.collators import PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential


@pytest.mark.parametrize("side", SIDES)
def test_udop_padding_is_refused_where_its_own_padded_batch_changes_a_sample(side):
    processor, _ = udop()
    tokenizer = processor.tokenizer
    config, model = tiny_of("udop", **{"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id,
                                       "decoder_start_token_id": tokenizer.pad_token_id,
                                       "eos_token_id": tokenizer.eos_token_id, "image_size": 28, "patch_size": 14})
    engine = RopeEngine.from_processor(processor, config)
    with pytest.raises(PaddingUnsupportedError, match=r"udop .* appends the image patches after the whole padded"):
        PaddedCollator(engine, padding_side=side)
    with pytest.raises(PackingUnsupportedError, match="udop"):
        PackedCollator(engine)
    calls = udop_calls(processor, random.Random(0))
    samples = [dict(processor(**call)) for call in calls]
    batch = dict(processor(images=[call["images"][0] for call in calls], text=[call["text"][0] for call in calls],
                           boxes=[call["boxes"][0] for call in calls], padding=True, padding_side=side,
                           return_tensors="pt"))
    labels = torch.nn.utils.rnn.pad_sequence([sample["input_ids"][0] for sample in samples], batch_first=True,
                                             padding_value=-100)
    with torch.no_grad():
        logits = model(**batch, labels=labels).logits
        differences = []
        for row, sample in enumerate(samples):
            own = model(**sample, labels=sample["input_ids"]).logits[0]
            differences.append(float((logits[row, :own.shape[0]] - own).abs().max()))
    assert differences[0] < 1e-5 and differences[1] > 1e-3, differences  # the longer sample is not padded
