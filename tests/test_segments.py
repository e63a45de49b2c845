"""What mmrope sees a model do with a packed row, on a tiny random model built from its config, to
decide whether a packed row trains as its samples alone. ``tests/models`` checks the answers at
the model for every example case; these check each cause on real configs, including model types
whose processors do not build offline, and on model code written to mix segments."""

from __future__ import annotations

import types

import pytest
import transformers
from packaging.version import Version
from transformers import CONFIG_MAPPING

from mmrope_core import PackingUnsupportedError, RopeBinding
from mmrope_core.measured import keeps_segments_apart, packed_segments_differ
from mmrope_core.segments import packed_row_support

#: transformers 5.24 or newer, whose model code the docs' first table describes
NEWEST = Version(transformers.__version__) >= Version("5.24")


def support(config, mixes_segments=""):
    engine = types.SimpleNamespace(processor=None, config=config,
                                   binding=RopeBinding("1d", mixes_segments=mixes_segments))
    return packed_row_support(engine)


def qwen2_vl(**text):
    # the released checkpoints' sections, which transformers 5.10's attention reads from the config
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    return transformers.Qwen2VLConfig(text_config={"num_hidden_layers": 2, "rope_parameters": rope, **text})


def test_full_and_sliding_window_attention_keep_segments_apart():
    assert support(qwen2_vl(layer_types=["full_attention", "sliding_attention"], sliding_window=4,
                            use_sliding_window=True)).exact
    assert support(qwen2_vl()).exact


def test_layer_kinds_are_decided_by_what_the_layers_do_not_by_their_names():
    """A kind of layer is not refused for its name: Qwen2-VL's code builds sliding-window layers
    from ``sliding_attention`` entries, which keep segments apart (measured); an entry its code
    does not know makes the model fail, which refuses it with the model's own error."""
    config = qwen2_vl(layer_types=["sliding_attention", "sliding_attention"], sliding_window=4,
                      use_sliding_window=True)
    assert support(config).exact
    config.text_config.layer_types = ["full_attention", "mystery_attention"]
    found = support(config)
    assert not found.exact and "mmrope cannot see what its model does with a packed row" in found.mixes


def test_linear_attention_needs_the_kernels_that_read_the_boundaries(monkeypatch):
    """Qwen3.5's linear-attention layers carry state along the row (read off the built modules: a
    causal convolution and a recurrent mixer); without the kernels that take the boundaries they
    are refused, and with kernels said to be there but PyTorch's fallbacks running, the row given
    its boundaries is measured to still differ (tests/models runs stand-ins of the real kernels)."""
    config = transformers.Qwen3_5Config(text_config={"layer_types": ["full_attention", "linear_attention"],
                                                     "num_hidden_layers": 2})
    found = support(config)
    assert "its linear_attention layers carry state along the row" in found.mixes
    assert "only the kernels of causal-conv1d and flash-linear-attention take the segments' boundaries" in found.mixes
    assert "Install causal-conv1d and flash-linear-attention on a GPU machine" in found.advice
    import transformers.utils.import_utils as import_utils

    monkeypatch.setattr(import_utils, "is_causal_conv1d_available", lambda: True)
    assert "flash-linear-attention is not available" in support(config).mixes
    monkeypatch.setattr(import_utils, "is_flash_linear_attention_available", lambda: True)
    found = support(config)
    assert "even given the segments' boundaries" in found.mixes and not found.exact


def test_boundaries_asked_by_a_model_are_required_of_the_rows():
    found = packed_row_support_of(boundaries="linear_attention")
    found.require()  # the packing collator gives the boundaries
    with pytest.raises(PackingUnsupportedError, match="keep the segments apart only when given their boundaries"):
        found.require("LLaMA-Factory's neat_packing rows", gives_boundaries=False)


def packed_row_support_of(**fields):
    from mmrope_core.segments import PackedRowSupport

    return PackedRowSupport("qwen3_5 (a text-only model)", **fields)


@pytest.mark.parametrize("model_type, setting", [("gemma3", {"use_bidirectional_attention": True}),
                                                 ("gemma4", {"use_bidirectional_attention": "all"}),
                                                 ("gemma3", {"is_causal": False})])
