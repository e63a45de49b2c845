"""Whether a model trains a packed row as its samples alone, read off its config, the installed
transformers and the installed kernels.

Positions restarting per segment are what transformers' attention layers need to keep the
segments of a packed row apart. Other layers need more, or cannot be given it:

- layers that carry state along the row (linear attention, convolutions, state-space mixers)
  run from one segment into the next unless their kernels take the boundaries
  (flash-linear-attention's varlen kernels read ``cu_seqlens``, causal-conv1d reads ``seq_idx``);
- bidirectional attention is never cut at the boundaries (transformers finds them only for
  causal masks), unless the model above the text config builds a mask of its own that is (a
  prefix-LM's): measured on a tiny random model of the config (:mod:`mmrope_core.measured`);
- the model's code may mix them: image tokens that attend to one another through a mask overlay
  (measured on a tiny random model of the config), or media handed to the batch's rows one by
  one; a plugin may say more through its binding (:attr:`RopeBinding.mixes_segments`).

- some layers keep them apart only up to a length: Llama 4's NoPE layers read the token's index
  in the row, an indexer keeping ``index_topk`` keys tells tied keys apart by it.

The collators ask once, when they are built; a model that would mix segments is refused before
any forward, with what to do instead, and a batch past a model's length limits when it comes.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import PackingUnsupportedError
from .independence import samples_independent
from .measured import keeps_segments_apart, packed_segments_differ

#: Layer kinds (``layer_types`` entries) that work token by token, and the attention kinds whose
#: masks transformers cuts at the segments' boundaries. Any other kind is refused: an indexer that
#: picks keys from the whole row, state carried along it, or a kind mmrope has not seen.
_PER_TOKEN_KINDS = frozenset({"mlp", "moe", "dense"})
#: (Unlimited-OCR's reference_sliding_attention masks are transformers' sliding-window masks, which cut
#: them, with an overlay keeping the prefill attended.)
_CUT_ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention",
                                  "reference_sliding_attention"})
#: Why a layer kind that picks each query's keys with an indexer mixes a packed row's segments.
_INDEXER_REASONS = {
    "minimax_m3_sparse": "its minimax_m3_sparse layers' indexer pools the keys into blocks by their slot in the row "
                         "and hides a query's future by comparing those slots with its position ids, which restart "
                         "in each segment of a packed row, so a later segment's queries lose keys of their own "
                         "segment",
}
#: Layer kinds that carry state along the row, whose kernels keep packed segments apart when
#: given the boundaries, with what the model's code must run for that: transformers passes
#: ``cu_seq_lens_q`` to flash-linear-attention's gated delta rule and ``seq_idx`` to
#: causal-conv1d. Without either kernel, the PyTorch fallbacks run over the whole row.
_BOUNDED_KINDS = {"linear_attention": (("chunk_gated_delta_rule", "causal_conv1d"),
                                       ("flash-linear-attention", "causal-conv1d"))}
#: Config attributes that describe layers carrying state, on configs that list no layer kinds.
_STATE_ATTRIBUTES = ("mamba", "ssm_", "conv_kernel", "conv_L_cache", "linear_conv", "state_size")


@dataclasses.dataclass(frozen=True)
class PackedRowSupport:
    """What a model needs to train a packed row as its samples alone.

    Attributes:
        model: how messages name the model: its ``model_type`` and processor class.
        mixes: why its layers mix the segments of a packed row; empty when they keep them apart.
        advice: what to do instead, with ``mixes``.
        boundaries: the kind of the layers that read the segments' boundaries (``"linear_attention"``),
            or empty: where set, a packed batch must carry ``cu_seq_lens_q``/``cu_seq_lens_k``,
            ``max_length_q``/``max_length_k`` and ``seq_idx``.
        max_tokens: the longest packed row the layers keep apart (None: any), and ``limit`` why.
        max_sample_tokens: the longest sample a packed row holds as it is alone (None: any), and
            ``sample_limit`` why.
    """

    model: str
    mixes: str = ""
    advice: str = ""
    boundaries: str = ""
    max_tokens: int | None = None
    limit: str = ""
    max_sample_tokens: int | None = None
    sample_limit: str = ""

    @property
    def exact(self) -> bool:
        return not self.mixes

    def require(self, what: str = "a packed row", *, gives_boundaries: bool = True) -> None:
        """Raise :class:`~mmrope_core.PackingUnsupportedError` when the model mixes segments, or
        when its layers read boundaries that ``what`` (a framework's packed rows) does not give."""
        if self.mixes:
            raise PackingUnsupportedError(f"{self.model} cannot train {what} as its samples alone: {self.mixes}. "
                                          f"{self.advice}")
        if self.boundaries and not gives_boundaries:
            raise PackingUnsupportedError(
                f"{self.model} cannot train {what} as its samples alone: its {self.boundaries} layers keep the "
                f"segments apart only when given their boundaries (cu_seq_lens_q and seq_idx), which {what} do not "
                f"carry. Train it on mmrope_core.collators.PackedCollator's rows, or without packing")

    def require_lengths(self, lengths: Sequence[int], what: str = "a packed row") -> None:
        """Raise :class:`~mmrope_core.PackingUnsupportedError` when ``what``, of samples of ``lengths``
        tokens, is longer than the layers keep apart (:attr:`max_tokens`), or holds a sample longer
        than they keep as it is alone (:attr:`max_sample_tokens`)."""
        tokens = sum(lengths)
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise PackingUnsupportedError(
                f"{what} of {tokens} tokens is longer than {self.model} trains as its samples alone: at most "
                f"{self.max_tokens} tokens, as {self.limit}. Pack fewer samples a row (max_length={self.max_tokens}), "
                f"or pad the batch instead")
        longer = [index for index, length in enumerate(lengths) if self.max_sample_tokens is not None
                  and length > self.max_sample_tokens]
        if longer:
            raise PackingUnsupportedError(
                f"sample {longer[0]} of {what} has {lengths[longer[0]]} tokens, more than {self.model} trains in a "
                f"packed row as it is alone: at most {self.max_sample_tokens} tokens a sample, as {self.sample_limit}. "
                f"Pack only shorter samples, or pad the batch instead")


def packed_row_support(engine: Any) -> PackedRowSupport:
    """How ``engine``'s model keeps the segments of a packed row apart (see the module docstring)."""
    processor = type(engine.processor).__name__ if engine.processor is not None else "a text-only model"
    config = engine.config
    model_type = getattr(config, "model_type", None)
    model = f"{model_type} ({processor})" if model_type else processor
    pad = "pad the batch instead (mmrope_core.collators.PaddedCollator, or the trainer's padded batches)"
    # the media first: a model placing each row's media itself mixes the segments whatever its layers do
    layout = getattr(engine, "batch_layout", None)
    mixes = ((layout.packing_refusal if layout is not None else "") or engine.binding.mixes_segments
             or (model_code_mixes_segments(config) if config is not None else ""))
    if mixes:
        return PackedRowSupport(model, mixes, f"To train it, {pad}")
    rows = getattr(engine.binding.kernel, "rope_rows", 3)
    if rows != 3:
        return PackedRowSupport(
            model, f"its model takes {rows} rows of positions and no text row beside them, so it finds no boundaries "
                   f"in a packed row (transformers reads them from the text row that three (t, h, w) rows come "
                   f"with) and its segments attend to one another", f"To train it, {pad}")
    found = _layers_support(model, config, pad)
    if found.exact and not samples_independent(engine):
        return PackedRowSupport(
            model, "mmrope cannot show that its get_rope_index gives a sample the positions it gives it alone "
                   "wherever it stands in a batch (it may number media across the batch), so a packed segment's "
                   "positions may depend on the segments before it", f"To train it, {pad}")
    return found


def _layers_support(model: str, config: Any, pad: str) -> PackedRowSupport:
    """What the layers ``config`` describes need to keep a packed row's segments apart."""
    texts = list(text_configs(config))
    if not texts:
        return PackedRowSupport(
            model, "the engine has no model config, so mmrope cannot tell whether the model's layers keep the "
                   "segments apart", "Build the engine with the model's config (RopeEngine.from_pretrained(path), or "
                   f"RopeEngine.from_processor(processor, config)), or {pad}")
    if not any(_attention_heads(text) for text in texts):
        return PackedRowSupport(
            model, "its config describes no attention layers (no num_attention_heads): layers that are not "
                   "attention, such as recurrent ones, carry state along the row from one segment into the next",
            f"To train it, {pad}")
    if any(_read(text, "is_encoder_decoder") for text in texts):
        return PackedRowSupport(
            model, "it is an encoder-decoder model: its encoder attends both ways over the row, and its decoder "
                   "attends to one encoder output per row", f"To train it, {pad}")
    if any(value and ("cross_attention" in name or "cross_layer" in name)
           for text in texts for name, value in vars(text).items()):
        return PackedRowSupport(
            model, "its cross-attention layers attend from each token to the images of its row through a "
                   "per-token mask, and a token masked out of every image (text before a sample's first image, a "
                   "sample without images) attends evenly to all of them (as Mllama's do): in a packed row, to other "
                   "samples' images, even with the mask joined block by block", f"To train it, {pad}")
    bidirectional = next(filter(None, map(_bidirectional_text, texts)), "")
    if bidirectional:  # the model above the text config may build a mask of its own, cut or not: measured
        difference = packed_segments_differ(config)
        if not keeps_segments_apart(difference):
            measured = (f"measured on a tiny random model of its config, a packed segment differs from its sample "
                        f"alone by {difference:.2g}" if difference is not None else
                        "mmrope could not build a tiny model of its config to measure whether its own mask cuts them")
            return PackedRowSupport(
                model, f"its text attention is bidirectional ({bidirectional}), and transformers cuts attention at "
                       f"the segments' boundaries only where it is causal ({measured})", f"To train it, {pad}")
    kinds = {kind for text in texts for kind in _read(text, "layer_types") or ()}
    carrying = sorted(kinds - _PER_TOKEN_KINDS - _CUT_ATTENTION_KINDS)
    if not kinds:
        carrying = [f"layers described by {name}" for text in texts for name in vars(text)
                    if any(part in name for part in _STATE_ATTRIBUTES)][:1]
    indexed = [kind for kind in carrying if kind in _INDEXER_REASONS or "index" in kind or "sparse" in kind]
    top_k = _top_k(texts) if indexed == ["indexed_attention"] else None
    if indexed and top_k is None:
        return PackedRowSupport(
            model, _INDEXER_REASONS.get(indexed[0], f"its {indexed[0]} layers pick each query's keys with an indexer "
                                                    f"that mmrope does not know to keep to a packed row's segments"),
            f"To train it, {pad}")
    carrying = [kind for kind in carrying if kind not in indexed]
    unbounded = [kind for kind in carrying if not any(_runs(text, _BOUNDED_KINDS.get(kind, ((),))[0]) for text in texts)]
    if unbounded:
        state = unbounded[0] in _BOUNDED_KINDS or not unbounded[0].endswith("attention")
        what = ("carry state along the row from one segment into the next" if state
                else "are neither full nor sliding-window attention (the masks transformers cuts at the segments' "
                     "boundaries)")
        return PackedRowSupport(
            model, f"its {unbounded[0]} layers {what}, and mmrope knows no kernel of them that takes the boundaries",
            f"To train it, {pad}")
    max_tokens, limit = _row_limit(texts, kinds)
    sample_limit = (f"its indexed_attention layers keep a query's index_topk={top_k} best-scored keys, and keys "
                    f"scored alike (a ReLU scores many 0) are told apart by their place in the row: a sample of at "
                    f"most {top_k} tokens keeps all of its own") if top_k is not None else ""
    if carrying:
        needed = sorted({kernel for kind in carrying for kernel in _BOUNDED_KINDS[kind][1]})
        missing = [kernel for kernel in needed if not _kernel_available(kernel)]
        if missing:
            return PackedRowSupport(
                model, f"its {carrying[0]} layers carry state along the row from one segment into the next; only "
                       f"the kernels of {' and '.join(needed)} take the segments' boundaries, and "
                       f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not available here "
                       f"(they need a CUDA GPU)", f"Install {' and '.join(missing)} on a GPU machine, or {pad}")
        return PackedRowSupport(model, boundaries=carrying[0], max_tokens=max_tokens, limit=limit,
                                max_sample_tokens=top_k, sample_limit=sample_limit)
    return PackedRowSupport(model, max_tokens=max_tokens, limit=limit, max_sample_tokens=top_k,
                            sample_limit=sample_limit)


def _top_k(texts: list[Any]) -> int | None:
    """How many keys the indexer of ``indexed_attention`` layers keeps per query (``index_topk``), or
    None where the config says no such number (an indexer that compresses or pools keys instead).
    The indexer scores keys under the attention mask, which holds the segments' boundaries."""
    counts = [_read(text, "index_topk") for text in texts]
    found = [count for count in counts if isinstance(count, int) and count > 0]
    return min(found) if found else None


def _row_limit(texts: list[Any], kinds: set[str]) -> tuple[int | None, str]:
    """The longest packed row whose segments the layers keep apart, and why. Chunked attention:
    where this transformers counts the chunks from the row's first token (measured with chunks
    shorter than the measured rows), a row up to one chunk. Layers without RoPE (NoPE) that tune
    their attention temperature take it from each token's index in the row, which leaves a token
    as it is alone only below ``floor_scale`` (Llama 4)."""
    limits: list[tuple[int, str]] = []
    for text in texts:
        size = _read(text, "attention_chunk_size")
        if "chunked_attention" in kinds and isinstance(size, int) and size > 0 and not keeps_segments_apart(
                packed_segments_differ(text, attention_chunk_size=4)):
            limits.append((size, f"its chunked_attention layers count chunks of attention_chunk_size={size} tokens "
                                 f"from the row's first token (measured on a tiny random model of its text config)"))
        floor = _read(text, "floor_scale")
        nope = _read(text, "no_rope_layers")
        if _read(text, "attn_temperature_tuning") and isinstance(floor, int) and floor > 1 and (
                not isinstance(nope, list) or 0 in nope):
            limits.append((floor - 1, f"its NoPE layers scale attention by a temperature taken from each token's "
                                      f"index in the row, which leaves a token alone only below floor_scale={floor}"))
    return min(limits) if limits else (None, "")


def text_configs(config: Any) -> Iterator[Any]:
    """The configs of ``config`` that describe language-model layers: itself, its sub-models that
    hold a language model of their own (:func:`nested_language_models`) and their ``text_config``."""
    seen: list[Any] = []
    pending = [config]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is known for known in seen):
            continue
        seen.append(current)
        yield current
        pending += [*nested_language_models(current), getattr(current, "text_config", None)]


