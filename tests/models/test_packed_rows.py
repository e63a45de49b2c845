"""A packed row trains as its samples alone, or is refused: for every example case, tiny random
models of the real model classes compare the packed row's logits, loss and gradients with each
sample run alone, the model computing its own positions; where mmrope refuses the model (when
the collator is built, or a batch past the model's limits), the same row built by hand shows
that its segments differ from their samples alone, by how much. The model types the plugins bind
without an example case run the same test, built as test_padded_batches.py builds them (its
docstring lists them, with the stand-ins used and the bound types neither module covers)."""

from __future__ import annotations

import functools
import itertools
import random

import pytest
import test_padded_batches as padded_batches
import torch
from media_samples import audio_in_video_sample, video_sample
from tiny_models import assert_loss_and_gradients, names, tiny_model

from mmrope_core import PackingUnsupportedError, RopeEngine
from mmrope_core.collators import IGNORE_INDEX, PackedCollator
from mmrope_core.segments import packed_row_support

torch.set_num_threads(1)  # two cores, shared
pytestmark = pytest.mark.differential
#: What the tests also train, beside each case's own config: settings that change the answer.
VARIANTS = {
    "Gemma4": {"bidirectional images": (("text_config.use_bidirectional_attention", "vision"),)},
    # every sample no longer than index_topk: the indexer keeps all of a sample's keys, packed or alone
    "HY-V4-VL (hy_v4_vl)": {"indexer keeps every key": (("text_config.index_topk", 64),)},
}
CASES = [(name, variant) for name in names() for variant in (None, *VARIANTS.get(name, ()))]
#: Cases given generated videos too (their processors take none without torchvision), and the
#: Omni cases given videos with their audio, which the models' own forward then takes as a keyword.
VIDEOS = ("Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL", "Qwen3-VL-MoE", "Qwen3.5", "Qwen3.5-MoE", "GLM-4V", "GLM-4V-MoE",
          "GLM-4.6V")
#: GLM's frames are image tokens: its model takes a batch's images or its videos, not both at once
VIDEOS_APART = ("GLM-4V", "GLM-4V-MoE", "GLM-4.6V")
AUDIO_IN_VIDEO = ("Qwen2.5-Omni", "Qwen3-Omni")
FORWARD_KWARGS = {name: {"use_audio_in_video": True} for name in AUDIO_IN_VIDEO}
# a packed segment's logits against its sample alone: float32 sums in another order
LOGITS = {"rtol": 1e-4, "atol": 1e-5}
# a gradient against the samples': each value within 1e-3 of itself, or within this fraction of the
# parameter's largest (float32 sums in another order put up to 1.5e-5 of it on small values, Gemma4)


@functools.cache
def case(name, variant):
    overrides = VARIANTS.get(name, {}).get(variant, ()) if variant else ()
    tiny = tiny_model(name, overrides=overrides)
    engine = RopeEngine.from_processor(tiny.processor, tiny.config)
    return tiny, engine


def rows_of(tiny):
    """The packed rows a case is tested on, as lists of samples: the case's samples with generated
    ones holding videos, and one of text alone; each unpadded, labels their ids."""
    rng, generator = random.Random(tiny.name), torch.Generator().manual_seed(0)
    if tiny.name in VIDEOS_APART:
        videos = [video_sample(tiny.processor, rng, generator, images=0) for _ in range(2)]
        return [with_text(tiny, tiny.samples), with_text(tiny, videos)]
    samples = list(tiny.samples)
    if tiny.name in VIDEOS:
        samples.insert(1, video_sample(tiny.processor, rng, generator))
    if tiny.name in AUDIO_IN_VIDEO:
        samples.insert(1, audio_in_video_sample(tiny.processor, tiny.model.config, rng, generator))
    return [with_text(tiny, samples)]


#: Models that run no sample of text alone: model type -> why.
NO_TEXT_ALONE = {"glm_image": "an image generator: its own positions fail on text alone",
                 "kosmos-2": "its forward requires pixel_values",
                 **dict.fromkeys(("instructblip", "instructblipvideo"),
                                 "its forward requires pixel_values: the Q-Former reads each row's image")}


def with_text(tiny, samples):
    rows = [{**sample, "labels": sample["input_ids"].clone()} for sample in samples]
    tokenizer = tiny.processor.tokenizer
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokenizer.tokenize("the cat sat on a mat"))])
    text = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    if tiny.config.model_type in TEXT_FROM_THE_PROCESSOR:
        text = dict(tiny.processor(text=["the cat sat on a mat"], return_tensors="pt"))
        text["labels"] = text["input_ids"].clone()
    text.update({key: torch.zeros_like(ids) for key in tiny.samples[0] if key.endswith("token_type_ids")})
    if tiny.config.model_type not in NO_TEXT_ALONE and tiny.config.model_type not in padded_batches.NEEDS_MEDIA:
        rows.append(text)
    return rows


