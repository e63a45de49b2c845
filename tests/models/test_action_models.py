"""A vision-language-action model trains each padded sample as alone: PI0 predicts a chunk of
action velocities from a robot state and camera images, through an action expert attending to
the prompt's cache, and trains them against the sample's actions (no token logits). A
``PaddedCollator`` batch, padded on either side, equals the processor's own batched call, and
each row's velocities, the loss and its gradients equal each sample run alone (the same noise
and timestep), the model computing its own positions.

Its processor is built as cases_pad_stand_b.py builds it (its image processor is torchvision-only).
``PackedCollator`` refuses it: a row holds one state and one chunk of actions.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from tiny_models import assert_loss_and_gradients

from mmrope_core import PackingUnsupportedError, RopeEngine
from mmrope_core.collators import PackedCollator, PaddedCollator

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential
SIDES = ("right", "left")
LOGITS = {"rtol": 1e-4, "atol": 5e-5}


@functools.cache
def case():
    import transformers
    from cases_pad_stand_b import pi0
    from tiny_models import _enliven, _model_class, _tiny_config

    from mmrope_core.tiny import filler_text, random_image

    if "pi0" not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no model type pi0")
    processor, config = pi0()
    rng = random.Random(0)
    calls = [{"images": [[random_image(rng, 28, 28) for _ in range(cameras)]], "text": [filler_text(rng, words)],
              "state": [[rng.uniform(-1, 1) for _ in range(4)]],
              "actions": [[[rng.uniform(-1, 1) for _ in range(4)] for _ in range(4)]]}
             for cameras, words in ((1, 5), (2, 2))]
    samples = [dict(processor(**call, padding="longest")) for call in calls]
    tiny = _tiny_config(config, processor, samples, ())
    tiny._attn_implementation = "sdpa"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _model_class(tiny)(tiny).eval()
        _enliven(model)
    return processor, tiny, model, calls, samples, RopeEngine.from_processor(processor, tiny)


def forward(model, batch, noise, timestep):
    inputs = {key: value for key, value in batch.items() if key != "labels"}  # its labels are the actions
    return model(**inputs, noise=noise, timestep=timestep)


@pytest.mark.parametrize("side", SIDES)
def test_a_padded_pi0_batch_trains_as_its_samples_alone(side):
    processor, config, model, calls, samples, engine = case()
    batch = PaddedCollator(engine, padding_side=side)(samples)
    reference = dict(processor(images=[call["images"][0] for call in calls],
                               text=[call["text"][0] for call in calls],
                               state=[call["state"][0] for call in calls],
                               actions=[call["actions"][0] for call in calls], padding="longest", padding_side=side))
    for key, value in reference.items():
        torch.testing.assert_close(batch[key], value.to(batch[key].dtype), rtol=0, atol=0,
                                   msg=lambda m, key=key: f"{key}: {m}")
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(len(samples), config.chunk_size, config.max_action_dim, generator=generator)
    timestep = torch.rand(len(samples), generator=generator)
    with torch.no_grad():
        velocities = forward(model, batch, noise, timestep).logits
        for row, sample in enumerate(samples):
            own = forward(model, sample, noise[row:row + 1], timestep[row:row + 1]).logits[0]
            torch.testing.assert_close(velocities[row], own, **LOGITS, msg=lambda m, row=row: f"sample {row}: {m}")
    # the loss (a mean over equally many action values per sample) and its gradients
    model.zero_grad(set_to_none=True)
    losses = [forward(model, sample, noise[row:row + 1], timestep[row:row + 1]).loss
              for row, sample in enumerate(samples)]
    assert_loss_and_gradients(model, sum(losses) / len(losses), lambda: forward(model, batch, noise, timestep).loss)


def test_a_packed_pi0_row_is_refused_for_its_one_state_and_action_chunk_a_row():
    engine = case()[-1]
    with pytest.raises(PackingUnsupportedError, match=r"pi0 .* one robot state and one chunk of actions"):
        PackedCollator(engine)
