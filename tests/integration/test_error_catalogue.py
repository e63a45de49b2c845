"""Every row of docs/errors.md, triggered: the error class and the message it documents."""

import functools
import re
from pathlib import Path

import pytest
import torch
import transformers

import mmrope_core.errors as errors
from mmrope_core import MediaKey, PluginManager, RopeEngine
from mmrope_core.processor_outputs import collate
from mmrope_core.collators import PackedCollator, PaddedCollator
from mmrope_core.parallel import split_batch, split_index

CATALOGUE = Path(__file__).parents[2] / "docs" / "errors.md"
ROW = re.compile(r"^\| `([\w-]+)` \| .* \| `(\w+)` \| `(.+)` \| .* \|$")


def catalogue():
    rows = [ROW.match(line) for line in CATALOGUE.read_text().splitlines()]
    return {match[1]: (match[2], match[3]) for match in rows if match}


@functools.cache
def manager():
    return PluginManager(env={"MMROPE_LOAD_PLUGINS": "qwen_vl,gemma4,qwen3_omni"})


@functools.cache
def engine(name, impl="fast"):
    if name in ("Qwen3-Omni", "Qwen2.5-Omni"):
        from mmrope_qwen3_omni.examples import build
    elif name == "Gemma4":
        from mmrope_gemma4.examples import build as gemma_build

        processor, config = gemma_build()
        return RopeEngine.from_processor(processor, config, plugin_manager=manager())
    else:
        from mmrope_qwen_vl.examples import build
    processor, config = build(name)
    return RopeEngine.from_processor(processor, config, plugin_manager=manager(), implementation=impl)


def qwen_ids(*rows):
    """Rows written as strings: t text, [ ] vision start/end, i image token, v video token."""
    processor = engine("Qwen2-VL").processor
    tokenizer = processor.tokenizer
    table = {"t": tokenizer.convert_tokens_to_ids("cat"), "[": tokenizer.convert_tokens_to_ids(tokenizer.vision_start_token),
             "]": tokenizer.convert_tokens_to_ids(tokenizer.vision_end_token), "i": processor.image_token_id,
             "v": processor.video_token_id}
    length = max(map(len, rows))
    ids = torch.full((len(rows), length), tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor([table[c] for c in row])
        mask[index, : len(row)] = 1
    return ids, mask


GRID = torch.tensor([[1, 4, 4]])


def qwen2(*rows, **kwargs):
    ids, mask = qwen_ids(*rows)
    return lambda: engine("Qwen2-VL").get_rope_index(ids, mask, **kwargs)


def qwen25_seconds(seconds):
    ids, mask = qwen_ids("t[vvvvvvvv]t")
    return lambda: engine("Qwen2.5-VL").get_rope_index(ids, mask, video_grid_thw=torch.tensor([[2, 4, 4]]),
                                                       second_per_grid_ts=seconds)


def compute(input_ids, attention_mask):
    return lambda: engine("Qwen2-VL").compute_position_ids(input_ids, attention_mask, {})


def omni(row, **kwargs):
    from mmrope_qwen3_omni.binding import token_ids

    processor = engine("Qwen3-Omni").processor
    token = token_ids(processor)
    table = {"t": processor.tokenizer.convert_tokens_to_ids("cat"), "[": token["vision_bos"], "]": token["vision_eos"],
             "i": token["image"], "v": token["video"], "(": token["audio_bos"], ")": token["audio_eos"], "a": token["audio"]}
    ids = torch.tensor([[table[c] for c in row]])
    return lambda: engine("Qwen3-Omni").get_rope_index(ids, **kwargs)


class MysteryProcessor:
    pass


@functools.cache
def storyboard():
    """Storyboard's engine, and one board of two panels, each shown half a second."""
    import numpy as np

    from mmrope_storyboard import build

    processor, config = build()
    built = RopeEngine.from_processor(processor, config,
                                      plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "storyboard"}))
    panels = [np.zeros((28, 28, 3), np.uint8)] * 2
    return built, processor(text=["a <|board|> b"], boards=[(panels, [0.5, 0.5], np.zeros(16000, np.float32))])