#: Model types whose processor gives a text-only sample media its model needs (IDEFICS: an empty
#: image slot, which its forward requires).
TEXT_FROM_THE_PROCESSOR = {"idefics"}


def alone(model, sample, kwargs):
    """The sample's logits and its summed token loss, the model computing its own positions."""
    out = model(**sample, **kwargs, use_cache=False)
    labels = sample["labels"][0, 1:]
    loss = torch.nn.functional.cross_entropy(out.logits[0, :-1].float(), labels, ignore_index=IGNORE_INDEX,
                                             reduction="sum")
    return out.logits[0], loss, int((labels != IGNORE_INDEX).sum())


def by_hand(engine, samples):
    """The packed row of ``samples`` built without the collator: ids, labels and token types joined,
    the media joined as the model takes one row of them, each segment's positions its sample's
    computed alone."""
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    bounds = torch.tensor([0, *itertools.accumulate(lengths)])
    # token types, and what the layout says holds a value per token (Kosmos-2's image_embeds_position_mask)
    rules = engine.batch_layout.media
    token_aligned = ("input_ids", "labels", *(
        key for key in dict.fromkeys(key for sample in samples for key in sample) if key.endswith("token_type_ids")
        or (key in rules and rules[key].token_dim == 1 and rules[key].items_dim is None)))
    batch = {key: torch.cat([sample.get(key, torch.zeros_like(sample["input_ids"])) for sample in samples], dim=1)
             for key in token_aligned}
    batch["labels"][0, bounds[:-1]] = IGNORE_INDEX
    media = [{key: value for key, value in sample.items() if key not in (*token_aligned, "attention_mask")}
             for sample in samples]
    positions = torch.cat([engine.compute_position_ids(sample["input_ids"], None, own)
                           for sample, own in zip(samples, media)], dim=-1)
    if engine.rope_kind == "1d":  # counted from the model's first position (Kosmos-2's padding_idx + 1)
        positions = positions + engine.batch_layout.first_position
    if engine.rope_kind == "mrope":
        positions = positions.transpose(0, 1)
        rows = getattr(engine.binding.kernel, "rope_rows", 3)
        if rows != 3 and positions.shape[0] == rows + 1:  # HunYuan-VL's forward takes its xD-RoPE rows alone
            positions = positions[1:]
    join = JOINS.get(engine.config.model_type)
    joined = engine.collate(media) if join is None else join(media, lengths)
    given = {"position_ids": positions} if engine.batch_layout.takes_positions else {}  # else it counts its own
    return {**batch, **joined, **given, "use_cache": False}


def joined_strips(media, lengths):
    """MiniCPM-V's images as its processor batches them: one strip of patches, (1, 3, 14, sum W)."""
    with_images = [item for item in media if "pixel_values" in item]
    return {"pixel_values": torch.cat([item["pixel_values"] for item in with_images], dim=-1),
            "target_sizes": torch.cat([item["target_sizes"] for item in with_images])}


def joined_cross_attention(media, lengths):
    """Mllama's images in one row: all of them on the image axis, each segment's tokens masked to
    its own sample's images (a block-diagonal cross_attention_mask; a sample without images, none)."""
    with_images = [item for item in media if "pixel_values" in item]
    counts = [item["pixel_values"].shape[1] if "pixel_values" in item else 0 for item in media]
    mask = torch.zeros(1, sum(lengths), sum(counts), with_images[0]["cross_attention_mask"].shape[-1], dtype=torch.long)
    for item, start, first, count in zip(media, itertools.accumulate([0, *lengths]), itertools.accumulate([0, *counts]),
                                         counts):
        if count:
            block = item["cross_attention_mask"]
            mask[:, start:start + block.shape[1], first:first + count] = block
    return {"pixel_values": torch.cat([item["pixel_values"] for item in with_images], dim=1),
            "aspect_ratio_ids": torch.cat([item["aspect_ratio_ids"] for item in with_images], dim=1),
            "aspect_ratio_mask": torch.cat([item["aspect_ratio_mask"] for item in with_images], dim=1),
            "cross_attention_mask": mask}


def joined_image_attention(media, lengths):
    """IDEFICS's images in one row: all of them on the image axis, each segment's tokens masked to
    its own sample's images (a block-diagonal image_attention_mask); a text sample's empty slot left out."""
    counts = [int(item["image_attention_mask"].any(dim=1).sum()) for item in media]
    mask = torch.zeros(1, sum(lengths), max(1, sum(counts)), dtype=media[0]["image_attention_mask"].dtype)
    for item, start, first, count in zip(media, itertools.accumulate([0, *lengths]), itertools.accumulate([0, *counts]),
                                         counts):
        block = item["image_attention_mask"][:, :, :count]
        mask[:, start:start + block.shape[1], first:first + count] = block
    return {"pixel_values": torch.cat([item["pixel_values"][:, :count] for item, count in zip(media, counts)], dim=1),
            "image_attention_mask": mask}


