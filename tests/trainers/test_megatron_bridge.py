"""Megatron-Bridge 0.3.1's Qwen3-VL and Qwen2.5-VL models, on their unchanged code, with and without
``mmrope_core.integrations.megatron_bridge.install()``: their position code, and their forwards
up to the language model (which needs Transformer Engine, and whose Megatron-core M-RoPE module
asks CUDA for a device when it is built), on CPU. Without the drop-in a packed row of several
segments raises (Qwen3-VL) or is placed as one sample (Qwen2.5-VL, whose transformers 5.x call
fails on every batch); with it every segment's positions are its sample's alone."""

from __future__ import annotations

import dataclasses
import inspect
import random
import warnings

import pytest
import torch
import transformers
from cases import loading_without_torchvision, reference_model_class
from parallel_cases import alone, engine_and_rows, without_package_init

from mmrope_core import InvalidInputError, RopeEngine
from mmrope_core.integrations import megatron_bridge as mmrope_megatron_bridge
from mmrope_core.reference import config_only_model

# the packages' __init__ import Transformer Engine (PEFT layers, conversion); the model modules do not
without_package_init("megatron.bridge", "megatron.bridge.models", "megatron.bridge.models.qwen_vl",
                     "megatron.bridge.models.qwen_vl.modelling_qwen3_vl")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron-core warns that neither Transformer Engine nor Apex is installed
    from megatron.bridge.models.qwen_vl import qwen25_vl_provider
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl import model as qwen3_vl_model
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import Qwen3VLTransformerConfig
    from megatron.core.packed_seq_params import PackedSeqParams


@pytest.fixture
def drop_in():
    """``install(engine)`` for one test, Megatron-Bridge's own code back afterwards."""
    yield mmrope_megatron_bridge.install
    mmrope_megatron_bridge.uninstall()


def packed(rows, pad_to=1):
    """One THD row of ``rows``: ids, each segment padded to a multiple of ``pad_to`` (pad id 0),
    the media in order, and Megatron-core's ``PackedSeqParams``."""
    lengths = torch.tensor([row["input_ids"].shape[1] for row in rows])
    padded_lengths = (lengths + pad_to - 1) // pad_to * pad_to
    bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).int()
    padded = torch.nn.functional.pad(padded_lengths.cumsum(0), (1, 0)).int()
    ids = torch.zeros(1, int(padded[-1]), dtype=torch.long)
    for start, row in zip(padded.tolist(), rows):
        ids[0, start:start + row["input_ids"].shape[1]] = row["input_ids"][0]
    media = {}
    for key in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "pixel_values"):
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            media[key] = torch.cat(values)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=bounds, cu_seqlens_kv=bounds,
                             cu_seqlens_q_padded=padded if pad_to > 1 else None,
                             cu_seqlens_kv_padded=padded if pad_to > 1 else None,
                             max_seqlen_q=int(lengths.max()), max_seqlen_kv=int(lengths.max()))
    return ids, media, params


def reference_alone(engine, row):
    """The sample's ``(3, L)`` positions from the installed transformers' own ``get_rope_index``,
    the sample alone (token types the processor's own, as the model reads them)."""
    model = config_only_model(reference_model_class(engine.config.model_type), engine.config)
    accepted = inspect.signature(model.get_rope_index).parameters
    arguments = {key: value for key, value in row.items() if key in accepted and key != "input_ids"}
    if "mm_token_type_ids" in accepted and "mm_token_type_ids" not in arguments:
        arguments["mm_token_type_ids"] = torch.tensor(engine.processor.create_mm_token_type_ids(
            row["input_ids"].tolist()))
    positions, _ = model.get_rope_index(input_ids=row["input_ids"], attention_mask=torch.ones_like(row["input_ids"]),
                                        **arguments)
    return positions[:, 0]