def stamped(times):
    def trigger():
        built, outputs = storyboard()
        built.get_rope_index(outputs["input_ids"], panel_grid_thw=outputs["panel_grid_thw"], panel_times=times,
                             narration_lengths=outputs["narration_lengths"])
    return trigger


TRIGGERS = {
    "ids-list": compute([[1, 2]], None),
    "ids-float": compute(torch.ones(1, 2), None),
    "ids-rank": compute(torch.ones(1, 2, 3, dtype=torch.long), None),
    "empty-batch": compute(torch.ones(0, 4, dtype=torch.long), None),
    "zero-length": compute(torch.ones(2, 0, dtype=torch.long), None),
    "mask-list": compute(torch.ones(1, 2, dtype=torch.long), [[1, 1]]),
    "mask-shape": compute(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long)),
    "mask-values": compute(torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, 2, 1]])),
    "mask-float": compute(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3) * 0.5),
    "mask-device": compute(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long, device="meta")),
    "all-padding": compute(torch.ones(2, 2, dtype=torch.long), torch.tensor([[1, 1], [0, 0]])),
    "grid-list": qwen2("t[iiii]t", image_grid_thw=[[1, 4, 4]]),
    "grid-shape": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[4, 4]])),
    "grid-float": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[1.0, 4.0, 4.0]])),
    "grid-zero": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[0, 4, 4]])),
    "grid-negative": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[1, -4, 4]])),
    "grid-divisible": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[1, 4, 3]])),
    "grid-too-large": lambda: engine("Qwen3-VL").get_rope_index(qwen_ids("t[vvvv]t")[0],
                                                                video_grid_thw=torch.tensor([[2**26, 2, 2]])),
    "grid-complex": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[1, 4, 4]], dtype=torch.complex64)),
    "tensor-meta": compute(torch.ones(1, 3, dtype=torch.long, device="meta"), None),
    "grids-left-over": qwen2("t[iiii]t", "t[iiii]t", image_grid_thw=GRID.repeat(3, 1)),
    "run-without-grid": qwen2("t[iiii]t", "t[iiii]t", image_grid_thw=GRID),
    "sampled-placeholder": qwen2("t[iiii]ttit", image_grid_thw=GRID),
    "placeholder-in-text-only": qwen2("t[iiii]t", "ttiit", image_grid_thw=GRID),
    "truncated-run": qwen2("t[iii", image_grid_thw=GRID),
    "touching-runs": qwen2("t[iiiiiiii]t", image_grid_thw=GRID.repeat(2, 1)),
    "grids-out-of-step": qwen2("t[iiii]t", image_grid_thw=torch.tensor([[1, 2, 2], [1, 4, 4]])),
    "video-without-grid": qwen2("t[vvvv]t"),
    "seconds-length": qwen25_seconds(torch.tensor([0.5, 1.0])),
    "seconds-nonfinite": qwen25_seconds(torch.tensor([float("inf")])),
    "seconds-negative": qwen25_seconds(torch.tensor([-0.5])),
    "other-family-inputs": qwen2("tttttt", image_grid_thw=GRID),
    "seconds-overflow": qwen25_seconds(torch.tensor([1e30])),
    "stamps-length": stamped(torch.tensor([0.0])),
    "stamps-negative": stamped(torch.tensor([0.0, -1.0])),
    "stamps-decreasing": stamped(torch.tensor([0.5, 0.25])),
    "stamps-nonfinite": stamped(torch.tensor([float("nan"), 0.5])),
    "stamps-beyond": stamped(torch.tensor([0.0, 2.0**21])),
    "seconds-not-numbers": lambda: engine("Qwen3-Omni").rope_index_kwargs({"video_second_per_grid": "2"}),
    "audio-mask-form": lambda: engine("Qwen3-Omni").rope_index_kwargs({"feature_attention_mask": [[1, 1, 1]]}),
    "audio-lengths-negative": omni("t(aaaa)t", audio_seqlens=torch.tensor([-3])),
    "other-family-config": lambda: RopeEngine.from_processor(
        engine("Qwen2-VL").processor, transformers.AutoConfig.for_model("qwen3_vl"), plugin_manager=manager()),
    "audio-length": omni("t[i]t(" + "a" * 10 + ")t", image_grid_thw=torch.tensor([[1, 2, 2]]),
                         audio_seqlens=torch.tensor([100])),
    "audio-no-start": omni("t[i]tt" + "a" * 13 + ")t", image_grid_thw=torch.tensor([[1, 2, 2]]),
                           audio_seqlens=torch.tensor([100])),
    "audio-mask-missing": omni("t[i]t(" + "a" * 13 + ")t", image_grid_thw=torch.tensor([[1, 2, 2]])),
    "audio-in-video-no-audio": omni("t[vv]t", video_grid_thw=torch.tensor([[2, 2, 2]]),
                                    second_per_grids=torch.tensor([1.0]), use_audio_in_video=True),
    "video-seconds-missing": omni("t[vv]t", video_grid_thw=torch.tensor([[2, 2, 2]])),
    "omni-audio-in-video-flag": omni("t[(vv" + "a" * 13 + ")]t", video_grid_thw=torch.tensor([[2, 2, 2]]),
                                     second_per_grids=torch.tensor([1.0]), audio_seqlens=torch.tensor([100])),
    "omni-end-marker": omni("t[ii]t", image_grid_thw=torch.tensor([[1, 2, 2]])),
    "omni-video-end-missing": omni("t[(vv" + "a" * 13 + ")t", video_grid_thw=torch.tensor([[2, 2, 2]]),
                                   second_per_grids=torch.tensor([1.0]), audio_seqlens=torch.tensor([100]),
                                   use_audio_in_video=True),
    "omni-audio-in-video-count": omni("t[(vvv" + "a" * 12 + ")]t", video_grid_thw=torch.tensor([[2, 2, 2]]),
                                      second_per_grids=torch.tensor([1.0]), audio_seqlens=torch.tensor([100]),
                                      use_audio_in_video=True),
    "omni-unknown-input": omni("t[i]t", image_grid_thw=torch.tensor([[1, 2, 2]]), fps=torch.tensor([2.0])),
    "omni-config-ids": lambda: RopeEngine.from_processor(
        engine("Qwen3-Omni").processor, transformers.AutoConfig.for_model("qwen3_omni_moe"), plugin_manager=manager()),
    "unsupported-processor": lambda: RopeEngine.from_processor(MysteryProcessor(), plugin_manager=manager()),
    "rope-index-1d": lambda: RopeEngine.from_processor(None, plugin_manager=manager()).get_rope_index(
        torch.tensor([[1, 2, 3]])),
    "unknown-impl": lambda: engine("Qwen2-VL", impl="turbo"),
    "unknown-convention": lambda: RopeEngine.from_processor(engine("Qwen2-VL").processor, engine("Qwen2-VL").config,
                                                            plugin_manager=manager(), convention="vllm-0.1"),
    "convention-not-offered": lambda: RopeEngine.from_processor(
        engine("Qwen2.5-Omni").processor, engine("Qwen2.5-Omni").config, plugin_manager=manager(), convention="sglang"),
    "convention-at-install": lambda: convention_at_install(),
    "convention-no-videos": lambda: cohere_compass_video(),
    "generated-first-token": lambda: engine("Qwen2-VL").get_rope_index(torch.tensor([[1, 2, 3]]),
                                                                       generated_mask=torch.tensor([[1, 1, 0]])),
    "generated-padding": lambda: engine("Qwen2-VL").get_rope_index(torch.tensor([[0, 2, 3]]), torch.tensor([[0, 1, 1]]),
                                                                   generated_mask=torch.tensor([[1, 0, 1]])),
    "unknown-option": lambda: RopeEngine.from_processor(engine("Qwen2-VL").processor, engine("Qwen2-VL").config,
                                                        plugin_manager=manager(), implementaton="reference"),
    "inputs-not-a-dict": lambda: engine("Qwen2-VL").compute_position_ids(torch.ones(1, 2, dtype=torch.long), None,
                                                                         [torch.ones(1)]),
    "key-not-a-string": lambda: PaddedCollator(engine("Qwen2-VL"))([{"input_ids": torch.tensor([[1, 2, 3]])},
                                                                    {"input_ids": torch.tensor([[1, 2]]), 0: 1}]),
    "batch-nothing": lambda: engine("Qwen2-VL").batch([]),
    "batch-ids-list": lambda: engine("Qwen2-VL").batch([{"input_ids": [[1, 2, 3]]}]),
    "batch-mask-shape": lambda: engine("Qwen2-VL").batch([{"input_ids": torch.tensor([[1, 2, 3]]),
                                                           "attention_mask": torch.ones(2, 3, dtype=torch.long)}]),
    "batch-mask-length": lambda: engine("Qwen2-VL").batch([{"input_ids": torch.tensor([[1, 2, 3]]),
                                                            "attention_mask": torch.ones(1, 2, dtype=torch.long)}]),
    "collate-shapes": lambda: collate([{"input_features": torch.ones(1, 4, 3)}, {"input_features": torch.ones(1, 4, 5)}]),
    "collate-row-without-media": lambda: collate([{"pixel_values": torch.ones(1, 3, 2, 2)}, {}],
                                                 media={"pixel_values": MediaKey(per_row=True)}),
    "collate-mixed-kinds": lambda: collate([{"pixel_values": torch.ones(4, 6)}, {"images_per_sample": torch.tensor([2])}],
                                           media={"pixel_values": MediaKey(all_or_none=True)}),
    "collate-switched-media": lambda: collate([{"image_pixel_values": torch.ones(1, 2)},
                                               {"audio_input_features": torch.ones(1, 3, 2)}],
                                              media={"audio_input_features": MediaKey(switched_by="image_pixel_values")}),
    "collate-one-value": lambda: collate([{"images_per_sample": torch.tensor([2])},
                                          {"images_per_sample": torch.tensor([3])}],
                                         media={"images_per_sample": MediaKey(uniform=True)}),
    "collate-one-shape": lambda: collate([{"input_features": torch.ones(1, 4, 3)}, {"input_features": torch.ones(1, 6, 3)}],
                                         media={"input_features": MediaKey(one_shape="the encoder reads the padding")}),
    "padding-side-refused": lambda: PaddedCollator(tiny_engine("Mllama (mllama)", "llama4"), padding_side="left"),
    "packed-media-per-row": lambda: PackedCollator(git_engine()),
    "collate-types": lambda: collate([{"metadata": "x"}, {"metadata": {"fps": 2}}]),
    "collator-no-engine": lambda: PaddedCollator(engine("Qwen2-VL").processor),
    "collator-not-samples": lambda: PaddedCollator(engine("Qwen2-VL"))({"input_ids": torch.tensor([[1, 2, 3]])}),
    "collator-labels-length": lambda: PaddedCollator(engine("Qwen2-VL"))([{"input_ids": torch.tensor([[1, 2, 3]]),
                                                                         "labels": torch.tensor([[1, 2]])}]),
    "packed-padded-sample": lambda: PackedCollator(engine("Qwen2-VL"))([{"input_ids": torch.tensor([[1, 2, 3]]),
                                                                        "attention_mask": torch.tensor([[1, 1, 0]])}]),
    "packed-max-length": lambda: PackedCollator(engine("Qwen2-VL"), max_length=5)([{"input_ids": torch.tensor([[1, 2, 3]])}] * 2),
    "packed-max-length-split": lambda: PackedCollator(engine("Qwen2-VL"), max_length=7, split=("zigzag", 2, 0))(
        [{"input_ids": torch.tensor([[1, 2, 3]])}] * 2),
    "packed-mixing-layers": lambda: PackedCollator(engine("Qwen3.5")),
    "misspelt-key": lambda: engine("Qwen2-VL").compute_position_ids(*qwen_ids("t[iiii]t"), {"grid_thw": GRID}),
    "misspelt-keyword": lambda: engine("Qwen2-VL").compute_position_ids(*qwen_ids("tt"), cu_seqlen=torch.tensor([0, 2])),
    "pretrained-missing": lambda: RopeEngine.from_pretrained("/models/Qwen2.5-VL-7B-Instruct"),
    "split-uneven-segment": lambda: split_index(torch.tensor([0, 8, 13]), scheme="zigzag", size=2, rank=0),
    "split-unknown-scheme": lambda: split_index(torch.tensor([0, 4]), scheme="ring", size=2, rank=0),
    "split-rank": lambda: split_index(torch.tensor([0, 4]), scheme="zigzag", size=2, rank=2),
    "split-boundaries": lambda: split_index(torch.tensor([0, 8, 4]), scheme="zigzag", size=2, rank=0),
    "split-option": lambda: PackedCollator(engine("Qwen2-VL"), split="zigzag"),
    "split-no-boundaries": lambda: split_batch({"input_ids": torch.ones(1, 6, dtype=torch.long)}, scheme="contiguous",
                                               size=2, rank=0),
    "split-ambiguous-key": lambda: split_batch({"input_ids": torch.ones(1, 6, dtype=torch.long),
                                                "cu_seq_lens_q": torch.tensor([0, 6]), "advantages": torch.ones(1, 6)},
                                               scheme="contiguous", size=2, rank=0),
    "split-pair-mask": lambda: split_batch({"input_ids": torch.ones(1, 6, dtype=torch.long),
                                            "cu_seq_lens_q": torch.tensor([0, 6]),
                                            "attention_mask": torch.ones(1, 1, 6, 6)}, scheme="contiguous", size=2, rank=0),
}