def one_image_a_row(media, lengths):
    """BLIP's image as its model takes it, one a row (its text decoder attends to it): the first
    sample's, the only one a packed row can hold."""
    return dict(media[0])


#: How a refusal names media handed to a batch's rows one by one (GLM-Image on transformers 5.10).
MEDIA_BY_ROWS = "hands the media to the batch's rows one by one"
#: Media of a packed row joined by hand where the engine's batch of them is not the model's one row.
JOINS = {"minicpmv4_7": joined_strips, "mllama": joined_cross_attention, "blip": one_image_a_row,
         "idefics": joined_image_attention}


def segments_of(logits, samples):
    start = 0
    for sample in samples:
        yield logits[start:start + sample["input_ids"].shape[1]]
        start += sample["input_ids"].shape[1]


@pytest.mark.parametrize("name, variant", CASES, ids=[f"{n}-{v}" if v else n for n, v in CASES])
def test_a_packed_row_trains_as_its_samples_alone_or_is_refused(name, variant):
    tiny, engine = case(name, variant)
    for samples in rows_of(tiny):
        trains_as_its_samples_alone_or_is_refused(tiny, engine, samples)


#: The model types the plugins bind without an example case, built as the padded-batch tests
#: build them (see that module's docstring for the bound types neither module covers).
EXTRA = list(padded_batches.EXTRA)


@pytest.mark.parametrize("name", EXTRA)
def test_a_packed_row_of_a_model_without_an_example_case_trains_as_its_samples_alone_or_is_refused(name):
    tiny, engine = padded_batches.case(name)
    trains_as_its_samples_alone_or_is_refused(tiny, engine, with_text(tiny, tiny.samples))


def trains_as_its_samples_alone_or_is_refused(tiny, engine, samples):
    model = tiny.model
    kwargs = FORWARD_KWARGS.get(tiny.name, {})
    support = packed_row_support(engine)
    with torch.no_grad():
        own = [alone(model, sample, kwargs)[0] for sample in samples]
    if not support.exact:
        with pytest.raises(PackingUnsupportedError, match=engine.config.model_type):
            PackedCollator(engine)
        differs_by_hand(tiny, engine, samples, kwargs, own, support.mixes)
        return
    lengths = [sample["input_ids"].shape[1] for sample in samples]
    past = support.max_sample_tokens is not None and max(lengths) > support.max_sample_tokens
    past = past or (support.max_tokens is not None and sum(lengths) > support.max_tokens)
    if past:  # past the model's limits: refused per batch
        with pytest.raises(PackingUnsupportedError, match=r"more than|longer than"):
            PackedCollator(engine)(samples)
        differs_by_hand(tiny, engine, samples, kwargs, own, support.sample_limit or support.limit)
        return
    for flash in (False, True):
        batch = PackedCollator(engine, flash_attn_kwargs=flash, mm_processor_kwargs=kwargs or None)(samples)
        with torch.no_grad():
            logits = model(**batch, **kwargs).logits[0]
        for index, (mine, theirs) in enumerate(zip(segments_of(logits, samples), own)):
            torch.testing.assert_close(mine, theirs, **LOGITS, msg=lambda m, index=index: f"sample {index}: {m}")
    # the loss and its gradients: the samples' summed token losses over their token count
    model.zero_grad(set_to_none=True)
    losses = [alone(model, sample, kwargs)[1:] for sample in samples]
    expected = sum(loss for loss, _ in losses) / sum(count for _, count in losses)
    assert_loss_and_gradients(model, expected, lambda: model(**PackedCollator(engine, mm_processor_kwargs=kwargs or None)(samples), **kwargs).loss)


def differs_by_hand(tiny, engine, samples, kwargs, own, why):
    """The refusal is right: the row built by hand trains some segment other than its sample alone.
    Anything failing on the way fails the test, but for a model refused because its forward hands
    the media to the batch's rows one by one, which may fail on the later samples' media."""
    batch = by_hand(engine, samples)
    try:
        with torch.no_grad():
            logits = tiny.model(**batch, **kwargs).logits[0]
    except RuntimeError as exc:
        if MEDIA_BY_ROWS not in why:
            raise
        print(f"{tiny.name}: refused, the model fails on the row built by hand ({exc})")
        return
    differences = [float((mine - theirs).abs().max()) for mine, theirs in zip(segments_of(logits, samples), own)]
    assert not all(torch.allclose(mine, theirs, **LOGITS) for mine, theirs in zip(segments_of(logits, samples), own)), \
        f"refused ({why}), yet every segment equals its sample alone: largest differences {differences}"
    print(f"{tiny.name}: refused, segments differ by up to {differences}")
