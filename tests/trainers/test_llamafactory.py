"""LLaMA-Factory 0.9.5's own SFT collator, with and without mmrope's drop-in, against the model
classes' own ``get_rope_index`` on generated samples of every family it trains: padded batches,
``neat_packing`` rows, audio in video, text-only batches (its fake image), bf16 compute."""

from __future__ import annotations

import copy
import random
import warnings

import llamafactory_cases as cases
import pytest
import torch

collator_module = cases.import_llamafactory()

from mmrope_core.errors import PackingUnsupportedError, PlaceholderMismatchError  # noqa: E402
from mmrope_core.integrations import llamafactory as drop_in  # noqa: E402

GLM = ("GLM-4V", "GLM-4.5V")
VIDEO_FAMILIES = [name for name in cases.FAMILIES if name not in GLM]


@pytest.fixture
def installed():
    """The drop-in installed for one test, LLaMA-Factory's own ``__call__`` given back after."""
    with cases.drop_in_installed():
        yield


def padded_batches(name, seed, count=3, **kwargs):
    rng = random.Random(seed)
    return [cases.features(name, rng, rng.randint(1, 4), **kwargs) for _ in range(count)]


def expected(name, batch, features, **kwargs):
    return cases.reference_positions(name, batch["input_ids"], batch["attention_mask"],
                                     cases.media_of(batch, features), **kwargs)


def packed_segments(batch, groups):
    """``(sample, its ids (1, L), its media, its positions in the batch)`` for every sample of
    the packed rows, in order."""
    flat = [sample for group in groups for sample in group]
    media = cases.media_of(batch, flat)
    index = 0
    for row, group in enumerate(groups):
        start = 0
        for sample in group:
            ids = torch.tensor([sample["input_ids"]])
            yield sample, ids, cases.segment_media(media, flat, index), \
                batch["position_ids"][:, row:row + 1, start:start + ids.shape[1]]
            start += ids.shape[1]
            index += 1


def assert_packed_positions(name, batch, groups, **kwargs):
    """Every packed sample's positions equal the reference on that sample alone: the text row
    restarting at 0, the model's own ``(t, h, w)`` (its video timing and audio included)."""
    for _, ids, media, got in packed_segments(batch, groups):
        reference = cases.reference_positions(name, ids, torch.ones_like(ids), media, **kwargs)
        assert got.dtype == reference.dtype
        assert torch.equal(got, reference), name


def packed_groups(name, seed, rows=2, **kwargs):
    rng = random.Random(seed)
    groups = [cases.features(name, rng, rng.randint(1, 3), **kwargs) for _ in range(rows)]
    cutoff = max(sum(len(sample["input_ids"]) for sample in group) for group in groups) + rng.randint(0, 9)
    cutoff += -(cutoff + 1) % 8  # LLaMA-Factory packs to cutoff_len + 1, a multiple of 8
    return groups, cases.packed(groups, cutoff)


# -- padded batches -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", cases.FAMILIES)
def test_padded_batches_equal_the_reference(name, installed):
    for features in padded_batches(name, seed=sum(map(ord, name))):
        batch = cases.collate(cases.collator(name), features)
        assert torch.equal(batch["position_ids"], expected(name, batch, features))


@pytest.mark.parametrize("name", VIDEO_FAMILIES)
def test_llamafactory_alone_places_padded_batches_but_copies_the_temporal_row(name):
    """The positive control: LLaMA-Factory's own positions, from the model's ``get_rope_index``,
    equal the reference's ``(t, h, w)``; its row 0 is the temporal row, not a text counter."""
    differs = False
    for features in padded_batches(name, seed=7):
        batch = cases.collate(cases.collator(name), features)
        reference = expected(name, batch, features)
        assert torch.equal(batch["position_ids"][1:], reference[1:])
        differs |= not torch.equal(batch["position_ids"][0], reference[0])
    assert differs


@pytest.mark.parametrize("name", GLM)
def test_glm_videos_crash_llamafactory_alone_and_are_placed_with_the_drop_in(name):
    rng = random.Random(3)
    features = [sample for sample in cases.features(name, rng, 12) if sample["videos"]][:3]
    assert features
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape") as caught:
        cases.collate(cases.collator(name), features)
    assert caught.traceback[-1].name == "get_rope_index"  # the model's own, typing video frames as images
    drop_in.install()
    try:
        batch = cases.collate(cases.collator(name), features)
        assert torch.equal(batch["position_ids"], expected(name, batch, features))
    finally:
        _uninstall()


