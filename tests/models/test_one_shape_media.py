"""Media whose padding the model reads are batched only at one shape: Granite Speech's encoder
attends over every frame of the batch's longest clip (no mask reaches it), so both collators
refuse clips of different lengths in one batch, and the processor's own batch shows why: its
shorter clip trains otherwise than alone."""

from __future__ import annotations

import random

import pytest
import test_padded_batches as padded_batches
import torch
from cases_pad_odd import same_length_clips

from mmrope_core import CollateError
from mmrope_core.collators import PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential
NAMES = [name for name in padded_batches.EXTRA if name.startswith("Granite Speech")]


@pytest.mark.parametrize("name", NAMES)
def test_clips_of_different_lengths_are_refused_as_the_encoder_reads_the_padding(name):
    tiny, engine = padded_batches.case(name)
    calls = same_length_clips(tiny.processor, random.Random(0), seconds=(1, 2))
    samples = [dict(tiny.processor(**call)) for call in calls]
    for collator in (PaddedCollator(engine), PackedCollator(engine)):
        with pytest.raises(CollateError, match=r"samples 0 and 1 hold 'input_features' of shapes .* reads every frame"):
            collator([{**sample, "labels": sample["input_ids"]} for sample in samples])
    # the model's own batch: the shorter clip's features read its padding
    reference = padded_batches.processor_batch(tiny, calls, "right")
    mask = reference["attention_mask"].bool()
    with torch.no_grad():
        logits = tiny.model(**reference).logits
        own = tiny.model(**samples[0]).logits[0]
    difference = float((logits[0][mask[0]] - own).abs().max())
    assert difference > 1e-4, difference
