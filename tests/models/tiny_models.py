"""Tiny random models of the real transformers model class of every example case.

For each example case of the installed plugins (the ``example_cases`` hook), :func:`tiny_model`
builds the image-text-to-text (or multimodal LM) class that transformers' auto mappings give the
case's config (for Omni, the thinker's), from the case's default config made tiny, so that the
model runs its own forward on the case's samples exactly as the processor outputs them. A model
type that a plugin registers with transformers' auto classes (Storyboard's) is built the same
way, from its registration: its config class, and its model with a language-model head::

    tiny = tiny_model("Qwen3.5")
    for sample in tiny.samples:
        logits = tiny.model(**sample, use_cache=False).logits  # the model computes its positions

How a default config becomes tiny, the same way for every config and each of its sub-configs:

- sizes (:data:`SIZES`): widths 32, heads 2 of size 16 (or ``16 / partial_rotary_factor``,
  keeping rotary dimensions), 4 experts of which 2 are routed, small latent and indexer ranks;
  a layer's own sizes (Gemma4's global layers) keep their ratio to the config's;
- layers: one of each kind the per-layer lists name (``layer_types``, ``mlp_layer_types``,
  ``indexer_types``), at least two per stack; every per-layer list follows, layer index lists
  (full-attention vision blocks, deepstack taps, cross-attention layers) point at the last layer;
- RoPE sections (``mrope_section``, ``xdrope_section``) rescaled to the smaller rotary size, also
  those the model code defaults to (read off the model built on the meta device);
- what the model must share with the processor, from the processor: patch, merge and temporal
  patch sizes, the side of the pixel tiles, mel bins, tokens per image, grid pinpoints;
- token ids: those the case's build set, else the tokenizer's token of the same name, else a fresh
  id past the tokenizer's vocabulary (no sample holds it); vocabularies end after them;
- parameters initialised to one value (zeroed gates and projections, unit norms) get noise, so
  that every input reaches the logits and every parameter can get a gradient.

Attention options (sliding windows, bidirectional attention, ``layer_types`` kinds) stay as the
default config has them: the default Gemma4 config has ``use_bidirectional_attention=None``, so
its image tokens attend causally unless ``overrides`` asks for ``"vision"``. Where a default config
cannot run its model on the samples, :data:`OVERRIDES` says what is set and why; every change
beyond sizes shows in :attr:`TinyModel.changes`. With transformers 5.24 they are:

===============================  ==============================================================
case                             values changed beyond sizes and token ids
===============================  ==============================================================
Qwen3-VL, -MoE, Qwen3.5, -MoE,   ``vision_config.patch_size`` 16 -> 14 (the case's processor)
Qwen3-Omni, Qwen4-exp,
Cosmos3-Omni, Cohere-Compass
MiniCPM-V 4.7                    ``patch_size`` 16 -> 14 (the processor)
Qwen4-exp                        indexer sizes (none by default; budget 8, compress ratio 4)
Cohere-Compass                   ``rope_parameters`` per layer kind (empty by default)
HY-V4-VL                         eager attention (transformers has no sdpa for it)
GLM-Image                        VQ codebook of 4 codes (codes are token ids below its markers)
LLaVA, LLaVA-NeXT, -OneVision,   ``vision_config.image_size`` -> 56 (the processor's tiles);
Gemma3, InternVL, Idefics3,      grid pinpoints, tokens per image from the processor; Gemma3,
Mllama, Aria                     Idefics3, Aria: ``patch_size`` 14 (Aria: tiles of 980)
Qwen2.5-Omni, Qwen3-Omni         ``audio_config.num_mel_bins`` 128 -> 80 (the feature extractor)
Gemma4                           a default ``vision_config`` (None by default)
===============================  ==============================================================

With transformers 5.10 also: Qwen3-Omni's ``audio_config.n_window`` 100 -> 50, and Qwen2-VL,
Qwen2.5-VL, Qwen2.5-Omni and PaddleOCR-VL state the checkpoints' ``mrope_section``, which their
attention reads from the config there (5.24's rotary code defaults to the same sections). Cases
whose processor module imports torchvision for names the Pillow image processor's module also
defines (Gemma4 in 5.10) build with those names taken from the Pillow module
(:data:`TORCHVISION_FREE`).

On one CPU thread (transformers 5.24, a shared 2-core machine), building all 35 cases takes about
2 s after 3 s of imports and plugin loading, and a forward and backward pass of every sample
about 2 s, half of it Aria's: its processor outputs 980x980 tiles (4900 patches an image), about
0.5 s a sample; every other case takes under 0.1 s for all its samples together. These times
double when the other core is busy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import random
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from mmrope_core.shrunk import SECTIONS
from mmrope_core.shrunk import fit_rope_sections as _fit_rope_sections

#: Every width of every stack (text, vision, audio, projectors): equal widths leave no mismatch.
WIDTH = 32
#: Attention head size; with a partial rotary factor, this many rotary dimensions.
HEAD = 16
#: The tiny value of each size key, wherever a config or sub-config holds it.
SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "embed_dim", "d_model", "out_hidden_size", "output_dim", "projection_dim",
                     "projector_hidden_size", "text_hidden_size", "thinker_hidden_size", "downsample_hidden_size",
                     "latent_channels", "q_lora_rank"), WIDTH),
    **dict.fromkeys(("intermediate_size", "encoder_ffn_dim", "moe_intermediate_size",
                     "shared_expert_intermediate_size"), 2 * WIDTH),
    **dict.fromkeys(("num_attention_heads", "num_heads", "encoder_attention_heads", "attention_heads",
                     "index_n_heads"), 2),
    "num_key_value_heads": 1,
    **dict.fromkeys(("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_head_dim"), HEAD),
    "qk_head_dim": 2 * HEAD,
    "index_topk": 8,  # below the samples' lengths: the indexer selects
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k", "moe_topk", "top_k_experts"), 2),
    **dict.fromkeys(("n_shared_experts", "moe_num_shared_experts", "num_global_layers"), 1),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads"), 2),
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim", "hidden_size_per_layer_input", "hc_lowrank"), 8),
    "vision_output_dim": 2 * WIDTH,  # Mllama: the width times (one intermediate layer + the last)
}
#: Layer counts: a stack keeps one layer of each kind, at least :data:`MIN_LAYERS`.
LAYER_COUNTS = ("num_hidden_layers", "depth", "encoder_layers")
MIN_LAYERS = 2
#: Lists of layer indices (full-attention vision blocks, deepstack taps...): the last layer kept.
INDEX_LISTS = ("fullatt_block_indexes", "deepstack_visual_indexes", "cross_attention_layers",
               "intermediate_layers_indices")
#: Layer indices that split a stack in two (MiniCPM-V's merger after vision layer 6): after the
#: first layer, so that layers stay on both sides.
SPLIT_INDEXES = ("insert_layer_id",)
#: Tables indexed by token id: they end at the tiny vocabulary.
VOCABULARIES = ("vocab_size", "vocab_size_per_layer_input", "vision_vocab_size")
#: Config key -> where the processor states it, ``(component, attribute)`` in order.
PROCESSOR_VALUES = {
    # the vision tower's patch where the image processor names its crops patch_size (Step-3.7)
    "patch_size": (("image_processor", "vision_patch_size"), ("image_processor", "patch_size"),
                   ("processor", "patch_size")),
    "spatial_merge_size": (("image_processor", "merge_size"),),
    "temporal_patch_size": (("image_processor", "temporal_patch_size"),),
    "image_grid_pinpoints": (("image_processor", "image_grid_pinpoints"),),
    "num_mel_bins": (("feature_extractor", "feature_size"),),
    "mm_tokens_per_image": (("processor", "image_seq_length"),),
    "image_seq_length": (("processor", "image_seq_length"), ("processor", "num_image_tokens")),
}

#: What a model type's default config lacks to run its model on the case's samples:
#: ``model_type -> ({dotted config path: value}, why)``, set before the config is shrunk. A dict
#: with a ``model_type`` stands for that config class's defaults updated with it.
OVERRIDES: dict[str, tuple[dict[str, Any], str]] = {
    "gemma4": ({"vision_config": {"model_type": "gemma4_vision"}},
               "the default config has no vision tower (vision_config=None)"),
    "cohere_compass": ({"text_config.rope_parameters": {"full_attention": {"rope_type": "default",
                                                                          "rope_theta": 10000.0}}},
                       "the default text config has no RoPE parameters per layer kind, which the model reads"),
    "qwen4_exp": ({"text_config.indexer_n_heads": 2, "text_config.indexer_kv_heads": 1,
                   "text_config.indexer_head_dim": HEAD, "text_config.indexer_budget": 8,
                   "text_config.indexer_compress_ratio": 4},
                  "the default layer_types hold indexed_attention layers but no indexer sizes; a budget "
                  "below the samples' lengths makes the indexer select"),
    **dict.fromkeys(("gemma3", "idefics3", "aria"), (
        {"vision_config.patch_size": 14},
        "the processor states no patch size, and the default vision config's does not give the "
        "processor's tokens per image; the released checkpoints use 14")),
    "glm_image": ({"vq_config.num_embeddings": 4},
                  "its VQ codes become token ids, which must stay below the image start and end markers "
                  "(ids 5 and 6 of the case's tokenizer, 16384 and 16385 of the checkpoint's)"),
    **dict.fromkeys(("qwen2_vl", "qwen2_5_vl", "qwen2_5_omni_thinker", "paddleocr_vl"), (
        {"text_config.rope_parameters.mrope_section": [16, 24, 24]},
        "the default config states no sections; the released checkpoints' [16, 24, 24], which the model code "
        "defaults to where it does not read them from the config (where it does, it fails without them)")),
    "qwen3_omni_moe_thinker": ({"audio_config.n_window": 50},
                               "the released checkpoints' window (chunks of 100 mel frames), the one the audio "
                               "tower's output lengths are computed for; a default config with another one "
                               "fails in the tower on audio longer than a chunk"),
    "ernie4_5_vl_moe": ({"text_config.rope_parameters.mrope_section": [22, 22, 20]},
                        "the model code's default sections, stated so that they are rescaled: its rotary "
                        "embedding splits its frequencies by them while it is built"),
}

#: Processor modules that some transformers releases import only with torchvision, for names that
#: the Pillow image processor's module defines too: ``module -> (the module it imports them from,
#: the Pillow module)``. Where torchvision is missing, they are imported from the Pillow module.
TORCHVISION_FREE = {
    "transformers.models.gemma4.processing_gemma4": ("transformers.models.gemma4.image_processing_gemma4",
                                                     "transformers.models.gemma4.image_processing_pil_gemma4"),
}

#: Example cases that cannot run their model's own forward offline: ``name -> why``.
LEFT_OUT: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class TinyModel:
    """One example case with a tiny random model of its model class.

    Attributes:
        name: the example case's name.
        processor: the case's processor, as the case builds it.
        config: the case's config with the tiny sizes (for Omni, the case's composite config with
            the model's config as its ``thinker_config``): what an engine is built from.
        model: the model: float32, eval mode, the same random weights at every build.
        samples: the case's example samples (``random.Random(0)``) as its processor outputs them.
        layer_kinds: the distinct ``layer_types`` of the case's default text config.
        token_ids: dotted config key -> ``(case, tiny)`` of every token id changed.
        changes: dotted config key -> ``(case, tiny)`` of every other value changed beyond sizes
            (and ``attn_implementation`` where transformers refuses the one asked for).
    """

    name: str
    processor: Any
    config: Any
    model: Any
    samples: list[dict[str, Any]]
    layer_kinds: tuple[str, ...]
    token_ids: dict[str, tuple[Any, Any]]
    changes: dict[str, tuple[Any, Any]]


@functools.cache
def cases() -> dict[str, Any]:
    """The example cases of the installed plugins, by name."""
    from mmrope_core import get_plugin_manager

    return {case.name: case for _, found in get_plugin_manager().results("example_cases") for case in found}


def names() -> list[str]:
    """The example cases that have a tiny model: all but :data:`LEFT_OUT`."""
    return [name for name in cases() if name not in LEFT_OUT]


#: gradients of a batch against the samples alone: float32 sums in another order
GRADIENTS_RTOL, GRADIENTS_ATOL = 1e-3, 5e-5


def assert_loss_and_gradients(model: Any, expected: torch.Tensor, loss: Any) -> None:
    """``loss()`` (the batch's) equals ``expected`` (built from each sample alone), and so do the
    gradients each leaves in ``model``'s parameters."""
    expected.backward()
    theirs = {key: parameter.grad.clone() for key, parameter in model.named_parameters() if parameter.grad is not None}
    model.zero_grad(set_to_none=True)
    mine_loss = loss()
    torch.testing.assert_close(mine_loss, expected, rtol=1e-5, atol=1e-6)
    mine_loss.backward()
    mine = {key: parameter.grad for key, parameter in model.named_parameters() if parameter.grad is not None}
    model.zero_grad(set_to_none=True)
    assert mine.keys() == theirs.keys()
    for key, gradient in theirs.items():
        atol = max(1e-6, GRADIENTS_ATOL * float(gradient.abs().max()))
        torch.testing.assert_close(mine[key], gradient, rtol=GRADIENTS_RTOL, atol=atol,
                                   msg=lambda m, key=key: f"{key}: {m}")


@functools.cache
def tiny_model(name: str, attn_implementation: str = "sdpa", overrides: tuple[tuple[str, Any], ...] = ()) -> TinyModel:
    """The tiny model of example case ``name``, built once per process and arguments.

    ``overrides`` are ``(dotted config path, value)`` pairs set on the default config before it
    is shrunk and kept through it, e.g. ``(("text_config.use_bidirectional_attention", "vision"),)``; they show in
    ``changes``. The model is shared: zero its gradients, and do not train it in place.
    """
    case = cases()[name]
    _import_without_torchvision()
    processor, config = case.build()
    samples = [dict(processor(**call)) for call in case.samples(processor, random.Random(0))]
    target = getattr(config, "thinker_config", None) or config
    tiny = _tiny_config(target, processor, samples, overrides)
    model_class = _model_class(tiny)
    used = attn_implementation
    if used == "sdpa" and not getattr(model_class, "_supports_sdpa", True):
        used = "eager"  # transformers refuses sdpa for this model
    tiny._attn_implementation = used
    _fit_rope_sections(model_class, tiny)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(tiny).eval()
        _enliven(model)
    changed = {key: value for key, value in _differences(target.to_dict(), tiny.to_dict()).items()
               if not _is_size_change(key, *value)}
    token_ids = {key: value for key, value in changed.items() if _TOKEN_KEY.match(key.rsplit(".", 1)[-1])}
    changes = {key: value for key, value in sorted(changed.items()) if key not in token_ids}
    if used != attn_implementation:
        changes["attn_implementation"] = (attn_implementation, used)
    if target is not config:
        config = copy.copy(config)
        config.thinker_config = tiny
    else:
        config = tiny
    return TinyModel(name, processor, config, model, samples, _layer_kinds(target), token_ids, changes)


def _import_without_torchvision() -> None:
    """Import the modules of :data:`TORCHVISION_FREE` that fail without torchvision, from the
    Pillow modules; their processors then build for the rest of the process."""
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return
    for module, (imported, pillow) in TORCHVISION_FREE.items():
        try:
            importlib.import_module(module)
            continue
        except ImportError:
            pass
        try:
            sys.modules[imported] = importlib.import_module(pillow)
            importlib.import_module(module)
        except ImportError:
            pass  # the case's build says what is missing
        finally:
            sys.modules.pop(imported, None)


def _model_class(config: Any) -> Any:
    """The image-text-to-text (or multimodal LM) class transformers maps ``config`` to; for a model
    type mapped to a base model only (GLM-Image), the ``ForConditionalGeneration`` beside it. A
    model type a plugin registers (:func:`registered`) is built as it registered it, with its head."""
    from transformers.models.auto import modeling_auto

    for mapping in (modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING, modeling_auto.MODEL_FOR_MULTIMODAL_LM_MAPPING):
        if type(config) in mapping:
            return _first(mapping[type(config)])
    if registered(config):
        raise LookupError(f"{config.model_type} is registered with transformers' AutoConfig, but no model of it with a "
                          f"language-model head is (AutoModelForImageTextToText.register): the tests train its logits")
    base = _first(modeling_auto.MODEL_MAPPING[type(config)])
    return getattr(sys.modules[base.__module__], base.__name__.removesuffix("Model") + "ForConditionalGeneration")


def registered(config: Any) -> bool:
    """Whether ``config``'s model type is one a plugin registered with transformers' ``AutoConfig``
    (Storyboard's), not one of transformers' own."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return config.model_type not in CONFIG_MAPPING_NAMES


def _first(found: Any) -> Any:
    """The first class where an auto mapping holds several for one config."""
    return found[0] if isinstance(found, (tuple, list)) else found


def _layer_kinds(config: Any) -> tuple[str, ...]:
    text = getattr(config, "text_config", None) or config
    return tuple(dict.fromkeys(text.to_dict().get("layer_types") or ()))


def _tiny_config(config: Any, processor: Any, samples: list[dict[str, Any]],
                 overrides: tuple[tuple[str, Any], ...]) -> Any:
    values = config.to_dict()
    for path, value in (*OVERRIDES.get(config.model_type, ({}, ""))[0].items(), *overrides):
        _set_path(values, path, value)
    _shrink(values)
    for path, value in overrides:  # kept through the shrinking (an indexer's index_topk)
        _set_path(values, path, value)
    _fit_processor(values, processor, samples)
    _fit_token_ids(values, type(config)().to_dict(), processor)
    return type(config).from_dict(values)


def _set_path(values: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for name in parents:
        values = values[name]
    if isinstance(value, dict) and "model_type" in value:
        from transformers import CONFIG_MAPPING

        value = {**CONFIG_MAPPING[value["model_type"]]().to_dict(), **value}
    values[last] = copy.deepcopy(value)


def _sub_dicts(values: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The sub-configs of a config's ``to_dict()``, one level down."""
    for value in values.values():
        if isinstance(value, dict) and "model_type" in value:
            yield value


def _all_sub_dicts(values: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for sub in _sub_dicts(values):
        yield sub
        yield from _all_sub_dicts(sub)


# -- sizes and layers ------------------------------------------------------------------------------


def _shrink(values: dict[str, Any]) -> None:
    """Tiny sizes in ``values`` (a config's ``to_dict()``) and in all its sub-configs."""
    default = dict(values)
    for key, size in SIZES.items():
        if key in values:
            values[key] = _resized(values[key], size)
    if isinstance(values.get("head_dim"), int):
        values["head_dim"] = round(HEAD / _partial_rotary_factor(values))
    for key in SPLIT_INDEXES:
        if isinstance(values.get(key), int) and values[key] > 0:
            values[key] = 0
    _shrink_layers(values, default)
    for parameters in _rope_parameter_sets(values):
        for name in SECTIONS:
            if isinstance(parameters.get(name), list):
                parameters[name] = _rescaled(parameters[name], _rotary_half(values, parameters))
    for sub in _sub_dicts(values):
        _shrink(sub)


def _resized(value: Any, size: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return size
    if isinstance(value, list) and value and all(isinstance(item, int) for item in value):
        return [size] * len(value)
    return value


def _shrink_layers(values: dict[str, Any], default: Mapping[str, Any]) -> None:
    """One layer of each combination of kinds the per-layer lists name (at least ``MIN_LAYERS``),
    every per-layer list and per-layer override following the layers kept."""
    key = next((key for key in LAYER_COUNTS if isinstance(values.get(key), int)), None)
    if key is None:
        return
    count = values[key]
    first: dict[tuple[str, ...], int] = {}
    for index, kinds in enumerate(zip(*_kind_lists(values, count))):
        first.setdefault(kinds, index)
    keep = sorted(first.values())
    keep = sorted(keep + [index for index in range(count) if index not in keep][: max(0, MIN_LAYERS - len(keep))])
    for name, value in list(values.items()):
        if isinstance(value, list) and len(value) == count and name not in SIZES:
            values[name] = [value[index] for index in keep]
    per_layer = values.get("per_layer_config")
    if isinstance(per_layer, dict):
        by_index = {int(index): overrides for index, overrides in per_layer.items()}
        values["per_layer_config"] = {str(new): _scaled_overrides(by_index[old], default, values)
                                      for new, old in enumerate(keep) if old in by_index}
    values[key] = len(keep)
    for name in INDEX_LISTS:
        if isinstance(values.get(name), list) and values[name]:
            values[name] = [len(keep) - 1]


def _kind_lists(values: Mapping[str, Any], count: int) -> list[list[str]]:
    """The per-layer lists of kinds (``layer_types``, ``mlp_layer_types``, ``indexer_types``...)."""
    return [value for value in values.values()
            if isinstance(value, list) and len(value) == count and all(isinstance(item, str) for item in value)]


def _scaled_overrides(overrides: Mapping[str, Any], default: Mapping[str, Any], tiny: Mapping[str, Any]) -> dict[str, Any]:
    """A layer's own sizes keep their ratio to the config's (Gemma4's global layers: twice the head size)."""
    out = dict(overrides)
    for name, value in overrides.items():
        if isinstance(value, int) and isinstance(default.get(name), int) and default[name] != tiny.get(name):
            out[name] = max(1, value * tiny[name] // default[name])
    return out


# -- RoPE sections ---------------------------------------------------------------------------------


def _rope_parameter_sets(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The RoPE parameter dicts of one config: one, or one per layer kind."""
    rope = values.get("rope_parameters")
    if not isinstance(rope, dict):
        return []
    return [value for value in rope.values() if isinstance(value, dict)] or [rope]


def _partial_rotary_factor(values: Mapping[str, Any]) -> float:
    factors = [values.get("partial_rotary_factor") or 1.0]
    factors += [parameters.get("partial_rotary_factor") or 1.0 for parameters in _rope_parameter_sets(values)]
    return min(factors)


def _rotary_half(values: Mapping[str, Any], parameters: Mapping[str, Any]) -> int:
    head = (values.get("qk_rope_head_dim") or values.get("head_dim")
            or values["hidden_size"] // values["num_attention_heads"])
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


# -- what the processor states ---------------------------------------------------------------------


def _fit_processor(values: dict[str, Any], processor: Any, samples: list[dict[str, Any]]) -> None:
    """Values the model shares with the processor, taken from it, in the config and its sub-configs."""
    side = _tile_side(samples)
    for tree in (values, *_all_sub_dicts(values)):
        for key in PROCESSOR_VALUES:
            if key in tree and (value := _processor_value(processor, key)) is not None:
                tree[key] = _like(tree[key], value)
        patch = tree.get("patch_size")
        if side is not None and "image_size" in tree and side != (patch[0] if isinstance(patch, list) else patch):
            tree["image_size"] = _like(tree["image_size"], side)  # tiles, not patches laid out as tiles


def _processor_value(processor: Any, key: str) -> Any:
    for component, attribute in PROCESSOR_VALUES[key]:
        owner = processor if component == "processor" else getattr(processor, component, None)
        value = getattr(owner, attribute, None)
        if getattr(value, "height", None) is not None:  # per side (Fuyu's patch SizeDict): square ones here
            return value.height
        if value is not None:
            return value
    return None


def _like(current: Any, value: Any) -> Any:
    """``value`` in the form of ``current``: an int as a list of it where ``current`` is a list
    (InternVL's ``image_size`` is ``[448, 448]``)."""
    if isinstance(current, list) and isinstance(value, int):
        return [value] * len(current)
    return value


def _tile_side(samples: list[dict[str, Any]]) -> int | None:
    """The side of the square pixel tiles the processor outputs; None for patches laid flat."""
    sides = {tuple(sample["pixel_values"].shape[-2:]) for sample in samples
             if "pixel_values" in sample and sample["pixel_values"].dim() >= 4}
    if len(sides) == 1 and len(side := next(iter(sides))) == 2 and side[0] == side[1]:
        return int(side[0])
    return None


# -- token ids -------------------------------------------------------------------------------------

_TOKEN_KEY = re.compile(r"^(?P<stem>.+?)_(token_id|token_index|token_ids|id|index)$")


def _fit_token_ids(values: dict[str, Any], defaults: Mapping[str, Any], processor: Any) -> None:
    """Every token id the config holds, made the case's: the id the case's build set, else the
    tokenizer's id of the token it names (``vision_start_token_id`` -> ``vision_start_token``;
    ``_start``/``_end`` also read as ``_bos``/``_eos`` and ``begin_of_``/``end_of_``), else a
    fresh id past the tokenizer's vocabulary that no sample holds. Every vocabulary ends there.

    ``defaults`` is the config class's own ``to_dict()``: a value equal to it was not set by the case.
    """
    table = _token_table(processor)
    size = len(processor.tokenizer)
    fresh: dict[int, int] = {}

    def new(value: int) -> int:
        return fresh.setdefault(value, size + len(fresh))

    def fit(tree: dict[str, Any], default: Mapping[str, Any]) -> None:
        for key, value in list(tree.items()):
            match = _TOKEN_KEY.match(key)
            if match is None or value is None or isinstance(value, bool) or not isinstance(value, (int, list)):
                continue
            names_a_token = "token" in key
            if isinstance(value, int) and value < size and value != default.get(key, value):
                continue  # the case's build set it
            known = next((table[name] for name in _aliases(match["stem"]) if name in table), None)
            if known is not None:
                tree[key] = known
            elif isinstance(value, list):
                if names_a_token:
                    tree[key] = [new(item) for item in value]
            elif value >= size or (names_a_token and value == default.get(key)):
                tree[key] = new(value)
        for name, sub in tree.items():
            if isinstance(sub, dict) and "model_type" in sub:
                fit(sub, default.get(name) or {})

    fit(values, defaults)
    for tree in (values, *_all_sub_dicts(values)):
        for key in VOCABULARIES:
            if isinstance(tree.get(key), int):
                tree[key] = size + len(fresh)


def _token_table(processor: Any) -> dict[str, int]:
    """stem -> id of every named token (``image``, ``vision_start``...): the tokenizer's names win
    (they are what ``input_ids`` hold; Gemma3's processor calls the image's opening marker its
    ``image_token``), then the processor's."""
    tokenizer = processor.tokenizer
    table: dict[str, int] = {}
    for named in (vars(processor), {**vars(tokenizer), **tokenizer.special_tokens_map}):
        for key, token in named.items():
            if key.endswith("_token") and isinstance(token, str):
                token_id = tokenizer.convert_tokens_to_ids(token)
                if token_id is not None and token_id != tokenizer.unk_token_id:
                    table[key.removesuffix("_token")] = token_id
    return table


def _aliases(stem: str) -> list[str]:
    names = [stem]
    for end, (suffix, prefix) in (("_start", ("_bos", "begin_of_")), ("_end", ("_eos", "end_of_"))):
        if stem.endswith(end):
            base = stem.removesuffix(end)
            names += [base + suffix, prefix + base]
    return names


# -- weights and records ---------------------------------------------------------------------------


def _enliven(model: Any) -> None:
    """Noise on every parameter initialised to one value (zeroed gates and projections, unit
    norms): a zero gate or projection keeps images from the logits and gradients from the towers."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.numel() and bool((parameter == parameter.flatten()[0]).all()):
                parameter.add_(torch.randn_like(parameter) * 0.02)


def _differences(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """dotted path -> (before, after) of every value that differs, looking into the dicts both have."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out.update(_differences(old, new, f"{prefix}{key}."))
        elif old is None and isinstance(new, dict) and "model_type" in new:
            out[f"{prefix}{key}"] = (old, f"the defaults of {new['model_type']}")
        elif old != new:
            out[f"{prefix}{key}"] = (old, new)
    return out


def _is_size_change(path: str, old: Any, new: Any) -> bool:
    """Whether a change only makes the model smaller: a size, fewer layers of the same kinds, the
    layer indices, sections and vocabularies that follow."""
    last = path.rsplit(".", 1)[-1]
    fewer_layers = (isinstance(old, list) and isinstance(new, list) and len(new) < len(old)
                    and all(isinstance(item, str) for item in old) and set(new) <= set(old))
    return (fewer_layers or last in SIZES or last in LAYER_COUNTS or last in INDEX_LISTS or last in SPLIT_INDEXES
            or last in SECTIONS or last in VOCABULARIES or last == "head_dim" or ".per_layer_config." in f".{path}.")