@pytest.mark.parametrize("model", ["config", "none"])
def test_no_model_method_needed(model, installed):
    """LLaMA-Factory takes ``get_rope_index`` from the model object; the drop-in needs only
    the config (from the model, or given to ``install``)."""
    _, config, _ = cases.family("Qwen2.5-VL")
    if model == "none":
        drop_in.install(config=config)
    for features in padded_batches("Qwen2.5-VL", seed=11, count=2):
        batch = cases.collate(cases.collator("Qwen2.5-VL", model=model), features)
        assert torch.equal(batch["position_ids"], expected("Qwen2.5-VL", batch, features))


def test_without_the_model_llamafactory_alone_gives_no_positions():
    features = padded_batches("Qwen2.5-VL", seed=11, count=1)[0]
    assert "position_ids" not in cases.collate(cases.collator("Qwen2.5-VL", model="none"), features)


def test_no_model_and_no_config_keeps_llamafactorys_behaviour(installed):
    """LLaMA-Factory builds its collator without a model for ``predict_with_generate``: no
    positions, the model computes them as it generates."""
    features = padded_batches("Qwen2-VL", seed=1, count=1)[0]
    assert "position_ids" not in cases.collate(cases.collator("Qwen2-VL", model="none"), features)


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "Qwen3-Omni"])
def test_the_rest_of_the_batch_is_llamafactorys(name, installed):
    """Same keys, same tensors, same deltas as LLaMA-Factory's own batch; only the text row
    differs."""
    features = padded_batches(name, seed=5, count=1)[0]
    mine = cases.collate(cases.collator(name), features)
    _uninstall()
    theirs = cases.collate(cases.collator(name), features)
    assert mine.keys() == theirs.keys()
    for key in theirs:
        if key != "position_ids":
            assert torch.equal(torch.as_tensor(mine[key]), torch.as_tensor(theirs[key])), key
    assert torch.equal(mine["position_ids"][1:], theirs["position_ids"][1:])


def test_text_only_batches_with_the_fake_image(installed):
    """LLaMA-Factory adds a masked fake image (and, for Omni, a fake audio clip) to batches
    without media: it places nothing."""
    for name in ("Qwen2-VL", "Qwen3-Omni"):
        rng = random.Random(2)
        features = cases.features(name, rng, 3, text_only=True)
        batch = cases.collate(cases.collator(name), features)
        assert "pixel_values" in batch
        assert torch.equal(batch["position_ids"], expected(name, batch, features))
        groups, packed = packed_groups(name, seed=4, text_only=True)
        batch = cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True), packed)
        assert_packed_positions(name, batch, groups)


def test_placeholders_that_disagree_with_the_grids_are_refused(installed):
    """LLaMA-Factory's Qwen3-VL plugin writes the first video's frame count for every video of
    a sample: with two videos of different lengths the tokens no longer match the grids, and
    the drop-in says so instead of placing them."""
    processor, _, template = cases.family("Qwen3-VL")
    rng = random.Random(0)
    clips = [[cases._image(rng)] * 4, [cases._image(rng)] * 2]
    messages = template.mm_plugin.process_messages([{"role": "user", "content": "<video> the <video>"}], [], clips,
                                                   [], processor)
    ids = processor.tokenizer.encode(messages[0]["content"], add_special_tokens=False)
    features = [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": ids, "images": [], "videos": clips,
                 "audios": []}]
    with pytest.raises(PlaceholderMismatchError, match="sample 0"):
        cases.collate(cases.collator("Qwen3-VL"), features)


# -- neat packing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [name for name in cases.FAMILIES if name not in cases.STATEFUL])
@pytest.mark.parametrize("attention", ["eager", "flash_attention_2"])
def test_neat_packing_equals_the_reference_per_sample(name, attention, installed):
    """Packed rows as ``neat_packing`` makes them: each sample placed as if alone, Omni too; with
    flash-attention LLaMA-Factory then removes the padding (one row per batch)."""
    rows = 1 if attention == "flash_attention_2" else 2
    for seed in range(3):
        groups, packed = packed_groups(name, seed=seed, rows=rows)
        batch = cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True,
                                             attn_implementation=attention), packed)
        if attention == "flash_attention_2":
            assert batch["attention_mask"] is None
            if any(sample["images"] or sample["videos"] for sample in groups[0]):  # else the fake image stays
                assert batch["position_ids"].shape[-1] == sum(len(sample["input_ids"]) for sample in groups[0])
        assert_packed_positions(name, batch, groups)