def assert_each_segment_alone(engine, rows, positions, params):
    """Every segment's positions are its sample's alone: mmrope's, and transformers' reference."""
    starts = params.cu_seqlens_q_padded if params.cu_seqlens_q_padded is not None else params.cu_seqlens_q
    for start, row in zip(starts.tolist(), rows):
        segment = slice(start, start + row["input_ids"].shape[1])
        assert torch.equal(positions[:, 0, segment], alone(engine, row, {})[1:])
        assert torch.equal(positions[:, 0, segment], reference_alone(engine, row))


# -- Qwen3-VL: the module's get_rope_index, which its forward calls -----------------------------


def token_ids(engine):
    """The image, video and vision-start ids of the processor's tokenizer (Megatron-Bridge's
    providers take them from the checkpoint's config, which names the same tokens)."""
    processor = engine.processor
    vision_start = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.vision_start_token)
    return {"image_token_id": processor.image_token_id, "video_token_id": processor.video_token_id,
            "vision_start_token_id": vision_start}


def qwen3_vl_call(engine, ids, media, params, attention_mask=None):
    tokens = token_ids(engine)
    return qwen3_vl_model.get_rope_index(engine.config.vision_config.spatial_merge_size, tokens["image_token_id"],
                                         tokens["video_token_id"], tokens["vision_start_token_id"], ids,
                                         image_grid_thw=media.get("image_grid_thw"),
                                         video_grid_thw=media.get("video_grid_thw"),
                                         attention_mask=attention_mask, packed_seq_params=params)


@pytest.mark.parametrize("pad_to", [1, 16])
def test_qwen3_vl_packed_positions(drop_in, pad_to):
    engine, rows, _ = engine_and_rows("Qwen3-VL")  # images and videos
    ids, media, params = packed(rows, pad_to)
    with pytest.raises(IndexError):  # each cu_seqlens length read as a batch row
        qwen3_vl_call(engine, ids, media, params)
    drop_in(engine)
    positions, _ = qwen3_vl_call(engine, ids, media, params)
    assert positions.shape == (3, 1, ids.shape[1])
    assert_each_segment_alone(engine, rows, positions, params)


def test_qwen3_vl_unpacked_batches_keep_their_positions(drop_in):
    engine, rows, _ = engine_and_rows("Qwen3-VL")
    row = rows[0]
    own, own_deltas = qwen3_vl_call(engine, row["input_ids"], row, None)
    # a right-padded batch of two rows with its 2-D mask
    width = max(each["input_ids"].shape[1] for each in rows[:2])
    ids = torch.cat([torch.nn.functional.pad(each["input_ids"], (0, width - each["input_ids"].shape[1]))
                     for each in rows[:2]])
    mask = torch.cat([torch.nn.functional.pad(torch.ones_like(each["input_ids"]), (0, width - each["input_ids"].shape[1]))
                      for each in rows[:2]])
    _, media, _ = packed(rows[:2])
    own_batch, _ = qwen3_vl_call(engine, ids, media, None, attention_mask=mask)
    drop_in(engine)
    mine, deltas = qwen3_vl_call(engine, row["input_ids"], row, None)
    assert torch.equal(mine, own) and torch.equal(deltas, own_deltas)
    mine_batch, _ = qwen3_vl_call(engine, ids, media, None, attention_mask=mask)
    valid = mask.bool()
    assert torch.equal(mine_batch[:, valid], own_batch[:, valid])


def test_qwen3_vl_forward_hands_the_language_model_the_engines_positions(drop_in, monkeypatch):
    """``Qwen3VLModel.forward``, unchanged, on a packed row: its position code runs and the
    language model, recorded here, receives the positions. Its NVTX profiling marks need a CUDA
    build of torch: no-ops here. The row is text: Megatron-Bridge 0.3.1 refuses videos, and its
    image path unpacks transformers 4.x's tuple from the vision tower, which transformers 5.x
    returns as one output object (shown last)."""
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda message: None)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    engine, images = image_rows("Qwen3-VL")
    rows = text_rows(engine, 3)
    ids, _, params = packed(rows, pad_to=8)
    model = qwen3_vl_up_to_the_language_model(engine)
    with pytest.raises(IndexError):
        model(ids, packed_seq_params=params)
    drop_in(engine)
    model(ids, packed_seq_params=params)
    call = model.language_model.calls[-1]
    assert call["packed_seq_params"] is params
    assert_each_segment_alone(engine, rows, call["position_ids"], params)
    ids, media, params = packed(images, pad_to=8)
    with pytest.raises(ValueError, match="too many values to unpack"):
        model(ids, packed_seq_params=params, pixel_values=media["pixel_values"], image_grid_thw=media["image_grid_thw"])


