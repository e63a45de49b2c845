"""An encoder-decoder's padded batch trains each sample as the sample alone: Florence-2, whose
processor places its image's tokens in the encoder's text and whose decoder reads the labels
(shifted right into its inputs). Padded on the right, each row's decoder logits, the loss and its
gradients equal the sample's alone; left padding is refused (its encoder's learned positions are
taken from the slots, as its own left-padded batch shows), and so are packed rows (an encoder
attends both ways over the row)."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from cases_pad_more_a import FLORENCE2_OVERRIDES, florence2, image_calls
from tiny_models import assert_loss_and_gradients

from mmrope_core import PackingUnsupportedError, PaddingUnsupportedError, RopeEngine
from mmrope_core.collators import IGNORE_INDEX, PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential
LOGITS = {"rtol": 1e-4, "atol": 5e-5}


@functools.cache
def florence2_case():
    import transformers
    from tiny_models import _enliven, _model_class, _tiny_config

    if "florence2" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model type florence2")
    processor, config = florence2()
    calls = image_calls(processor, random.Random(0), side=64)
    samples = [dict(processor(**call)) for call in calls]
    config = _tiny_config(config, processor, samples, FLORENCE2_OVERRIDES)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _model_class(config)(config).eval()
        _enliven(model)
    return processor, config, model, samples, calls


def alone(model, sample):
    """The sample's decoder logits on its own ids as labels, its summed token loss and the tokens the
    loss counts, as the model's loss function counts them (transformers 5.10's Florence-2 shifts
    the labels once more)."""
    labels = sample["input_ids"]
    out = model(**sample, labels=labels)
    logits, targets = out.logits[0].float(), labels[0]
    if not torch.allclose(out.loss, torch.nn.functional.cross_entropy(logits, targets), rtol=1e-5, atol=1e-6):
        logits, targets = logits[:-1], targets[1:]  # transformers 5.10: each token's loss on the next label
    total = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    torch.testing.assert_close(out.loss, total / targets.shape[0], rtol=1e-5, atol=1e-6)
    return out.logits[0], total, targets.shape[0]


def test_a_padded_florence2_batch_trains_as_its_samples_alone():
    processor, config, model, samples, calls = florence2_case()
    engine = RopeEngine.from_processor(processor, config)
    side = "right"
    batch = PaddedCollator(engine, padding_side=side)(samples)
    reference = processor(text=[call["text"][0] for call in calls], images=[call["images"][0] for call in calls],
                          padding=True, padding_side=side, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "pixel_values"):
        torch.testing.assert_close(batch[key], reference[key].to(batch[key].dtype), rtol=0, atol=0, msg=key)
    for row, sample in enumerate(samples):  # the decoder's targets, padded on the right
        length = sample["input_ids"].shape[1]
        assert batch["labels"][row, :length].tolist() == sample["input_ids"][0].tolist()
        assert bool((batch["labels"][row, length:] == IGNORE_INDEX).all())
    with torch.no_grad():
        logits = model(**batch).logits
        for row, sample in enumerate(samples):
            own = alone(model, sample)[0]
            torch.testing.assert_close(logits[row, :own.shape[0]], own, **LOGITS,
                                       msg=lambda m, row=row: f"sample {row}: {m}")
    model.zero_grad(set_to_none=True)
    losses = [alone(model, sample)[1:] for sample in samples]
    expected = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    assert_loss_and_gradients(model, expected, lambda: model(**batch).loss)


def test_a_packed_florence2_row_is_refused():
    processor, config, *_ = florence2_case()
    with pytest.raises(PackingUnsupportedError, match=r"florence2.*encoder-decoder"):
        PackedCollator(RopeEngine.from_processor(processor, config))


def test_left_padding_is_refused_where_florence2s_encoder_reads_the_slot():
    """Its BART encoder embeds learned positions by each token's slot (it takes no position ids):
    left padding shifts them, as the model's own left-padded batch shows."""
    processor, config, model, samples, calls = florence2_case()
    engine = RopeEngine.from_processor(processor, config)
    with pytest.raises(PaddingUnsupportedError, match="learned position embedding"):
        PaddedCollator(engine, padding_side="left")
    theirs = processor(text=[call["text"][0] for call in calls], images=[call["images"][0] for call in calls],
                       padding=True, padding_side="left", return_tensors="pt")
    with torch.no_grad():  # the shorter sample, padded on the left by its own processor
        logits = model(**theirs, labels=theirs["input_ids"]).logits[1]
        own = alone(model, samples[1])[0]
        shifted = float((logits[-own.shape[0]:] - own).abs().max())
    assert shifted > 1e-4, shifted