def nested_language_models(config: Any) -> list[Any]:
    """The sub-configs of ``config`` that hold a language model of their own (a ``text_config``),
    in the config's order: an Omni model's thinker (and Qwen3-Omni's talker, whose layers are
    checked too: refusing where it would mix segments is the safe answer)."""
    return [value for value in getattr(config, "__dict__", {}).values()
            if value is not config and hasattr(value, "to_dict") and hasattr(value, "text_config")]


def model_code_mixes_segments(config: Any) -> str:
    """Why the model class transformers maps ``config`` to mixes packed segments through its own
    code, or "": a mask overlay (how Gemma-style models let image tokens attend to one another),
    measured; media handed to the batch's rows one by one (:func:`media_by_rows_mixes_segments`).
    Asked for every binding, once per config."""
    model_class = _model_class(config)
    if model_class is None:
        return ""
    return mask_overlay_mixes_segments(model_class, config) or media_by_rows_mixes_segments(model_class)


def mask_overlay_mixes_segments(model_class: type, config: Any) -> str:
    """Why ``model_class`` mixes packed segments through a mask overlay, or "". Where its modeling
    module builds masks with one (``or_mask_function``, ``block_sequence_ids``), a packed row of
    text segments with token types is measured on a tiny random model of ``config``
    (:mod:`mmrope_core.measured`): transformers reads some overlays at each token's position within
    its segment, so that a later segment reads the overlay of the first segment's tokens, and cuts
    others at the boundaries. A module whose source cannot be read is measured too."""
    module = inspect.getmodule(model_class)
    try:
        source = inspect.getsource(module) if module is not None else _OVERLAYS[0]
    except (OSError, TypeError):
        source = _OVERLAYS[0]
    if not any(overlay in source for overlay in _OVERLAYS):
        return ""
    difference = packed_segments_differ(config)
    if keeps_segments_apart(difference):
        return ""
    measured = (f"measured on a tiny random model of its config, a packed segment differs from its sample alone by "
                f"{difference:.2g}" if difference is not None else
                "mmrope could not build a tiny model of its config to measure whether transformers cuts it at the "
                "segments' boundaries")
    return (f"{model_class.__name__} builds its attention masks with an overlay (tokens of some types attending to "
            f"one another), which transformers reads at each token's position within its segment, so a later "
            f"segment of a packed row reads the overlay of the first segment's tokens ({measured})")


