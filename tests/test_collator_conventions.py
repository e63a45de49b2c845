"""The collators on a rollout engine's positions: ``convention=`` (refused when built where the
family lacks it) and each sample's ``generated_mask``, which reaches the positions and stays out
of the batch."""

from __future__ import annotations

import pytest
import torch

from mmrope_core import CollateError, RopeEngine, UnknownConventionError
from mmrope_core.collators import PackedCollator, PaddedCollator


def omni(name="Qwen3-Omni"):
    from mmrope_qwen3_omni.examples import build

    processor, config = build(name)
    return RopeEngine.from_processor(processor, config)


def rollout(engine, replies=(5, 3)):
    """One processor output: text, a video of 4 frames of 48 tokens 0.5 s apart, text, then
    replies with a tool's text between them; its ``generated_mask`` marks the replies."""
    tokenizer = engine.processor.tokenizer
    word, other = tokenizer.convert_tokens_to_ids(["the", "cat"])
    token = tokenizer.convert_tokens_to_ids
    video = [token(engine.processor.vision_bos_token), *[token(engine.processor.video_token)] * 192,
             token(engine.processor.vision_eos_token)]
    ids, generated = [word] * 3 + video + [word] * 3, [0] * (len(video) + 6)
    for index, count in enumerate(replies):
        ids, generated = ids + [other] * count, generated + [1] * count
        if index + 1 < len(replies):
            ids, generated = ids + [word] * 3, generated + [0] * 3
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "video_grid_thw": torch.tensor([[4, 16, 12]]), "video_second_per_grid": [0.5],
            "generated_mask": torch.tensor([generated])}


def alone(engine, sample, generated=True):
    inputs = {key: sample[key] for key in ("video_grid_thw", "video_second_per_grid")}
    return engine.compute_position_ids(sample["input_ids"], None, inputs,
                                       generated_mask=sample["generated_mask"] if generated else None)[0]


@pytest.mark.parametrize("collator", [PaddedCollator, PackedCollator])
def test_the_collators_give_each_sample_its_rollouts_positions(collator):
    engine = omni()
    sglang = engine.with_convention("sglang")
    samples = [rollout(engine), rollout(engine, (2, 6, 4)), rollout(engine, (7,))]
    samples[2]["generated_mask"] = samples[2]["generated_mask"].bool()
    del samples[1]["generated_mask"]  # a sample without one: nothing generated
    before = [{key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in s.items()}
              for s in samples]
    batch = collator(engine, convention="sglang")(samples)
    assert "generated_mask" not in batch and batch["position_ids"].dtype == torch.int64
    start = 0
    for index, (sample, kept) in enumerate(zip(samples, before)):
        length = sample["input_ids"].shape[1]
        if collator is PackedCollator:
            mine = batch["position_ids"][:, 0, start:start + length]
            start += length
        else:
            mine = batch["position_ids"][:, index, :length]
        has_mask = "generated_mask" in kept
        want = alone(sglang, kept, generated=has_mask)
        assert torch.equal(mine[1:], want[1:]), index
        if has_mask:  # the replies sit one position past where a prefill puts them
            assert not torch.equal(want, alone(sglang, kept, generated=False))
        assert all(torch.equal(value, sample[key]) if isinstance(value, torch.Tensor) else value == sample[key]
                   for key, value in kept.items()), "the caller's sample changed"


def test_a_convention_the_family_lacks_is_refused_when_the_collator_is_built():
    older = omni("Qwen2.5-Omni")
    for collator in (PaddedCollator, PackedCollator):
        with pytest.raises(UnknownConventionError, match=r"SGLang 0\.5\.23 has no Qwen2\.5-Omni model"):
            collator(older, convention="sglang")
        with pytest.raises(UnknownConventionError, match="'vllm-9' is unknown"):
            collator(older, convention="vllm-9")
    assert PaddedCollator(older, convention="vllm").engine.convention == "vllm-0.34"


def test_a_generated_mask_that_is_not_one_value_per_token_is_refused_by_sample():
    engine = omni()
    samples = [rollout(engine), rollout(engine)]
    samples[1]["generated_mask"] = samples[1]["generated_mask"][:, :-1]
    with pytest.raises(CollateError, match=r"sample 1: generated_mask has shape \(1, \d+\), input_ids"):
        PaddedCollator(engine, convention="sglang")(samples)