def convention_at_install():
    """Refused before LLaMA-Factory is imported: the check needs no trainer installed."""
    from mmrope_core.integrations import llamafactory

    llamafactory.install(convention="vlm")


def tiny_engine(case, model_type):
    """The transformers plugin's tiny processor of ``case`` for ``model_type``'s default config."""
    from mmrope_transformers.examples import example_cases

    processor, _ = next(found for found in example_cases() if found.name == case).build()
    return RopeEngine.from_processor(processor, transformers.AutoConfig.for_model(model_type))


def git_engine():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from mmrope_core.tiny import FILLER_WORDS, word_level_tokenizer

    processor = transformers.GitProcessor(image_processor=CLIPImageProcessorPil(),
                                          tokenizer=word_level_tokenizer({}, words=FILLER_WORDS))
    return RopeEngine.from_processor(processor, transformers.GitConfig())


def cohere_compass_video():
    """vLLM's Cohere-Compass takes images only: its convention refuses a sample holding a video."""
    from mmrope_transformers import examples

    processor, config = examples.build(examples.spec_of("cohere_compass"))
    vllm = RopeEngine.from_processor(processor, config, convention="vllm",
                                     plugin_manager=PluginManager(env={"MMROPE_LOAD_PLUGINS": "transformers"}))
    tokens = processor.tokenizer.convert_tokens_to_ids(["cat", "<|VISION_START|>", "<|VIDEO_PAD|>", "<|VISION_END|>"])
    ids = torch.tensor([[tokens[0], tokens[1], tokens[2], tokens[3], tokens[0]]])
    return vllm.get_rope_index(ids, video_grid_thw=torch.tensor([[1, 2, 2]]))