def test_bidirectional_text_attention_is_measured(model_type, setting):
    """The model above a text config asking for bidirectional attention may build a mask of its
    own: the answer is what a tiny model of the config measures (on transformers 5.24, each of
    these mixes the segments)."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    config = transformers.AutoConfig.for_model(model_type)
    for key, value in setting.items():
        setattr(config.text_config, key, value)
    found = support(config)  # Gemma3's image overlay is measured first, and refuses it on its own
    assert found.exact == keeps_segments_apart(packed_segments_differ(config))
    if NEWEST:
        assert "its text attention is bidirectional" in found.mixes or "a mask overlay" in found.mixes, found.mixes
    if not found.exact:
        assert "measured on a tiny random model of its config, a packed segment differs" in found.mixes


def test_what_the_binding_says_comes_first():
    found = support(qwen2_vl(), mixes_segments="its image tokens attend both ways")
    assert found.mixes == "its image tokens attend both ways" and "PaddedCollator" in found.advice


def test_a_mask_overlay_is_measured_on_a_tiny_model_of_the_config():
    """Every config is measured: Gemma3's overlay (image tokens attending to one another) mixes a
    packed row's segments on 5.24, and the row with every token of one type does not, which names
    the cause; Gemma4's, built only for ``use_bidirectional_attention="vision"``, does not by
    default. (tests/models measures the answers with images.)"""
    assert support(qwen2_vl()).exact
    configs = [transformers.AutoConfig.for_model("gemma3")]
    if "gemma4" in CONFIG_MAPPING:
        configs += [transformers.AutoConfig.for_model("gemma4"), transformers.AutoConfig.for_model("gemma4")]
        configs[-1].text_config.use_bidirectional_attention = "vision"
    found = [support(config) for config in configs]
    for config, answer in zip(configs, found):
        assert answer.exact == keeps_segments_apart(packed_segments_differ(config))
    if NEWEST:  # transformers 5.10 cuts Gemma3's and Gemma4's image blocks at the boundaries
        assert found[0].mixes.startswith("Gemma3Model lets tokens of some types attend to one another (a mask overlay")
        assert "measured on a tiny random model of its config, a packed segment differs" in found[0].mixes
        assert found[1].exact and "Gemma4Model lets tokens of some types attend to one another" in found[2].mixes


class PeekingConfig(transformers.LlamaConfig):
    model_type = "mmrope_test_peeking"


class PeekingModel(transformers.LlamaModel):
    """A model whose code lets tokens of type 1 attend to one another both ways through a mask
    overlay (as Gemma3 lets image tokens), set the way model code may set it: by a key of a dict
    of mask arguments, never as a literal keyword."""

    config_class = PeekingConfig

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, token_type_ids=None, **kwargs):
        import inspect

        import torch
        from transformers.masking_utils import create_causal_mask

        embeds = self.embed_tokens(input_ids)
        length = embeds.shape[1]
        position_ids = torch.arange(length)[None] if position_ids is None else position_ids
        takes = inspect.signature(create_causal_mask).parameters
        mask_kwargs = {"config": self.config, "attention_mask": attention_mask, "position_ids": position_ids,
                       "inputs_embeds" if "inputs_embeds" in takes else "input_embeds": embeds}
        mask_kwargs.update({key: value for key, value in (("cache_position", torch.arange(length)),
                                                          ("past_key_values", None), ("cache", None)) if key in takes})
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        mask_kwargs["or_mask_function"] = lambda batch, head, query, key: (types[batch, query] == 1) & (
            types[batch, key] == 1)
        mask = create_causal_mask(**mask_kwargs)
        return super().forward(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False)


def peeking_config():
    transformers.AutoConfig.register(PeekingConfig.model_type, PeekingConfig, exist_ok=True)
    transformers.AutoModel.register(PeekingConfig, PeekingModel, exist_ok=True)
    return PeekingConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, pad_token_id=None, bos_token_id=None, eos_token_id=None)


def test_a_mask_overlay_set_through_a_dict_is_caught_by_the_measurement():
    """Whatever the code's spelling, the packed row is measured: the answer is what the model does
    with a packed row built by hand (on transformers 5.24, which reads the overlay at each token's
    position within its segment, a later segment's tokens read the first one's types: refused)."""
    import torch

    config = peeking_config()
    found = support(config)
    torch.manual_seed(0)
    model = PeekingModel(config).eval()
    rows = [torch.randint(1, 64, (1, length)) for length in (6, 5)]
    types = [torch.tensor([[0, 0, 1, 1, 1, 1]]), torch.tensor([[0, 0, 0, 0, 1]])]
    with torch.no_grad():
        alone = [model(input_ids=row, token_type_ids=kinds).last_hidden_state[0] for row, kinds in zip(rows, types)]
        positions = torch.cat([torch.arange(6), torch.arange(5)])[None]
        packed = model(input_ids=torch.cat(rows, 1), token_type_ids=torch.cat(types, 1),
                       position_ids=positions).last_hidden_state[0]
    difference = max(float((mine - own).abs().max()) for mine, own in zip(packed.split([6, 5]), alone))
    assert found.exact == (difference < 1e-4), (found.mixes, difference)
    if NEWEST:
        assert difference > 1e-3 and "PeekingModel lets tokens of some types attend to one another" in found.mixes
        assert "measured on a tiny random model of its config, a packed segment differs" in found.mixes


def test_a_config_without_a_model_class_is_refused_with_the_reason():
    """A config class transformers maps to no model class cannot be built to see what it does: it is
    refused, saying so, never taken to keep segments apart."""

    class UnmappedConfig(transformers.LlamaConfig):
        model_type = "mmrope_test_unmapped"

    found = support(UnmappedConfig(num_hidden_layers=2))
    assert not found.exact
    assert "transformers' auto mappings give its config class UnmappedConfig no model class" in found.mixes
    with pytest.raises(PackingUnsupportedError, match="mmrope cannot see what its model does with a packed row"):
        found.require()


def test_a_model_whose_forward_fails_is_refused_with_the_reason():
    class FailingConfig(PeekingConfig):
        model_type = "mmrope_test_failing"

    class FailingModel(PeekingModel):
        config_class = FailingConfig

        def forward(self, *args, **kwargs):
            raise RuntimeError("no packed rows here")

    transformers.AutoModel.register(FailingConfig, FailingModel, exist_ok=True)
    found = support(FailingConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, vocab_size=64))
    assert "fails on a packed row of text (RuntimeError: no packed rows here)" in found.mixes


def test_a_model_whose_layers_mmrope_cannot_see_is_refused():
    """Without a config nothing says what the layers are; layers built without attention modules
    are recurrent or state-space layers (RWKV, Mamba, xLSTM), which carry state along the row."""
    assert "the engine has no model config" in support(None).mixes
    assert "RopeEngine.from_pretrained(path)" in support(None).advice
    for model_type in ("rwkv", "mamba", "mamba2", "xlstm", "falcon_mamba"):
        if model_type in CONFIG_MAPPING:
            found = support(transformers.AutoConfig.for_model(model_type))
            assert "hold no attention" in found.mixes and "carry state along the row" in found.mixes, model_type


#: Model types whose processors do not build offline, and what their default configs say.
DEFAULT_CONFIGS = {
    "llama4": "",  # rows up to its floor_scale: test_llama4_packs_rows_shorter_than_its_limit
    "lfm3_vl": "its conv layers carry state",
    "florence2": "it is an encoder-decoder model",
    "idefics": "its cross-attention layers",
    "minicpm_ocr": "its linear_attention layers",
    "smolvlm": "",
    "mistral3": "",
    "phi4_multimodal": "",
    "lfm2_vl": "",  # its default layers are all attention; a checkpoint listing conv layers is refused
}


@pytest.mark.parametrize("model_type", [model_type for model_type in DEFAULT_CONFIGS if model_type in CONFIG_MAPPING])
def test_default_configs_of_model_types_without_an_offline_processor(model_type):
    found = support(transformers.AutoConfig.for_model(model_type))
    assert (found.mixes[: len(DEFAULT_CONFIGS[model_type])] == DEFAULT_CONFIGS[model_type]
            if DEFAULT_CONFIGS[model_type] else found.exact), found.mixes


def test_per_layer_attention_heads_are_read_per_layer():
    """dots3's layers differ in their head counts, which transformers refuses to read globally:
    the answer comes from the layers. Its indexer layers score keys under the mask that holds the
    boundaries, so a packed row of samples up to index_topk tokens is its samples alone; measured
    on a tiny text model whose layers differ in their heads too."""
    if "dots3_note" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no dots3_note")
    import torch

    config = transformers.AutoConfig.for_model("dots3_note")
    found = support(config)
    assert found.exact and found.max_sample_tokens == config.text_config.index_topk
    with pytest.raises(PackingUnsupportedError, match=r"sample 1 of a packed row has 2049 tokens, more than"):
        found.require_lengths([5, 2049])
    values = {**config.text_config.to_dict(), "hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 32,
              "shared_experts_intermediate_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
              "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
              "head_dim": 32, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "vocab_size": 64, "num_hidden_layers": 3, "sliding_window": 4,
              "layer_types": ["indexed_attention", "sliding_attention", "indexed_attention"],
              "mlp_layer_types": ["dense", "sparse", "sparse"], "pad_token_id": None, "bos_token_id": None,
              "eos_token_id": None, "per_layer_config": {"1": {"num_attention_heads": 4, "num_key_value_heads": 4}}}
    text = type(config.text_config).from_dict(values)
    assert support(text).max_sample_tokens == 8
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(text).eval()
    lengths = [5, 8, 6]
    ids = [torch.randint(1, 64, (1, n)) for n in lengths]
    with torch.no_grad():
        alone = [model(input_ids=row, use_cache=False).last_hidden_state[0] for row in ids]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        packed = model(input_ids=torch.cat(ids, 1), position_ids=positions, use_cache=False).last_hidden_state[0]
    for mine, own in zip(packed.split(lengths), alone):
        torch.testing.assert_close(mine, own, rtol=1e-4, atol=1e-5)


def test_minimax_m3_sparse_layers_are_refused_for_their_indexer():
    if "minimax_m3_vl" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no minimax_m3_vl")
    config = transformers.AutoConfig.for_model("minimax_m3_vl")
    config.text_config.layer_types = ["full_attention", "minimax_m3_sparse"]
    found = support(config)
    assert "indexer pools the keys into blocks by their slot in the row" in found.mixes
    assert "position ids, which restart in each segment" in found.mixes
    assert "measured on a tiny random model of its config, a packed segment differs" in found.mixes
    config.text_config.layer_types = ["full_attention", "full_attention"]
    assert support(config).exact  # the same model without the sparse layers: measured apart


def test_llama4_packs_rows_shorter_than_its_limit():
    """Llama 4's NoPE layers take their attention temperature from the token's index in the row: a
    packed row is its samples alone below floor_scale, and refused past it; its chunked layers
    are cut at the boundaries at any length where this transformers does so (measured), else
    rows are refused past a chunk. Checked on a tiny text model."""
    if "llama4" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no llama4")
    import torch

    text = {"hidden_size": 64, "intermediate_size": 64, "intermediate_size_mlp": 64, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 4, "vocab_size": 64,
            "num_local_experts": 2, "attention_chunk_size": 16, "floor_scale": 12, "attn_scale": 0.5,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
    config = transformers.Llama4Config(text_config=text)
    found = support(config)
    assert found.exact and found.max_tokens == 11 and "floor_scale=12" in found.limit
    found.require_lengths([5, 6])
    with pytest.raises(PackingUnsupportedError, match=r"a packed row of 12 tokens is longer .* at most 11 tokens"):
        found.require_lengths([6, 6])

    def worst(lengths, **changes):
        torch.manual_seed(0)
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**{**text, **changes})).eval()
        ids = [torch.randint(1, 64, (1, n)) for n in lengths]
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        with torch.no_grad():
            packed = model(input_ids=torch.cat(ids, 1), position_ids=positions, use_cache=False).logits[0]
            alone = [model(input_ids=row, use_cache=False).logits[0] for row in ids]
        return max(float((mine - own).abs().max()) for mine, own in zip(packed.split(lengths), alone))

    assert worst([5, 6]) < 1e-5  # 11 tokens: each segment as its sample alone
    assert worst([6, 8]) > 1e-4  # 14 tokens: the last ones read another temperature
    # chunks of 16 tokens: transformers 5.24 cuts them at the boundaries, so rows longer than a chunk
    # pack exactly too; 5.10 counts them from the row's first token, so a row is refused past a chunk
    chunked = support(transformers.Llama4Config(text_config={**text, "floor_scale": 8192}))
    long_rows = worst([20, 20], floor_scale=8192)
    assert chunked.max_tokens == (8191 if long_rows < 1e-5 else 16), (chunked, long_rows)
    if NEWEST:
        assert long_rows < 1e-5


def test_a_prefix_lm_mask_cut_at_the_boundaries_is_measured_exact():
    """PaliGemma's text config asks for bidirectional attention; its model replaces that with a
    prefix-LM mask (bidirectional over the image and prompt) which transformers cuts at the
    segments' boundaries: measured on a tiny model, and a config that cannot be built is refused."""
    config = transformers.AutoConfig.for_model("paligemma")
    assert config.text_config.use_bidirectional_attention is True
    assert support(config).exact == keeps_segments_apart(packed_segments_differ(config))
    if NEWEST:  # transformers 5.10 lets a later segment's prefix attend to an earlier one's
        assert packed_segments_differ(config) < 1e-4 and support(config).exact
    unknown = types.SimpleNamespace(num_attention_heads=2, use_bidirectional_attention=True)  # no model to build
    assert packed_segments_differ(unknown) is None
    assert "mmrope cannot see what its model does with a packed row" in support(unknown).mixes