@pytest.mark.parametrize("name", cases.STATEFUL)
@pytest.mark.parametrize("attention", ["eager", "flash_attention_2"])
def test_neat_packing_of_layers_carrying_state_is_refused(name, attention, installed):
    """Qwen3.5's linear-attention layers run from one packed sample into the next unless given
    the boundaries, which neither LLaMA-Factory's block-diagonal mask nor its flash-attention
    rows carry: the drop-in refuses the batch before any forward."""
    _, packed = packed_groups(name, seed=0, rows=1)
    with pytest.raises(PackingUnsupportedError, match="linear_attention layers"):
        cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True, attn_implementation=attention),
                      packed)
    padded = cases.features(name, random.Random(0), 2)  # padded batches stay as they were
    batch = cases.collate(cases.collator(name), padded)
    assert torch.equal(batch["position_ids"], expected(name, batch, padded))


@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen3-VL"])
def test_neat_packing_alone_copies_the_temporal_row(name):
    """LLaMA-Factory alone: right ``(t, h, w)`` per sample, but row 0, which the model reads to
    tell packed samples apart, is the temporal row: it does not count text positions."""
    groups, packed = packed_groups(name, seed=1)
    batch = cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True), packed)
    flat = [sample for group in groups for sample in group]
    media, index, text_row_differs = cases.media_of(batch, flat), 0, False
    for row, group in enumerate(groups):
        start = 0
        for sample in group:
            ids = torch.tensor([sample["input_ids"]])
            reference = cases.reference_positions(name, ids, torch.ones_like(ids), cases.segment_media(media, flat, index))
            got = batch["position_ids"][:, row, start:start + ids.shape[1]]
            assert torch.equal(got[1:], reference[1:, 0]) and torch.equal(got[0], reference[1, 0])
            text_row_differs |= not torch.equal(got[0], reference[0, 0])
            start, index = start + ids.shape[1], index + 1
    assert text_row_differs


@pytest.mark.parametrize("name", cases.OMNI)
def test_omni_packing_refused_by_llamafactory_alone(name):
    _, packed = packed_groups(name, seed=0)
    with pytest.raises(RuntimeError, match="Omni models are not supported for packed sequences"):
        cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True), packed)


MODEL_KEYS = ("input_ids", "attention_mask", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos",
              "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids")


def logits(model, batch):
    inputs = {key: batch[key] for key in MODEL_KEYS if batch.get(key) is not None}
    if "second_per_grid_ts" in inputs:
        inputs["second_per_grid_ts"] = torch.as_tensor(inputs["second_per_grid_ts"])
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def test_neat_packing_gives_each_samples_own_logits():
    """LLaMA-Factory's flash-attention neat packing hands the model one row without an attention
    mask: the model tells the samples apart by the text row. A tiny Qwen2.5-VL model (sdpa, the
    same packed-sequence rule) then gives each sample the logits it gives the sample alone, with
    mmrope's positions; with LLaMA-Factory's, whose text row is the temporal row, it does not."""
    from cases import tiny_model

    name, model = "Qwen2.5-VL", tiny_model()
    processor, _, _ = cases.family(name)
    rng = random.Random(12)
    samples = [sample for sample in cases.features(name, rng, 12) if sample["images"] or sample["videos"]][:3]
    _, packed_row = _packed_from(samples)
    alone = []
    for sample in samples:  # each sample's own logits: the model computes its positions
        batch = cases.collate(cases.collator(name, model="none"), [sample])
        batch["mm_token_type_ids"] = torch.tensor(processor.create_mm_token_type_ids(batch["input_ids"].tolist()))
        alone.append(logits(model, batch)[0])

    def segments_equal(batch):
        assert batch["attention_mask"] is None and batch["position_ids"].shape[-1] == sum(map(len, alone))
        out, start = logits(model, batch)[0], 0
        same = []
        for own in alone:
            same.append(torch.allclose(out[start:start + len(own)], own, atol=1e-5))
            start += len(own)
        return same

    flash = {"neat_packing": True, "block_diag_attn": True, "attn_implementation": "flash_attention_2"}
    llamafactorys = cases.collate(cases.collator(name, **flash), packed_row)
    assert not all(segments_equal(llamafactorys))
    drop_in.install()
    try:
        assert all(segments_equal(cases.collate(cases.collator(name, **flash), packed_row)))
    finally:
        _uninstall()


