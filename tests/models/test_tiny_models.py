"""Every example case has a tiny random model of its real model class that runs its own forward
and backward on the case's samples, keeping the default config's layer kinds and attention options."""

import pytest
import torch
from tiny_models import LEFT_OUT, OVERRIDES, PROCESSOR_VALUES, SECTIONS, cases, names, tiny_model

from mmrope_transformers.models import computes_positions_with

pytestmark = pytest.mark.differential

#: Model types whose towers hand the language model discrete codes: no gradient reaches them.
DISCRETE_TOWERS = {"glm_image": "its vision tower's output is quantised into token ids"}
ATTENTION_OPTIONS = ("use_bidirectional_attention", "sliding_window", "use_sliding_window", "attention_chunk_size",
                     "sliding_window_pattern", "_sliding_window_pattern", "layer_types")


def test_every_example_case_has_a_tiny_model_or_a_reason():
    assert names(), "no example cases installed"
    assert set(LEFT_OUT) <= set(cases()), sorted(set(LEFT_OUT) - set(cases()))
    assert all(LEFT_OUT.values())


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", names())
def test_each_sample_runs_its_own_forward_and_backward(name, attn_implementation):
    tiny = tiny_model(name, attn_implementation)
    model = tiny.model
    assert model.dtype == torch.float32
    used = tiny.changes.get("attn_implementation", (None, attn_implementation))[1]
    assert model.config.get_text_config()._attn_implementation == used
    for index, sample in enumerate(tiny.samples):
        model.zero_grad(set_to_none=True)
        # the media as leaves that take a gradient: the loss must reach them through the towers
        media = {key: value.clone().requires_grad_() for key, value in sample.items()
                 if key.startswith(("pixel_values", "input_features")) and value.is_floating_point()}
        logits = model(**{**sample, **media}, use_cache=False).logits
        assert logits.shape[:2] == sample["input_ids"].shape, f"sample {index}"
        assert torch.isfinite(logits).all(), f"sample {index}"
        logits.square().mean().backward()
        gradients = [parameter.grad for parameter in model.parameters() if parameter.grad is not None]
        assert gradients and all(torch.isfinite(grad).all() for grad in gradients), f"sample {index}"
        if model.config.model_type not in DISCRETE_TOWERS:
            for key, value in media.items():
                assert value.grad is not None and value.grad.any(), f"sample {index}: no gradient reached {key}"
                assert torch.isfinite(value.grad).all(), f"sample {index}: {key}"
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", names())
def test_the_default_configs_layer_kinds_are_all_present(name):
    tiny = tiny_model(name)
    text = tiny.model.config.get_text_config()
    kinds = getattr(text, "layer_types", None) or ()
    assert set(kinds) == set(tiny.layer_kinds)
    assert len(kinds) in (0, text.num_hidden_layers)
    assert len(_decoder(tiny.model).layers) == text.num_hidden_layers


@pytest.mark.parametrize("name", names())
def test_nothing_changes_beyond_sizes_but_what_the_processor_states_and_the_overrides_set(name):
    tiny = tiny_model(name)
    model_type = tiny.model.config.model_type
    allowed = {*PROCESSOR_VALUES, "image_size", "attn_implementation"}
    overridden = tuple(OVERRIDES.get(model_type, ({}, ""))[0])
    for key in tiny.changes:
        assert key.rsplit(".", 1)[-1] in allowed or key.startswith(overridden), key
    default = dict(_items(_model_config(cases()[name].build()[1]).to_dict()))
    for path, value in _items(tiny.model.config.to_dict()):
        if path.rsplit(".", 1)[-1] in ATTENTION_OPTIONS and path in default:
            same_kinds = isinstance(value, list) and set(value) == set(default[path])
            assert value == default[path] or same_kinds, path


@pytest.mark.parametrize("name", names())
def test_rope_sections_follow_the_head_size(name):
    model = tiny_model(name).model
    checked = 0
    for module in model.modules():
        for section_name in SECTIONS:
            sections = _sections(module, section_name)
            if not sections:
                continue
            per_kind = sections if isinstance(sections, dict) else {None: sections}
            for kind, value in per_kind.items():
                frequencies = getattr(module, "inv_freq" if kind is None else f"{kind}_inv_freq", None)
                if frequencies is not None:
                    assert sum(value) == frequencies.shape[-1], (type(module).__name__, kind, value)
                    assert min(value) >= 1, value
                    checked += 1
    if any(computes_positions_with(type(module), "get_rope_index") for module in model.modules()
           if hasattr(type(module), "get_rope_index")):
        assert checked, "an M-RoPE model whose rotary modules state no sections"


@pytest.mark.parametrize("name", names())
def test_token_ids_are_the_tokenizers(name):
    tiny = tiny_model(name)
    tokenizer = tiny.processor.tokenizer
    config = tiny.model.config
    size = len(tokenizer)
    for path, value in _items(config.to_dict()):
        last = path.rsplit(".", 1)[-1]
        if last.endswith(("token_id", "token_index")) and isinstance(value, int):
            assert value < config.get_text_config().vocab_size, path
    for stem in ("image", "video", "audio"):
        token = getattr(tokenizer, f"{stem}_token", None)
        for key in (f"{stem}_token_id", f"{stem}_token_index"):
            if token is not None and getattr(config, key, None) is not None:
                assert getattr(config, key) == tokenizer.convert_tokens_to_ids(token), key
    for sample in tiny.samples:
        assert int(sample["input_ids"].max()) < size <= config.get_text_config().vocab_size


@pytest.mark.parametrize("name", names())
def test_vision_sizes_are_the_image_processors(name):
    tiny = tiny_model(name)
    vision = getattr(tiny.model.config, "vision_config", None)
    if vision is None and hasattr(tiny.model.config, "patch_size"):  # a decoder reading patches itself (Storyboard)
        vision = tiny.model.config
    image_processor = getattr(tiny.processor, "image_processor", None)
    if vision is None or image_processor is None:
        pytest.skip("no vision config or image processor")
    for config_key, processor_key in (("patch_size", "patch_size"), ("spatial_merge_size", "merge_size"),
                                      ("temporal_patch_size", "temporal_patch_size")):
        stated = getattr(image_processor, processor_key, None)
        if stated is not None and getattr(vision, config_key, None) is not None:
            assert getattr(vision, config_key) == stated, config_key


@pytest.mark.parametrize("name", names())
def test_the_same_weights_at_every_build_and_one_build_per_process(name):
    tiny = tiny_model(name)
    assert tiny_model(name) is tiny
    again = tiny_model.__wrapped__(name).model.state_dict()
    for key, value in tiny.model.state_dict().items():
        assert torch.equal(value, again[key]), key


def _sections(module, name):
    """A module's RoPE sections: its own, or, for a rotary module whose model's attention reads
    them from the config (some transformers releases), its config's."""
    sections = getattr(module, name, None)
    if sections is None and hasattr(module, "inv_freq"):
        parameters = getattr(getattr(module, "config", None), "rope_parameters", None)
        sections = parameters.get(name) if isinstance(parameters, dict) else None
    return sections


def _decoder(model):
    """The language model: what ``get_decoder`` gives, or, where it gives the Omni thinker itself
    (some transformers releases), the thinker's ``model``."""
    decoder = model.get_decoder()
    return decoder if hasattr(decoder, "layers") else decoder.model


def _model_config(config):
    return getattr(config, "thinker_config", None) or config


def _items(values, prefix=""):
    for key, value in values.items():
        if isinstance(value, dict) and "model_type" in value:
            yield from _items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