def test_positions_not_shown_to_be_a_samples_own_are_refused():
    """A reference get_rope_index that mmrope could not show to give a sample its own positions
    wherever it stands in a batch (no probe for its model type, or a probe that fails) refuses
    packing, though its layers keep segments apart."""
    kernel = types.SimpleNamespace(samples_independent=False, rope_rows=3)
    engine = types.SimpleNamespace(processor=None, config=qwen2_vl(), binding=types.SimpleNamespace(
        mixes_segments="", kernel=kernel))
    found = packed_row_support(engine)
    assert "mmrope cannot show that its get_rope_index gives a sample the positions it gives it alone" in found.mixes
    kernel.samples_independent = True
    assert packed_row_support(engine).exact


@pytest.mark.parametrize("model_type", ["mistral_large4", "hy_v4_vl", "dots3_note", "glm5_next"])
def test_latent_and_indexed_attention_models_are_measured(model_type):
    """Latent attention (MLA) and indexers (DSA) shrink to a tiny model that runs: the answer is
    measured, never read off the config alone; samples are limited to the indexer's index_topk."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    from mmrope_core.measured import behaviour

    config = transformers.AutoConfig.for_model(model_type)
    seen = behaviour(config)
    assert not seen.failure and seen.difference is not None, seen.failure
    assert seen.layers.indexed, seen.layers
    found = support(config)
    assert found.exact == keeps_segments_apart(seen.difference), found.mixes
    if found.exact:
        assert found.max_sample_tokens == config.text_config.index_topk


class ByRows:
    def forward(self, input_ids, pixel_values=None, grids=None, images_per_sample=None):
        split = grids.split(images_per_sample.tolist())
        for row in range(input_ids.shape[0]):
            pixel_values = self.encode(pixel_values, split[row])
        return pixel_values


class BySamples:
    def forward(self, input_ids, pixel_values=None, grids=None, images_per_sample=None):
        split = grids.split(images_per_sample.tolist())
        return self.encode(pixel_values, [grid[:-1] for grid in split])


def test_media_handed_to_rows_by_per_sample_counts_are_found_in_the_forward():
    """A forward taking counts of media per sample that indexes what it splits by them with a loop
    over the batch's rows (GLM-Image on transformers 5.10) hands a packed row the first sample's
    media; one that splits them per sample (5.24) does not."""
    from mmrope_core.measured import media_by_rows

    assert media_by_rows(ByRows) == ("images_per_sample",)
    assert media_by_rows(BySamples) == ()