def _packed_from(samples):
    cutoff = sum(len(sample["input_ids"]) for sample in samples) + 3
    cutoff += -(cutoff + 1) % 8
    return [samples], cases.packed([samples], cutoff)


# -- Omni -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", cases.OMNI)
def test_audio_in_video(name, installed):
    """LLaMA-Factory's ``use_audio_in_video`` (set on the processor) reaches the positions,
    padded and packed."""
    processor, _, _ = cases.family(name)
    processor.use_audio_in_video = True
    try:
        for features in padded_batches(name, seed=3, count=2, audio_in_video=True):
            assert any(sample["videos"] for sample in features)
            batch = cases.collate(cases.collator(name), features)
            assert torch.equal(batch["position_ids"], expected(name, batch, features, use_audio_in_video=True))
        groups, packed = packed_groups(name, seed=3, audio_in_video=True)
        batch = cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True), packed)
        assert_packed_positions(name, batch, groups, use_audio_in_video=True)
    finally:
        del processor.use_audio_in_video


@pytest.mark.parametrize("attention", ["eager", "flash_attention_2"])
def test_qwen3_omni_positions_stay_float32_under_bf16(attention, installed):
    """The SFT collator casts every float tensor to ``compute_dtype``: Qwen3-Omni's positions
    (past 256, fractional after videos) reach the model as float32, exact."""
    name = "Qwen3-Omni"
    features = padded_batches(name, seed=9, count=1, long=True)[0]
    batch = cases.collate(cases.collator(name, compute_dtype=torch.bfloat16), features)
    assert batch["position_ids"].dtype == torch.float32 and batch["pixel_values"].dtype == torch.bfloat16
    assert torch.equal(batch["position_ids"], expected(name, batch, features))
    groups, packed = packed_groups(name, seed=9, rows=1, long=True)
    batch = cases.collate(cases.collator(name, neat_packing=True, block_diag_attn=True, attn_implementation=attention,
                                         compute_dtype=torch.bfloat16), packed)
    assert_packed_positions(name, batch, groups)


def test_qwen3_omni_positions_cast_to_bf16_by_llamafactory_alone():
    name = "Qwen3-Omni"
    features = padded_batches(name, seed=9, count=1, long=True)[0]
    batch = cases.collate(cases.collator(name, compute_dtype=torch.bfloat16), features)
    reference = expected(name, batch, features)
    assert batch["position_ids"].dtype == torch.bfloat16
    assert not torch.equal(batch["position_ids"][1:].float(), reference[1:])


def test_pairwise_collator(installed):
    """The pairwise (DPO) collator calls the base collator on chosen and rejected rows: both
    get mmrope's positions."""
    name = "Qwen2.5-VL"
    processor, _, template = cases.family(name)
    rng = random.Random(6)
    chosen, rejected = cases.features(name, rng, 2), cases.features(name, rng, 2)
    pairs = [{"chosen_input_ids": good["input_ids"], "chosen_attention_mask": good["attention_mask"],
              "chosen_labels": good["labels"], "rejected_input_ids": good["input_ids"][:-1] + bad["input_ids"][-1:],
              "rejected_attention_mask": good["attention_mask"], "rejected_labels": good["labels"],
              "images": good["images"], "videos": good["videos"], "audios": []}
             for good, bad in zip(chosen, rejected)]
    pairwise = collator_module.PairwiseDataCollatorWithPadding(
        template=template, processor=processor, tokenizer=processor.tokenizer, model=cases.reference_model(name),
        label_pad_token_id=-100)
    batch = cases.collate(pairwise, pairs)
    rows = [{"images": pair["images"], "videos": pair["videos"], "audios": []} for pair in pairs] * 2
    assert batch["input_ids"].shape[0] == 4
    assert torch.equal(batch["position_ids"], expected(name, batch, rows))