# -- Qwen2.5-VL: the get_rope_index it binds at construction ------------------------------------


def test_qwen2_5_vl_forward_places_each_segment_alone(drop_in):
    """``Qwen25VLModel.forward``, unchanged, on a packed row with images and videos given by their
    grids (the vision tower is not run: on transformers 5.x its image path fails before the
    positions, shown last); the language model, recorded here, receives the positions."""
    engine, rows, _ = engine_and_rows("Qwen2.5-VL")
    ids, media, params = packed(rows, pad_to=8)
    before = qwen2_5_vl_up_to_the_language_model(engine)
    with pytest.raises(AttributeError, match="get_vision_position_ids"):  # transformers 5.x's method, bound alone
        before(input_ids=ids, packed_seq_params=params, **media)
    drop_in(engine)
    model = qwen2_5_vl_up_to_the_language_model(engine)
    model(input_ids=ids, packed_seq_params=params, **media)
    call = model.language_model.calls[-1]
    assert call["packed_seq_params"] is params
    assert_each_segment_alone(engine, rows, call["position_ids"], params)
    # the row as one sample (what Megatron-Bridge's call without packed_seq_params computes)
    whole, _ = engine.get_rope_index(ids, None, **media)
    assert not torch.equal(whole, call["position_ids"])
    # a batch of one unpacked row: the engine's positions of the row
    row = rows[0]
    model(input_ids=row["input_ids"], **{key: value for key, value in row.items() if key != "input_ids"})
    assert torch.equal(model.language_model.calls[-1]["position_ids"], alone(engine, row, {})[1:, None])
    assert torch.equal(model.language_model.calls[-1]["position_ids"], reference_alone(engine, row)[:, None])
    _, images = image_rows("Qwen2.5-VL")
    with pytest.raises(AttributeError, match="return_dict"):  # transformers 5.x's get_image_features on the provider
        model(input_ids=images[0]["input_ids"], pixel_values=images[0]["pixel_values"],
              image_grid_thw=images[0]["image_grid_thw"])


def test_the_example_installs_the_checkpoints_engine(drop_in, checkpoint, capsys):
    """``examples/megatron_bridge_qwen_vl.py`` on a saved checkpoint: Megatron-Bridge's Qwen3-VL
    position code then places a packed row's segments as their samples alone."""
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "megatron_bridge_qwen_vl.py"))
    with loading_without_torchvision():  # the video processor's torchvision backend is not installed
        engine = example["main"](checkpoint("Qwen3-VL"))
    assert mmrope_megatron_bridge.installed() and "Megatron-Bridge" in capsys.readouterr().out
    _, rows, _ = engine_and_rows("Qwen3-VL")
    ids, media, params = packed(rows)
    positions, _ = qwen3_vl_call(engine, ids, media, params)
    assert_each_segment_alone(engine, rows, positions, params)


def test_a_packed_row_must_be_one_row_of_the_boundaries_length(drop_in):
    engine, rows, _ = engine_and_rows("Qwen3-VL")
    ids, media, params = packed(rows)
    drop_in(engine)
    with pytest.raises(InvalidInputError, match=r"\(1, T\) row"):
        qwen3_vl_call(engine, ids[:, :-1], media, params)
    lengths = params.cu_seqlens_q.diff()
    short = torch.nn.functional.pad((lengths - 1).cumsum(0), (1, 0)).int()  # every padded segment a token short
    crossed = dataclasses.replace(params, cu_seqlens_q_padded=short)
    with pytest.raises(InvalidInputError, match="each segment's real length must be at most its padded one"):
        qwen3_vl_call(engine, ids[:, :int(short[-1])], media, crossed)
    with pytest.raises(InvalidInputError, match="RopeEngine of an M-RoPE checkpoint"):
        drop_in(object())
    assert mmrope_megatron_bridge.installed()