def test_the_catalogue_and_the_triggers_name_the_same_inputs():
    rows = catalogue()
    assert len(rows) >= 25
    assert sorted(rows) == sorted(TRIGGERS)


@pytest.mark.parametrize("row", sorted(catalogue()))
def test_each_catalogued_input_raises_what_the_catalogue_says(row):
    error_name, pattern = catalogue()[row]
    with pytest.raises(getattr(errors, error_name)) as caught:
        TRIGGERS[row]()
    assert re.search(pattern, str(caught.value)), f"{row}: {caught.value}"
    assert type(caught.value).__name__ == error_name


# -- the rows of the core's reading, on every family: the same error and message ------------------

FAMILIES = [("Qwen2-VL", "fast"), ("Qwen2.5-VL", "fast"), ("Qwen3-VL", "fast"), ("GLM-4V", "fast"),
            ("Qwen2.5-Omni", "fast"), ("Qwen3-Omni", "fast"), ("Qwen2-VL", "reference"), ("Qwen3-VL", "reference"),
            ("GLM-4V", "reference"), ("Qwen3-Omni", "reference"), ("Gemma4", "fast")]


@functools.cache
def family_batch(name):
    """A valid batch of the family's own processor: ids, mask and multimodal inputs."""
    import random

    if name == "Gemma4":
        from mmrope_gemma4.examples import image_samples as samples
    elif "Omni" in name:
        from mmrope_qwen3_omni.examples import audio_and_image_samples as samples
    else:
        from mmrope_qwen_vl.examples import image_samples as samples
    built = engine(name)
    return built.batch([built.process(**sample) for sample in samples(built.processor, random.Random(0))])


