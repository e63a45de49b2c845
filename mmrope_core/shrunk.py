"""A config made tiny, with the layers it describes kept: what :mod:`mmrope_core.measured` builds
a random model of, to see what the model does with a packed row.

Every size becomes small (widths 32, heads of 16, latent and indexer ranks of 16, 4 experts of
which 2 are routed), wherever the config or a sub-config holds it; a stack keeps one layer of
each combination of kinds its per-layer lists name (at least two), and every per-layer list
follows; RoPE sections are rescaled to the smaller rotary size, those the model code defaults to
too (read off the model built on the meta device). Settings passed in are set where held.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

WIDTH = 32
HEAD = 16
#: The tiny value of each size key, wherever a config or sub-config holds it (a positive int).
_WIDTH_KEYS = ("hidden_size", "embed_dim", "d_model", "out_hidden_size", "output_dim", "projection_dim",
               "projector_hidden_size", "text_hidden_size", "thinker_hidden_size", "downsample_hidden_size",
               "latent_channels", "q_lora_rank", "adapter_in_dim", "adapter_out_dim",
               "adapter_input_size", "adapter_output_size")
_FEED_FORWARD = ("intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "shared_experts_intermediate_size",
                 "shared_intermediate_size", "dense_intermediate_size", "intermediate_size_mlp")
_WIDTHS = frozenset(_WIDTH_KEYS + _FEED_FORWARD + ("vision_output_dim",))
SIZES: dict[str, int] = {
    **dict.fromkeys(_WIDTH_KEYS, WIDTH),
    **dict.fromkeys(_FEED_FORWARD, 2 * WIDTH),
    **dict.fromkeys(("num_attention_heads", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
                     "attention_heads", "index_n_heads"), 2),
    "num_key_value_heads": 2,  # as many as query heads: latent attention (MLA) asks for it
    **dict.fromkeys(("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_head_dim",
                     "rotary_dim"), HEAD),
    "qk_head_dim": 2 * HEAD,
    # the measured samples have at most 8 tokens: an indexer keeping 8 keys keeps all of a sample's
    "index_topk": 8,
    # blocks of 2 keys, 2 of them kept: a packed row of 22 tokens is pooled into many blocks
    **dict.fromkeys(("index_block_size", "index_topk_blocks", "index_kpool"), 2),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k", "moe_topk", "top_k_experts"), 2),
    **dict.fromkeys(("n_shared_experts", "moe_num_shared_experts", "num_global_layers", "n_group", "topk_group"), 1),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads", "linear_num_heads"), 2),
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "hidden_size_per_layer_input",
                     "hc_lowrank"), 8),
    # limits on the row's length, found apart (:func:`mmrope_core.segments._row_limit`): past the row
    **dict.fromkeys(("floor_scale", "attention_chunk_size"), 1 << 20),
    "vision_output_dim": 2 * WIDTH,  # the width times (one intermediate layer + the last)
}
#: Layer counts: a stack keeps one layer of each kind, at least :data:`MIN_LAYERS`.
LAYER_COUNTS = ("num_hidden_layers", "depth", "encoder_layers", "decoder_layers")
MIN_LAYERS = 2
#: Lists of layer indices (full-attention vision blocks, deepstack taps...): the last layer kept.
INDEX_LISTS = ("fullatt_block_indexes", "deepstack_visual_indexes", "cross_attention_layers",
               "intermediate_layers_indices")
SECTIONS = ("mrope_section", "xdrope_section")


def model_class(config: Any) -> type | None:
    """The model class transformers' auto mappings give ``config``'s class: its base model first,
    else its image-text-to-text or multimodal LM class; None where it maps to none."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return None
    for mapping in ("MODEL_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "MODEL_FOR_MULTIMODAL_LM_MAPPING"):
        try:
            found = getattr(modeling_auto, mapping)[type(config)]
        except (KeyError, AttributeError, ImportError, ValueError):  # not in this mapping, or not importable
            continue
        return found[0] if isinstance(found, (tuple, list)) else found
    return None


def tiny_config(config: Any, settings: Mapping[str, int], sections: str = "", *, ratios: bool = False,
                width: int = WIDTH) -> Any:
    """A tiny copy of ``config`` (see the module docstring), ``settings`` set where held; with
    ``sections`` (``"mrope_section"``), RoPE sections stated where the config leaves them out and
    its model reads them (rows of text: equal position rows, so any split gives the same). With
    ``ratios``, a feed-forward size the config makes narrower than its width keeps its ratio to it
    (for configs whose checks tie the two); ``width`` scales every width (head counts some models
    derive from a width, as one head per 64, need more than :data:`WIDTH`)."""
    values = config.to_dict()
    _shrink(values, settings, sections, _Sizing(ratios, width / WIDTH))
    return type(config).from_dict(values)


class _Sizing(NamedTuple):
    ratios: bool = False
    scale: float = 1.0

    def size(self, key: str, value: int, hidden: Any) -> int:
        """The tiny value of size ``key`` (``value`` in the config, whose width is ``hidden``)."""
        if key in _FEED_FORWARD and self.ratios and isinstance(hidden, int) and 0 < value < hidden:
            return max(1, value * int(WIDTH * self.scale) // hidden)
        return int(SIZES[key] * self.scale) if key in _WIDTHS else SIZES[key]


_PLAIN_SIZING = _Sizing()


def fit_rope_sections(model_type: type, config: Any) -> None:
    """Sections the model code defaults to, rescaled like those the config states: the model built
    on the meta device shows each rotary module's sections and frequencies."""
    import torch

    with torch.device("meta"):
        model = model_type(config)
    for module in model.modules():
        module_config = getattr(module, "config", None)
        for name in SECTIONS:
            sections = getattr(module, name, None)
            if module_config is None or not sections:
                continue
            per_kind = sections if isinstance(sections, dict) else {None: sections}
            for kind, value in per_kind.items():
                frequencies = getattr(module, "inv_freq" if kind is None else f"{kind}_inv_freq", None)
                if frequencies is None or not isinstance(value, list) or sum(value) == frequencies.shape[-1]:
                    continue
                parameters = module_config.rope_parameters
                parameters = parameters if kind is None else parameters[kind]
                parameters[name] = _rescaled(value, frequencies.shape[-1])


def _sub_dicts(values: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for value in values.values():
        if isinstance(value, dict) and ("model_type" in value or "hidden_size" in value):
            yield value


def _shrink(values: dict[str, Any], settings: Mapping[str, int], sections: str = "",
            sizing: _Sizing = _PLAIN_SIZING) -> None:
    default = dict(values)
    for key in SIZES:
        value = values.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            values[key] = sizing.size(key, value, default.get("hidden_size"))
        elif isinstance(value, list) and value and all(isinstance(item, int) and item > 0 for item in value):
            values[key] = [sizing.size(key, item, default.get("hidden_size")) for item in value]
    if isinstance(values.get("head_dim"), int) and values["head_dim"] > 0:
        latent = [default.get(key) for key in ("qk_nope_head_dim", "qk_rope_head_dim")]
        # a latent attention's head: its RoPE part, or the sum of its no-RoPE and RoPE parts
        values["head_dim"] = (2 * HEAD if all(isinstance(size, int) and size > 0 for size in latent)
                              and default["head_dim"] != latent[1] else round(HEAD / _partial_rotary_factor(values)))
    for key, value in settings.items():
        if key in values:
            values[key] = value
    _shrink_layers(values, default)
    for parameters in _rope_parameter_sets(values):
        if sections and sections not in parameters and _rotary_half(values, parameters):
            half = _rotary_half(values, parameters)
            pair = max(1, half * 3 // 8)  # two equal sections and the rest (ERNIE pairs h with w)
            parameters[sections] = [pair, pair, half - 2 * pair]
        for name in SECTIONS:
            if isinstance(parameters.get(name), list) and _rotary_half(values, parameters):
                parameters[name] = _rescaled(parameters[name], _rotary_half(values, parameters))
    # the measured rows hold ids below 64; the config's own token ids stay within the vocabulary
    ids = [value for key, value in values.items() if key.endswith("token_id") and isinstance(value, int)]
    for key, value in list(values.items()):
        if key.startswith("vocab_size") and isinstance(value, int) and not isinstance(value, bool):
            values[key] = max([min(value, 1024), *(token + 1 for token in ids)])
    for sub in _sub_dicts(values):
        _shrink(sub, settings, sections, sizing)
    layers = values.get("per_layer_config")
    if isinstance(layers, dict) and not all(str(index).isdigit() for index in layers):
        for overrides in layers.values():  # per layer kind: sized like the config
            if isinstance(overrides, dict):
                _shrink(overrides, settings, sizing=sizing)


def _shrink_layers(values: dict[str, Any], default: Mapping[str, Any]) -> None:
    """One layer of each combination of kinds the per-layer lists name (at least ``MIN_LAYERS``),
    every per-layer list and per-layer override following the layers kept."""
    key = next((key for key in LAYER_COUNTS if isinstance(values.get(key), int)), None)
    if key is None:
        return
    count = values[key]
    # kinds named per layer, and per-layer flags (Llama 4's NoPE layers)
    kind_lists = [value for value in values.values() if isinstance(value, list) and len(value) == count
                  and (all(isinstance(item, str) for item in value) or all(item in (0, 1) for item in value))]
    no_rope = values.get("no_rope_layers")
    first: dict[tuple[str, ...], int] = {}
    for index, kinds in enumerate(zip(*kind_lists)):
        first.setdefault(kinds, index)
    keep = sorted(first.values())
    keep = sorted(keep + [index for index in range(count) if index not in keep][: max(0, MIN_LAYERS - len(keep))])
    for name, value in list(values.items()):
        if isinstance(value, list) and len(value) == count and name not in SIZES:
            values[name] = [value[index] for index in keep]
            if all(isinstance(item, int) and 0 <= item <= index for index, item in enumerate(value)) and \
                    any(item > 1 for item in value):  # each layer's earlier layer (a shared cache): renumbered
                values[name] = [keep.index(value[old]) if value[old] in keep else new for new, old in enumerate(keep)]
    layers = values.get("per_layer_config")
    if isinstance(layers, dict) and all(str(index).isdigit() for index in layers):
        by_index = {int(index): overrides for index, overrides in layers.items()}
        values["per_layer_config"] = {str(new): _scaled(by_index[old], default, values)
                                      for new, old in enumerate(keep) if old in by_index}
    values[key] = len(keep)
    for name in INDEX_LISTS:
        if isinstance(values.get(name), list) and values[name]:
            values[name] = [len(keep) - 1]
    if isinstance(no_rope, list) and len(no_rope) != count:  # indices, not flags: those kept, renumbered
        values["no_rope_layers"] = [new for new, old in enumerate(keep) if old in no_rope]


def _scaled(overrides: Mapping[str, Any], default: Mapping[str, Any], tiny: Mapping[str, Any]) -> dict[str, Any]:
    """A layer's own sizes keep their ratio to the config's."""
    out = dict(overrides)
    for name, value in overrides.items():
        if name in _LATENT:  # latent attention sizes that must add up: as the config's
            out[name] = SIZES[name]
        elif isinstance(value, int) and isinstance(default.get(name), int) and default[name] and \
                default[name] != tiny.get(name):
            out[name] = max(1, value * tiny[name] // default[name])
    return out


_LATENT = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _rope_parameter_sets(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    rope = values.get("rope_parameters") or values.get("rope_scaling")
    if not isinstance(rope, dict):
        return []
    return [value for value in rope.values() if isinstance(value, dict)] or [rope]


def _partial_rotary_factor(values: Mapping[str, Any]) -> float:
    factors = [values.get("partial_rotary_factor") or 1.0]
    factors += [parameters.get("partial_rotary_factor") or 1.0 for parameters in _rope_parameter_sets(values)]
    return min(factors)


def _rotary_half(values: Mapping[str, Any], parameters: Mapping[str, Any]) -> int:
    heads = values.get("num_attention_heads") or 1
    head = (values.get("qk_rope_head_dim") or values.get("head_dim")
            or (values.get("hidden_size") or 0) // (heads if isinstance(heads, int) else 1))
    factor = parameters.get("partial_rotary_factor") or values.get("partial_rotary_factor") or 1.0
    return int(head * factor) // 2


def _rescaled(sections: list[int], total: int) -> list[int]:
    """``sections`` scaled to sum to ``total``, largest remainders first, none below 1."""
    exact = [section * total / sum(sections) for section in sections]
    out = [max(1, int(value)) for value in exact]
    for index in sorted(range(len(exact)), key=lambda index: int(exact[index]) - exact[index]):
        if sum(out) >= total:
            break
        out[index] += 1
    return out