#: How a modeling module builds a mask overlay: worth measuring.
_OVERLAYS = ("or_mask_function", "block_sequence_ids")


def _model_class(config: Any) -> type | None:
    """The model class transformers' auto mappings give ``config``'s class (its base model first)."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return None
    for mapping in ("MODEL_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "MODEL_FOR_MULTIMODAL_LM_MAPPING"):
        try:
            found = getattr(modeling_auto, mapping)[type(config)]
        except Exception:  # not in this mapping, or not importable
            continue
        return found[0] if isinstance(found, (tuple, list)) else found
    return None


def _runs(text: Any, names: tuple[str, ...]) -> bool:
    """Whether the modeling code of ``text``'s model calls every function in ``names``."""
    if not names:
        return False
    module = type(text).__module__.replace(".configuration_", ".modeling_")
    try:
        source = inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return False
    return all(name in source for name in names)


def media_by_rows_mixes_segments(model_class: type) -> str:
    """Why ``model_class`` mixes packed segments when its ``forward`` takes counts of media per
    sample (an argument named ``*_per_sample``) and goes through the batch row by row to hand each
    row its media, or "". A packed row is one row of several samples: such a forward hands it the
    first sample's media only (GLM-Image's source images in some transformers releases). A
    forward whose source cannot be read is taken to do so."""
    forward = getattr(model_class, "forward", None)
    if not callable(forward):
        return ""
    try:
        counts = [name for name in inspect.signature(forward).parameters if name.endswith("_per_sample")]
    except (TypeError, ValueError):
        return ""
    if not counts:
        return ""
    try:
        by_rows = _ROW_LOOP.search(inspect.getsource(forward)) is not None
    except (OSError, TypeError):
        by_rows = True
    if not by_rows:
        return ""
    return (f"{model_class.__name__}.forward takes counts of media per sample ({', '.join(counts)}) and hands the "
            f"media to the batch's rows one by one, so in a packed row (one row of several samples) the later "
            f"samples' media are read as the first one's")