# -- the models, built on CPU up to their language model -----------------------------------------


class LanguageModelCalls(torch.nn.Module):
    """Where the models hand over to Megatron-core's language model (Transformer Engine, CUDA):
    its embedding (zeros of the hidden size, ``[S, B, H]``), and the call, recorded."""

    def __init__(self, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.calls = []
        self.decoder = torch.nn.ModuleList([torch.nn.Identity()])  # Qwen3-VL counts the layers deepstack feeds

    def embedding(self, input_ids, position_ids):
        return torch.zeros(input_ids.shape[1], input_ids.shape[0], self.hidden_size)

    def shared_embedding_or_output_weight(self):
        return None

    def forward(self, **kwargs):
        self.calls.append(kwargs)
        return kwargs["position_ids"]


def image_rows(family):
    """The family's engine and three image samples as its processor outputs them (pixels included)."""
    from mmrope_qwen_vl.examples import build, image_samples

    processor, config = build(family)
    calls = image_samples(processor, random.Random(0))
    rows = [{key: value for key, value in processor(**call).items() if key != "attention_mask"} for call in calls]
    return RopeEngine.from_processor(processor, config), rows


def text_rows(engine, count):
    """``count`` samples of text alone, of different lengths."""
    tokenizer = engine.processor.tokenizer
    words = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("the cat sat on a mat and the dog ran"))
    return [{"input_ids": torch.tensor([words[: 4 + 3 * index]])} for index in range(count)]


def tiny_vision(family, engine):
    image = engine.processor.image_processor
    common = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
              "patch_size": image.patch_size, "temporal_patch_size": image.temporal_patch_size,
              "spatial_merge_size": image.merge_size}
    torch.manual_seed(0)
    if family == "Qwen3-VL":
        return transformers.Qwen3VLVisionConfig(**common, deepstack_visual_indexes=[0], num_position_embeddings=64)
    return transformers.Qwen2_5_VLVisionConfig(**common, fullatt_block_indexes=[0])


def qwen3_vl_up_to_the_language_model(engine):
    """``Qwen3VLModel`` as its ``__init__`` builds it, but for the language model: its vision
    tower is transformers' (tiny, random), the language model records its call."""
    tokens = token_ids(engine)
    language = Qwen3VLTransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=2, vocab_size=len(engine.processor.tokenizer),
        spatial_merge_size=engine.config.vision_config.spatial_merge_size, deepstack_visual_indexes=[0],
        mrope_section=[2, 3, 3], **tokens)
    model = qwen3_vl_model.Qwen3VLModel.__new__(qwen3_vl_model.Qwen3VLModel)
    qwen3_vl_model.MegatronModule.__init__(model, config=language)
    model.pre_process, model.post_process = True, True
    for name, value in tokens.items():
        setattr(model, name, value)
    model.vision_model = transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLVisionModel._from_config(
        tiny_vision("Qwen3-VL", engine))
    model.language_model = LanguageModelCalls(32)
    return model


def qwen2_5_vl_up_to_the_language_model(engine):
    """``Qwen25VLModel`` built by its own ``__init__`` from a provider whose
    ``provide_language_model`` (the provider's hook for it) records the call instead."""
    class Provider(qwen25_vl_provider.Qwen25VLModelProvider):
        def provide_language_model(self, pre_process=None, post_process=None, vp_stage=None):
            return LanguageModelCalls(32)

    provider = Provider(num_layers=1, hidden_size=32, num_attention_heads=2, vision_config=tiny_vision("Qwen2.5-VL", engine),
                        **token_ids(engine))
    return qwen25_vl_provider.Qwen25VLModel(provider)