def _grid(change):
    def bad(ids, mask, inputs):
        return ids, mask, {**inputs, "image_grid_thw": change(inputs["image_grid_thw"])}
    return bad


def _set(row, column, value):
    def change(grid):
        grid = grid.clone()
        grid[row, column] = value
        return grid
    return change


# row id -> (what it does to a valid batch, whether 1-D families read it, the message every family gives)
EVERY_FAMILY = {
    "ids-float": (lambda ids, mask, inputs: (ids.float(), mask, inputs), True,
                  r"input_ids must hold integer token ids, got dtype torch.float32"),
    "mask-values": (lambda ids, mask, inputs: (ids, mask * 2, inputs), True,
                    r"attention_mask must hold only 0 and 1; sample 0, position \d+ holds 2"),
    "mask-shape": (lambda ids, mask, inputs: (ids, mask[:, 1:], inputs), True,
                   r"attention_mask has shape \(\d, \d+\) but input_ids has \(\d, \d+\)"),
    "tensor-meta": (lambda ids, mask, inputs: (ids.to("meta"), mask, inputs), True,
                    r"input_ids is on the meta device, which holds no values"),
    "inputs-not-a-dict": (lambda ids, mask, inputs: (ids, mask, list(inputs)), True,
                          r"multi_modal_inputs must be a dict of the processor's outputs \(or None\), got list"),
    "all-padding": (lambda ids, mask, inputs: (ids, torch.cat((mask[:1] * 0, mask[1:])), inputs), False,
                    r"sample 0 has no valid token"),
    "grid-list": (_grid(lambda grid: grid.tolist()), False,
                  r"image_grid_thw must be a tensor of shape \(N, 3\), got list; convert with torch.as_tensor"),
    "grid-shape": (_grid(lambda grid: grid[:, :2]), False,
                   r"image_grid_thw must be an integer tensor of shape \(N, 3\), got torch.int64 \(\d, 2\)"),
    "grid-float": (_grid(lambda grid: grid.float()), False,
                   r"image_grid_thw must be an integer tensor of shape \(N, 3\), got torch.float32"),
    "grid-complex": (_grid(lambda grid: grid.to(torch.complex64)), False,
                     r"image_grid_thw must be an integer tensor of shape \(N, 3\), got torch.complex64"),
    "grid-zero": (_grid(_set(0, 0, 0)), False, r"image_grid_thw row 0 is \(0, \d+, \d+\): every size must be positive"),
    "grid-negative": (_grid(_set(0, 1, -4)), False,
                      r"image_grid_thw row 0 is \(\d+, -4, \d+\): every size must be positive"),
    "grid-too-large": (_grid(_set(0, 0, 2**63 - 1)), False,
                       r"image_grid_thw row 0 is \(9223372036854775807, \d+, \d+\): the grids up to it need more "
                       r"placeholder tokens than the batch's \d+ tokens hold"),
}


ONE_D = {"Gemma4"}  # 1-D positions read only the ids, the mask and that the inputs are a dict
CASES = [(name, impl, row) for name, impl in FAMILIES for row in sorted(EVERY_FAMILY)
         if name not in ONE_D or EVERY_FAMILY[row][1]]


@pytest.mark.parametrize("name, impl, row", CASES, ids=[f"{name}-{impl}-{row}" for name, impl, row in CASES])
def test_every_family_refuses_the_same_input_with_the_same_error(name, impl, row):
    change, _, message = EVERY_FAMILY[row]
    built = engine(name, impl)
    assert (built.rope_kind == "1d") == (name in ONE_D)
    error_name, _ = catalogue()[row]
    ids, mask, inputs = change(*family_batch(name))
    before = {key: value.clone() for key, value in family_batch(name)[2].items() if isinstance(value, torch.Tensor)}
    with pytest.raises(getattr(errors, error_name)) as caught:
        built.compute_position_ids(ids, mask, inputs)
    assert type(caught.value).__name__ == error_name
    assert re.search(message, str(caught.value)), f"{name} ({impl}), {row}: {caught.value}"
    assert all(torch.equal(value, family_batch(name)[2][key]) for key, value in before.items())