#: A loop over the rows of a batch, as model code writes it.
_ROW_LOOP = re.compile(r"\bfor \w+ in range\((?:batch_size|bsz|input_ids\.shape\[0\]|inputs_embeds\.shape\[0\])\)")


def _attention_heads(text: Any) -> bool:
    """Whether ``text`` describes attention layers: transformers' attention configs count their heads
    (per layer, on configs whose layers differ)."""
    heads = _read(text, "num_attention_heads")
    return any(isinstance(count, int) and count > 0 for count in (heads if isinstance(heads, list) else [heads]))


def _read(config: Any, name: str) -> Any:
    """``config.<name>``, or None; on configs whose layers differ in it (transformers refuses a global
    read of a per-layer attribute), the list of its per-layer values."""
    try:
        return getattr(config, name, None)
    except RuntimeError:  # AmbiguousGlobalPerLayerAttributeError
        layers = getattr(config, "per_layer_config", None)
        count = vars(config).get("num_hidden_layers")
        if layers is None or not isinstance(count, int):
            return vars(config).get(name)
        return [getattr(layers[index], name, None) for index in range(count)]


def _bidirectional_text(text: Any) -> str:
    """The setting that makes ``text``'s attention bidirectional over every token, or ""."""
    setting = _read(text, "use_bidirectional_attention")
    if setting is True or setting == "all":
        return f"use_bidirectional_attention={setting!r}"
    if _read(text, "is_causal") is False:
        return "is_causal=False"
    return ""


def _kernel_available(distribution: str) -> bool:
    """Whether transformers finds ``distribution``'s kernels usable here."""
    from transformers.utils import import_utils

    check = {"flash-linear-attention": "is_flash_linear_attention_available",
             "causal-conv1d": "is_causal_conv1d_available"}[distribution]
    return bool(getattr(import_utils, check, lambda: False)())