def test_kto_collator(installed):
    """The KTO collator calls the base collator on the target rows and the KL rows."""
    name = "Qwen3-VL"
    processor, _, template = cases.family(name)
    samples = cases.features(name, random.Random(8), 3)
    rows = [{**sample, "kl_input_ids": sample["input_ids"], "kl_attention_mask": sample["attention_mask"],
             "kl_labels": sample["labels"], "kto_tags": True} for sample in samples]
    kto = collator_module.KTODataCollatorWithPadding(
        template=template, processor=processor, tokenizer=processor.tokenizer, model=cases.reference_model(name),
        label_pad_token_id=-100)
    batch = cases.collate(kto, rows)
    assert torch.equal(batch["position_ids"], expected(name, batch, samples))


def test_install_is_idempotent(installed):
    wrapped = collator_module.MultiModalDataCollatorForSeq2Seq.__dict__["__call__"]
    drop_in.install()
    assert collator_module.MultiModalDataCollatorForSeq2Seq.__dict__["__call__"] is wrapped
    assert drop_in.installed()


def _uninstall():
    for cls in (collator_module.MultiModalDataCollatorForSeq2Seq, collator_module.SFTDataCollatorWith4DAttentionMask):
        call = cls.__dict__["__call__"]
        cls.__call__ = getattr(call, "__mmrope_original__", call)


@pytest.mark.parametrize("convention", ["vllm", "sglang"])
def test_the_collators_take_the_convention_install_names(convention, installed):
    """GRPO-style training on a rollout engine's positions: Qwen2.5-VL's text after a video."""
    from mmrope_core import RopeEngine

    drop_in.install(convention=convention)
    processor, config, _ = cases.family("Qwen2.5-VL")
    engine = RopeEngine.from_processor(processor, config, convention=convention)
    differ = 0
    for features in padded_batches("Qwen2.5-VL", seed=21, count=4):
        batch = cases.collate(cases.collator("Qwen2.5-VL"), features)
        media = cases.media_of(batch, features)
        want = engine.compute_position_ids(batch["input_ids"], batch["attention_mask"], media).transpose(0, 1)
        assert torch.equal(batch["position_ids"], want)
        differ += not torch.equal(want, expected("Qwen2.5-VL", batch, features))
    assert differ > 0


def test_a_collator_whose_family_lacks_the_convention_is_refused_when_built(installed):
    from mmrope_core import UnknownConventionError

    drop_in.install(convention="sglang")
    with pytest.raises(UnknownConventionError, match=r"SGLang 0\.5\.23 has no Qwen2\.5-Omni model"):
        cases.collator("Qwen2.5-Omni")
    cases.collator("Qwen3-Omni")  # which SGLang runs


def test_a_convention_nobody_knows_is_refused_at_install(installed):
    from mmrope_core import UnknownConventionError

    drop_in.install(convention="vllm")
    with pytest.raises(UnknownConventionError, match=r"'vlm' \(mmrope_core.integrations.llamafactory.install\(convention="
                                                     r"...\)\) is unknown; the known ones are 'transformers', 'vllm-0.33'"):
        drop_in.install(convention="vlm")
    assert drop_in._settings["convention"] == "vllm"  # the settings before stay


def with_replies(features, rng):
    """Each feature followed by a reply its rollout engine generated: ``generated_mask`` marks it."""
    tokenizer = cases.family("Qwen3-Omni")[0].tokenizer
    out = []
    for feature in features:
        reply = tokenizer.encode(cases._filler(rng, rng.randint(2, 6)), add_special_tokens=False)
        ids = feature["input_ids"] + reply
        out.append({**feature, "input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids),
                    "generated_mask": [0] * len(feature["input_ids"]) + [1] * len(reply)})
    return out


