"""The collators on every installed family: each packed segment's positions are its sample's
alone, padded batches hold the engine's positions, labels follow the rules, bad samples are
refused by name, and the caller's samples are never changed."""

from __future__ import annotations

import random
import re

import pytest
import torch

from mmrope_core import CollateError, InvalidInputError, PackingUnsupportedError, RopeEngine, get_plugin_manager
from mmrope_core.collators import PackedCollator, PaddedCollator
from mmrope_core.segments import packed_row_support

CASES = {case.name: case for _, cases in get_plugin_manager().results("example_cases") for case in cases}
QWEN = "Qwen2.5-VL"
WITHOUT_TEXT_ONLY = ("GLM-Image",)  # an image generator: its own get_rope_index fails on text alone


def engine_and_samples(name):
    """The family's engine and its example samples as processor outputs, plus one of text alone."""
    processor, config = CASES[name].build()
    engine = RopeEngine.from_processor(processor, config)
    outputs = [dict(engine.process(**call)) for call in CASES[name].samples(processor, random.Random(0))]
    tokenizer = processor.tokenizer
    words = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("the cat sat on a mat"))
    ids = torch.tensor([words])
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if all(any(key.endswith("token_type_ids") for key in output) for output in outputs):
        text.update({key: torch.zeros_like(ids) for key in outputs[0] if key.endswith("token_type_ids")})
    return engine, outputs if name.startswith(WITHOUT_TEXT_ONLY) else [*outputs, text]


