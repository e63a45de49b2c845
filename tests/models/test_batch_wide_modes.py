"""A model that switches how it takes one sample's media by what the rest of the batch holds: the
collators refuse the batch, and the model's own batch (its processor's) shows the sample trained
otherwise than alone, by how much.

Phi-4-multimodal projects audio with its vision-speech projection once the batch holds images,
and with its speech projection otherwise: a sample with audio alone gets other logits beside a
sample with an image.
"""

from __future__ import annotations

import pytest
import test_padded_batches as padded_batches
import torch

from mmrope_core import CollateError, PackingUnsupportedError
from mmrope_core.collators import PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential
PHI4 = [name for name in padded_batches.EXTRA if name.endswith("(phi4_multimodal)")]


@pytest.mark.parametrize("name", PHI4)
def test_audio_beside_images_is_refused_where_the_batch_switches_its_projection(name):
    import numpy as np

    tiny, engine = padded_batches.case(name)
    processor = tiny.processor
    clip = np.sin(np.arange(16000) / 17.0).astype(np.float32)
    call = {"text": [f"the cat {processor.audio_token} sat"], "audio": [clip], "sampling_rate": 16000,
            "return_tensors": "pt"}
    image_call = padded_batches.calls_of(tiny)[0]
    samples = [dict(processor(**image_call)), dict(processor(**call))]
    for side in padded_batches.SIDES:
        with pytest.raises(CollateError, match=r"sample 1 holds 'audio_input_features' without 'image_pixel_values'"):
            PaddedCollator(engine, padding_side=side)(samples)
    try:
        collator = PackedCollator(engine)
    except PackingUnsupportedError:
        collator = None  # refused for its layers: no packed row to check
    if collator is not None:
        with pytest.raises(CollateError, match="apart from samples with image_pixel_values"):
            collator([{**sample, "labels": sample["input_ids"]} for sample in samples])
    # the processor's own batch: the audio sample's logits differ from its own
    batch = dict(processor(text=[*image_call["text"], *call["text"]], images=image_call["images"],
                           audio=call["audio"], sampling_rate=16000, padding=True, padding_side="right",
                           return_tensors="pt"))
    with torch.no_grad():
        logits = tiny.model(**batch, use_cache=False).logits
        own = tiny.model(**samples[1], use_cache=False).logits[0]
    mine = logits[1][batch["attention_mask"][1].bool()]
    difference = float((mine - own).abs().max())
    assert difference > 1e-3, f"the batch changed the audio sample's logits by only {difference}"
    print(f"{name}: an audio sample beside an image differs by {difference} from alone")