@pytest.mark.parametrize("side", ["right", "left"])
def test_sglang_rollouts_take_each_features_generated_mask(side, installed):
    """Features carrying ``generated_mask`` (a column of a tokenized dataset reaches the collator
    unchanged): SGLang's positions of its Qwen3-Omni replies, where it decoded them."""
    import copy

    from mmrope_core import RopeEngine

    drop_in.install(convention="sglang")
    processor, config, _ = cases.family("Qwen3-Omni")
    engine = RopeEngine.from_processor(processor, config, convention="sglang")
    collator = cases.collator("Qwen3-Omni")
    saved, processor.tokenizer.padding_side = processor.tokenizer.padding_side, side
    processor.video_fps = 3.0  # LLaMA-Factory's video_fps setting: 2/3 s per frame, fractional positions
    moved = 0
    try:
        for features in padded_batches("Qwen3-Omni", seed=5, count=8):
            features = with_replies(features, random.Random(len(features)))
            given = copy.deepcopy(features)
            batch = collator(features)
            assert all(feature["generated_mask"] == kept["generated_mask"] for feature, kept in zip(features, given))
            assert "generated_mask" not in batch
            width = batch["input_ids"].shape[1]
            generated = torch.zeros_like(batch["input_ids"])
            for row, feature in enumerate(given):
                start = 0 if side == "right" else width - len(feature["input_ids"])
                generated[row, start:start + len(feature["input_ids"])] = torch.tensor(feature["generated_mask"])
            media = {key: value for key, value in cases.media_of(batch, given).items() if value is not None}
            want = engine.compute_position_ids(batch["input_ids"], batch["attention_mask"], media,
                                               generated_mask=generated).transpose(0, 1)
            assert torch.equal(batch["position_ids"], want)
            moved += not torch.equal(want, engine.compute_position_ids(batch["input_ids"], batch["attention_mask"],
                                                                       media).transpose(0, 1))
    finally:
        processor.tokenizer.padding_side = saved
        del processor.video_fps
    assert moved > 0  # some replies sit where SGLang decoded them, not where a prefill puts them


def test_a_generated_mask_of_another_length_is_refused_and_its_absence_said(installed):
    from mmrope_core import CollateError, GeneratedMaskWarning

    drop_in.install(convention="sglang")
    features = with_replies(padded_batches("Qwen3-Omni", seed=6, count=1)[0], random.Random(1))
    features[-1]["generated_mask"] = features[-1]["generated_mask"][:-1]
    collator = cases.collator("Qwen3-Omni")
    with pytest.raises(CollateError, match=rf"sample {len(features) - 1}: generated_mask has \d+ values but input_ids"):
        cases.collate(collator, features)
    without = [{key: value for key, value in feature.items() if key != "generated_mask"} for feature in features]
    with pytest.warns(GeneratedMaskWarning, match="these features carry no generated_mask: every token is placed as "
                                                  "a prefill"):
        cases.collate(collator, without)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GeneratedMaskWarning)
        cases.collate(collator, without)  # once per collator
        drop_in.install(convention="vllm")  # a convention that places generated tokens as a prefill says nothing
        cases.collate(cases.collator("Qwen3-Omni"), without)


def test_neat_packing_rows_take_their_generated_mask(installed):
    """A packed row's ``generated_mask`` (its samples' masks joined, 0 at its padding): each
    sample gets SGLang's positions of its rollout alone."""
    from mmrope_core import RopeEngine

    drop_in.install(convention="sglang")
    processor, config, _ = cases.family("Qwen3-Omni")
    engine = RopeEngine.from_processor(processor, config, convention="sglang")
    processor.video_fps = 3.0
    moved = 0
    try:
        for seed in range(3):
            rng = random.Random(seed)
            groups = [with_replies(cases.features("Qwen3-Omni", rng, rng.randint(1, 3)), rng) for _ in range(2)]
            cutoff = max(sum(len(sample["input_ids"]) for sample in group) for group in groups) + 7
            cutoff += -(cutoff + 1) % 8
            rows = cases.packed(groups, cutoff)
            for row, group in zip(rows, groups):
                masks = [flag for sample in group for flag in sample["generated_mask"]]
                row["generated_mask"] = masks + [0] * (len(row["input_ids"]) - len(masks))
            batch = cases.collate(cases.collator("Qwen3-Omni", neat_packing=True, block_diag_attn=True), rows)
            for sample, ids, media, got in packed_segments(batch, groups):
                alone = {key: value for key, value in media.items() if value is not None}
                want = engine.compute_position_ids(ids, None, alone, generated_mask=torch.tensor(
                    [sample["generated_mask"]])).transpose(0, 1)
                assert torch.equal(got, want)
                moved += not torch.equal(want, engine.compute_position_ids(ids, None, alone).transpose(0, 1))
    finally:
        del processor.video_fps
    assert moved > 0