def alone(engine, sample):
    """A sample's own positions, ``(4, L)`` or ``(L,)``, from the same engine: these tests check
    the collators against the engine (the engine is checked against each model's own method in
    the plugins' tests)."""
    inputs = {key: value for key, value in sample.items()
              if key not in ("input_ids", "attention_mask", "labels") and not key.endswith("token_type_ids")}
    return engine.compute_position_ids(sample["input_ids"], sample.get("attention_mask"), inputs)[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_packed_segment_holds_its_samples_positions(name):
    engine, samples = engine_and_samples(name)
    support = packed_row_support(engine)
    if not support.exact:  # tests/models show that these models mix packed segments
        with pytest.raises(PackingUnsupportedError, match=re.escape(support.model)):
            PackedCollator(engine)
        return
    before = [{key: value.clone() for key, value in sample.items()} for sample in samples]
    batch = PackedCollator(engine)(samples)
    assert "attention_mask" not in batch and batch["use_cache"] is False
    total = sum(sample["input_ids"].shape[1] for sample in samples)
    assert batch["input_ids"].shape == batch["labels"].shape == (1, total)
    positions = batch["position_ids"]
    assert positions.shape[-2:] == (1, total) and positions.dim() == (3 if engine.rope_kind == "mrope" else 2)
    start = 0
    for sample in samples:
        segment = slice(start, start + sample["input_ids"].shape[1])
        mine = positions[:, 0, segment] if engine.rope_kind == "mrope" else positions[0, segment]
        assert torch.equal(mine, alone(engine, sample))
        assert batch["labels"][0, segment.start] == -100
        assert torch.equal(batch["labels"][0, segment][1:], sample["input_ids"][0, 1:])
        start = segment.stop
    media = engine.collate([{key: value for key, value in sample.items() if key not in ("input_ids", "attention_mask")
                             and not key.endswith("token_type_ids")} for sample in samples])
    for key, value in media.items():
        assert torch.equal(batch[key], value), key
    for sample, original in zip(samples, before):  # the caller's samples are as they were
        assert sample.keys() == original.keys() and all(torch.equal(sample[k], original[k]) for k in sample)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_holds_the_engines_positions(name, side):
    engine, samples = engine_and_samples(name)
    batch = PaddedCollator(engine, padding_side=side)(samples)
    for row, sample in enumerate(samples):
        valid = batch["attention_mask"][row].bool()
        mine = batch["position_ids"][:, row, valid] if engine.rope_kind == "mrope" else batch["position_ids"][row, valid]
        own = alone(engine, sample)
        # a model that reads only its M-RoPE rows (HunYuan-VL's four) gets them without the text row
        assert torch.equal(mine, own if engine.batch_layout.text_positions else own[1:])
        labels = batch["labels"][row, valid]
        assert torch.equal(labels[1:], sample["input_ids"][0, 1:])
        # left-padded, a pad would predict the first token, which the sample alone never does
        assert labels[0] == (-100 if side == "left" else sample["input_ids"][0, 0])
        assert (batch["labels"][row, ~valid] == -100).all()


def test_given_labels_are_kept_and_the_segments_first_token_is_cut():
    engine, samples = engine_and_samples(QWEN)
    labelled = []
    for sample in samples:
        labels = sample["input_ids"].clone()
        labels[0, : labels.shape[1] // 2] = -100  # a prompt the loss skips
        labelled.append({**sample, "labels": labels})
    padded = PaddedCollator(engine)(labelled)
    packed = PackedCollator(engine)(labelled)
    start = 0
    for row, sample in enumerate(labelled):
        length = sample["input_ids"].shape[1]
        assert torch.equal(padded["labels"][row, :length], sample["labels"][0])
        assert torch.equal(packed["labels"][0, start + 1 : start + length], sample["labels"][0, 1:])
        start += length
    # the trainers count the tokens a loss sums over: labels[..., 1:] that are not -100
    assert (padded["labels"][:, 1:] != -100).sum() == (packed["labels"][:, 1:] != -100).sum()


def test_samples_come_as_any_iterable_with_none_for_what_they_lack():
    engine, samples = engine_and_samples(QWEN)
    keys = dict.fromkeys(key for sample in samples for key in sample)
    rows = [{key: sample.get(key) for key in keys} for sample in samples]  # as a datasets row holds them
    packed = PackedCollator(engine)(row for row in rows)
    expected = PackedCollator(engine)(samples)
    assert packed.keys() == expected.keys()
    assert all(torch.equal(packed[key], value) for key, value in expected.items() if isinstance(value, torch.Tensor))
    flat = [{**sample, "input_ids": sample["input_ids"][0], "attention_mask": sample["attention_mask"][0]}
            for sample in samples]  # (L,) per sample
    assert torch.equal(PaddedCollator(engine)(flat)["position_ids"], PaddedCollator(engine)(samples)["position_ids"])


def test_flash_attention_gets_the_boundaries():
    engine, samples = engine_and_samples(QWEN)
    batch = PackedCollator(engine, flash_attn_kwargs=True)(samples)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    assert torch.equal(batch["cu_seq_lens_q"], bounds) and torch.equal(batch["cu_seq_lens_k"], bounds)
    assert batch["max_length_q"] == batch["max_length_k"] == max(lengths)


def test_omni_audio_in_video_reaches_the_positions():
    from mmrope_qwen3_omni.examples import build, one_sample

    processor, config = build("Qwen2.5-Omni")
    engine = RopeEngine.from_processor(processor, config)
    rng = random.Random(3)
    sample = one_sample(processor, config, rng)
    while not sample["use_audio_in_video"] or sample["audio_seqlens"] is None:
        sample = one_sample(processor, config, rng)
    valid = sample["attention_mask"][0].bool()
    row = {"input_ids": sample["input_ids"][:, valid], "video_grid_thw": sample["video_grid_thw"],
           "video_second_per_grid": sample["second_per_grids"]}
    frames = sample["audio_seqlens"]
    row["feature_attention_mask"] = (torch.arange(int(frames.max()))[None] < frames[:, None]).long()
    if sample["image_grid_thw"] is not None:
        row["image_grid_thw"] = sample["image_grid_thw"]
    kwargs = {"use_audio_in_video": True}
    packed = PackedCollator(engine, mm_processor_kwargs=kwargs)([row, row])
    own = engine.compute_position_ids(row["input_ids"], None, {k: v for k, v in row.items() if k != "input_ids"}, kwargs)
    length = row["input_ids"].shape[1]
    assert torch.equal(packed["position_ids"][:, 0, length:], own[0])
    with pytest.raises(InvalidInputError, match="use_audio_in_video"):
        PackedCollator(engine)([row])


def test_max_length_refuses_what_does_not_fit():
    engine, samples = engine_and_samples(QWEN)
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    assert PackedCollator(engine, max_length=sum(lengths))(samples)["input_ids"].shape == (1, sum(lengths))
    with pytest.raises(CollateError, match=f"hold {sum(lengths)} tokens, more than max_length={sum(lengths) - 1}"):
        PackedCollator(engine, max_length=sum(lengths) - 1)(samples)
    with pytest.raises(CollateError, match=f"sample 0 alone has {lengths[0]} tokens"):
        PackedCollator(engine, max_length=lengths[0] - 1)(samples)


@pytest.mark.parametrize("bad, message", [
    (lambda s: {"input_ids": s[0]["input_ids"]}, "collator takes a list of samples"),
    (lambda s: [s[0], "text"], "sample 1 is a str"),
    (lambda s: [s[0], {"pixel_values": s[0]["pixel_values"]}], "sample 1 has no input_ids"),
    (lambda s: [s[0], {"flattened_patches": s[0]["pixel_values"], "labels": s[0]["input_ids"]}],
     r"sample 1 has no input_ids \(it holds flattened_patches, labels\): its model takes no text .* transformers' own"),
    (lambda s: [s[0], {**s[1], "input_ids": s[1]["input_ids"].tolist()}], "sample 1: input_ids is a list, not a tensor"),
    (lambda s: [s[0], {**s[1], "input_ids": s[1]["input_ids"][None]}], r"sample 1: input_ids must be \(1, L\) or \(L,\)"),
    (lambda s: [s[0], {**s[1], "labels": s[1]["input_ids"][:, 1:]}], "sample 1: labels has shape"),
    (lambda s: [{**s[0], "attention_mask": s[0]["attention_mask"][:, 1:]}], "sample 0: attention_mask has shape"),
    (lambda s: [{**s[0], "mm_token_type_ids": s[0]["mm_token_type_ids"][:, 1:]}], "sample 0: mm_token_type_ids"),
    (lambda s: [{**s[0], "input_ids": s[0]["input_ids"][:, :0], "attention_mask": s[0]["attention_mask"][:, :0],
                 "mm_token_type_ids": s[0]["mm_token_type_ids"][:, :0]}], "sample 0 has no tokens"),
    (lambda s: [], "no samples"),
])
@pytest.mark.parametrize("collator", [PaddedCollator, PackedCollator])
def test_bad_samples_are_refused_by_name(collator, bad, message):
    engine, samples = engine_and_samples(QWEN)
    with pytest.raises(CollateError, match=message):
        collator(engine)(bad(samples))


@pytest.mark.parametrize("collator", [PaddedCollator, PackedCollator])
def test_ids_of_a_narrow_dtype_give_int64_labels_and_ids_without_values_are_refused(collator):
    engine, samples = engine_and_samples(QWEN)
    text = [{"input_ids": torch.tensor([[5, 6, 7]], dtype=torch.uint8)}, {"input_ids": torch.tensor([[8, 9]], dtype=torch.uint8)}]
    labels = collator(engine)(text)["labels"]
    assert labels.dtype == torch.int64 and labels.tolist()[0][1:3] == [6, 7]
    with pytest.raises(InvalidInputError, match="sample 1: input_ids is on the meta device"):
        collator(engine)([samples[0], {**samples[1], "input_ids": samples[1]["input_ids"].to("meta")}])


def test_a_padded_sample_cannot_be_packed():
    engine, samples = engine_and_samples(QWEN)
    mask = samples[0]["attention_mask"].clone()
    mask[0, -1] = 0
    with pytest.raises(CollateError, match="sample 0: attention_mask has padding"):
        PackedCollator(engine)([{**samples[0], "attention_mask": mask}])


def test_options_are_checked():
    engine, _ = engine_and_samples(QWEN)
    with pytest.raises(InvalidInputError, match="padding_side"):
        PaddedCollator(engine, padding_side="middle")
    with pytest.raises(InvalidInputError, match="max_length"):
        PackedCollator(engine, max_length=0)
    with pytest.raises(InvalidInputError, match="flash_attn_kwargs"):
        PackedCollator(engine, flash_attn_kwargs="yes")
    with pytest.raises(InvalidInputError, match="mm_processor_kwargs"):
        PackedCollator(engine, mm_processor_kwargs=["use_audio_in_video"])
    with pytest.raises(TypeError):
        PackedCollator(engine, packing=True)
    with pytest.raises(InvalidInputError, match="takes a RopeEngine, got Qwen2_5_VLProcessor"):
        PaddedCollator(engine.processor)


def test_a_collator_pickles_for_data_loader_workers():
    import pickle

    engine, samples = engine_and_samples(QWEN)
    collator = PackedCollator(engine, max_length=4096, flash_attn_kwargs=True)
    copy = pickle.loads(pickle.dumps(collator))
    assert torch.equal(copy(samples)["position_ids"], collator(samples)["position_ids"])


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_fuzzers_batch_check_finds_media_out_of_place(side):
    from mmrope_core.testing._collated import collated_problem

    def problem(batch):
        def failed(exc):  # the reference engine failing is no answer: the test fails with it
            raise exc

        return collated_problem(samples, batch, collator, engine, failed)

    engine, samples = engine_and_samples(QWEN)
    collator = PaddedCollator(engine, padding_side=side)
    batch = collator(samples)
    assert problem(batch) == ""
    rows = batch["pixel_values"].shape[0]
    swapped = {**batch, "pixel_values": batch["pixel_values"].roll(1, 0)}  # another sample's patches first
    assert "'pixel_values'" in problem(swapped)
    short = {**batch, "pixel_values": batch["pixel_values"][: rows - 1]}
    assert "'pixel_values'" in problem(short)
    missing = {key: value for key, value in batch.items() if key != "image_grid_thw"}
    assert "'image_grid_thw' of the samples is not in the batch" in problem(missing)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_fuzzers_batch_check_finds_media_padding_that_is_not_the_rules(side):
    """Mllama's unfilled image slots hold zeros, and its aspect_ratio_mask's a first tile of 1
    (as its image processor pads them): other values there are found."""
    from mmrope_core.testing._collated import collated_problem

    name = "Mllama (mllama)"
    if name not in CASES:
        pytest.skip("this transformers has no Mllama")

    def problem(batch):
        def failed(exc):
            raise exc

        return collated_problem(samples, batch, collator, engine, failed)

    engine, samples = engine_and_samples(name)
    collator = PaddedCollator(engine, padding_side=side)
    batch = collator(samples)
    assert problem(batch) == ""
    images = [sample["pixel_values"].shape[1] for sample in samples if "pixel_values" in sample]
    row = next(index for index, sample in enumerate(samples)
               if "pixel_values" in sample and sample["pixel_values"].shape[1] < max(images))
    unfilled = samples[row]["pixel_values"].shape[1]
    slots = batch["aspect_ratio_mask"].clone()
    slots[row, unfilled, 0] = 0  # an empty slot that no longer counts its one tile
    assert "'aspect_ratio_mask'" in problem({**batch, "aspect_ratio_mask": slots})
    pixels = batch["pixel_values"].clone()
    pixels[row, unfilled] = 1.0  # an empty image slot holding other than zeros
    assert "'pixel_values'" in problem({**batch, "pixel_values": pixels})