# -- what the engine says of the model (batch_layout, samples_independent) ---------------------------


def images_in_several_rows(seed):
    """Padded features of Qwen2-VL where at least two rows hold images."""
    rng = random.Random(seed)
    while True:
        features = cases.features("Qwen2-VL", rng, 3, videos=False)
        if sum(bool(feature["images"]) for feature in features) >= 2:
            return features


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_reference_numbering_images_across_the_batch_gives_each_row_its_sample_alone(side, installed, monkeypatch):
    """A third party's reference that numbers images across the batch (as HunYuan-VL's does): each
    row of LLaMA-Factory's padded batch gets its sample's positions alone, not the batch's."""
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.engine import RopeEngine

    manager = default_manager_with(monkeypatch, ThirdParty(numbering=True))
    features = images_in_several_rows(seed=5)
    batch = cases.collate(cases.collator("Qwen2-VL"), features) if side == "right" else None
    if side == "left":
        collator = cases.collator("Qwen2-VL")
        collator.tokenizer = copy.copy(collator.tokenizer)
        collator.tokenizer.padding_side = "left"
        batch = cases.collate(collator, features)
    processor, config, _ = cases.family("Qwen2-VL")
    engine = RopeEngine.from_processor(processor, config, plugin_manager=manager)
    assert not engine.samples_independent
    whole, _ = engine.get_rope_index(batch["input_ids"], batch["attention_mask"], image_grid_thw=batch["image_grid_thw"])
    differs = False
    for row, feature in enumerate(features):
        alone = cases.collate(cases.collator("Qwen2-VL"), [feature])["position_ids"][:, 0]
        valid = batch["attention_mask"][row].bool()
        assert torch.equal(batch["position_ids"][:, row][:, valid], alone)
        differs |= not torch.equal(whole[:, row][:, valid], alone[1:])
    assert differs  # the batch as the reference computes it would have given a row other positions


def test_a_grid_whose_medium_no_plugin_declares_is_refused_not_guessed_from_its_name(installed, monkeypatch):
    """Rows computed alone share the batch's grids out by the media their plugin declares they
    hold: a grid declared without it is refused, whatever its name says."""
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.batching import GRID
    from mmrope_core.errors import CollateError

    default_manager_with(monkeypatch, ThirdParty(numbering=True, media={"image_grid_thw": GRID}))
    with pytest.raises(CollateError, match=r"cannot share 'image_grid_thw' out.*it holds \d+ entries; its plugin's "
                                           r"batch_layout does not say which media items"):
        cases.collate(cases.collator("Qwen2-VL"), images_in_several_rows(seed=5))


def test_a_model_taking_only_its_own_rows_gets_no_text_row(installed, monkeypatch):
    """A model whose rotary embedding reads only the kernel's rows (HunYuan-VL's) gets those."""
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.batching import BatchLayout

    default_manager_with(monkeypatch, ThirdParty(layout=BatchLayout(text_positions=False)))
    features = images_in_several_rows(seed=6)
    batch = cases.collate(cases.collator("Qwen2-VL"), features)
    assert batch["position_ids"].shape[0] == 3
    assert torch.equal(batch["position_ids"], expected("Qwen2-VL", batch, features)[1:])


def test_a_padding_side_the_model_gets_wrong_is_refused(installed, monkeypatch):
    from layout_plugins import ThirdParty, default_manager_with

    from mmrope_core.batching import BatchLayout
    from mmrope_core.errors import PaddingUnsupportedError

    default_manager_with(monkeypatch, ThirdParty(layout=BatchLayout(refused_sides={"left": "its layers read slots"})))
    collator = cases.collator("Qwen2-VL")
    collator.tokenizer = copy.copy(collator.tokenizer)
    collator.tokenizer.padding_side = "left"
    with pytest.raises(PaddingUnsupportedError, match="padded on the left: its layers read slots; LLaMA-Factory pads "
                                                      "on its tokenizer's padding_side: set it to 'right'"):
        cases.collate(collator, images_in_several_rows(seed=7))
    right = cases.collator("Qwen2-VL")
    assert cases.collate(right, images_in_several_rows(seed=7))["position_ids"].shape[0] == 4
