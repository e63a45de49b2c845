"""Whether a model trains a packed row as its samples alone, seen from what the model does.

Positions restarting per segment are what transformers' attention layers need to keep the
segments of a packed row apart; whether a model's layers and code keep them apart is seen on a
tiny random model built from its config (:mod:`mmrope_core.measured`), once per config, for
every binding: a packed row of text segments measured against each segment alone, and its
layers read off the built modules, which name the cause of a refusal:

- layers that carry state along the row (linear attention, convolutions, state-space mixers)
  run from one segment into the next unless their kernels take the boundaries
  (flash-linear-attention's varlen kernels read ``cu_seq_lens_q``, causal-conv1d reads
  ``seq_idx``): measured given the boundaries, on a CUDA device where there is one;
- bidirectional attention, mask overlays over token types, indexers picking keys from the whole
  row: measured;
- what a packed row of text cannot show is read off the layers and the model's ``forward``:
  cross-attention to media, an encoder, media handed to the batch's rows one by one; a plugin may
  say more through its binding (:attr:`RopeBinding.mixes_segments`);
- some layers keep segments apart only up to a length: Llama 4's NoPE layers read the token's
  index in the row, an indexer keeping ``index_topk`` keys tells tied keys apart by it.

A model that cannot be built or run this way (no model class, a config that does not build, a
forward that fails) is refused, with the reason. The collators ask once, when they are built; a
model that would mix segments is refused before any forward, with what to do instead, and a batch
past a model's length limits when it comes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .errors import PackingUnsupportedError
from .independence import samples_independent
from .language_models import text_configs
from .measured import Layers, behaviour, keeps_segments_apart, packed_segments_differ

#: Why a layer kind that picks each query's keys with an indexer mixes a packed row's segments.
_INDEXER_REASONS = {
    "minimax_m3_sparse": "its minimax_m3_sparse layers' indexer pools the keys into blocks by their slot in the row "
                         "and hides a query's future by comparing those slots with its position ids, which restart "
                         "in each segment of a packed row, so a later segment's queries lose keys of their own "
                         "segment",
}


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
    mixes = (layout.packing_refusal if layout is not None else "") or engine.binding.mixes_segments
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
    """What the model ``config`` describes does with a packed row: seen on a tiny random model of it
    (:mod:`mmrope_core.measured`), its layers read off the built modules to name the cause."""
    advice = f"To train it, {pad}"
    if config is None:
        return PackedRowSupport(
            model, "the engine has no model config, so mmrope cannot tell whether the model's layers keep the "
                   "segments apart", "Build the engine with the model's config (RopeEngine.from_pretrained(path), or "
                   f"RopeEngine.from_processor(processor, config)), or {pad}")
    seen = behaviour(config)
    layers = seen.layers
    if layers is None:
        return PackedRowSupport(model, f"mmrope cannot see what its model does with a packed row: {seen.failure}",
                                advice)
    cause = _structural_cause(layers)
    if cause:
        return PackedRowSupport(model, cause, advice)
    if not layers.attention and not keeps_segments_apart(seen.difference):
        return PackedRowSupport(
            model, f"the layers of {layers.model_class} hold no attention: layers that are not attention, such as "
                   f"recurrent ones, carry state along the row from one segment into the next "
                   f"({_measured(seen.difference) if not seen.failure else seen.failure})", advice)
    if seen.failure:
        carrying = (f"; its {layers.state[0]} layers carry state along the row from one segment into the next"
                    if layers.state else "")
        return PackedRowSupport(model, f"mmrope cannot see what its model does with a packed row: "
                                       f"{seen.failure}{carrying}", advice)
    texts = list(text_configs(config))
    if keeps_segments_apart(seen.difference):
        return _within_limits(model, texts, layers, pad)
    if layers.state:
        if keeps_segments_apart(seen.bounded):
            return dataclasses.replace(_within_limits(model, texts, layers, pad), boundaries=layers.state[0])
        missing = [kernel for kernel in layers.kernels if not _kernel_available(kernel)]
        if missing:
            return PackedRowSupport(
                model, f"its {layers.state[0]} layers carry state along the row from one segment into the next; only "
                       f"the kernels of {' and '.join(layers.kernels)} take the segments' boundaries, and "
                       f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not available here "
                       f"(they need a CUDA GPU; {_measured(seen.difference)})",
                f"Install {' and '.join(missing)} on a GPU machine, or {pad}")
        return PackedRowSupport(
            model, f"its {layers.state[0]} layers carry state along the row from one segment into the next, even given "
                   f"the segments' boundaries ({_measured(seen.bounded)})", advice)
    if keeps_segments_apart(seen.untyped):
        why = (f"{layers.model_class} lets tokens of some types attend to one another (a mask overlay over its token "
               f"types), which transformers reads at each token's position within its segment, so a later segment of "
               f"a packed row reads the overlay of the first segment's tokens")
    elif layers.indexed:
        kind = layers.indexed[0]
        why = _INDEXER_REASONS.get(kind, f"its {kind} layers pick each query's keys with an indexer that does not keep "
                                         f"to a packed row's segments")
    elif layers.bidirectional:
        why = ("its text attention is bidirectional, and transformers cuts attention at the segments' boundaries "
               "only where it is causal")
    else:
        why = f"the layers of {layers.model_class} let a packed row's segments attend to one another"
    return PackedRowSupport(model, f"{why} ({_measured(seen.difference)})", advice)


def _measured(difference: float | None) -> str:
    return f"measured on a tiny random model of its config, a packed segment differs from its sample alone by " \
           f"{difference:.2g}" if difference is not None else "not measured"


def _structural_cause(layers: Layers) -> str:
    """Why the layers mix a packed row's segments in ways a packed row of text does not show: media
    handed to the batch's rows, an encoder, cross-attention to media."""
    if layers.media_by_rows:
        return (f"{layers.model_class}.forward takes counts of media per sample ({', '.join(layers.media_by_rows)}) "
                f"and hands the media to the batch's rows one by one, so in a packed row (one row of several "
                f"samples) the later samples' media are read as the first one's")
    if layers.encoder:
        return ("it is an encoder-decoder model: its encoder attends both ways over the row, and its decoder "
                "attends to one encoder output per row")
    if layers.cross_attention:
        return ("its cross-attention layers attend from each token to the images of its row through a per-token "
                "mask, and a token masked out of every image (text before a sample's first image, a sample without "
                "images) attends evenly to all of them (as Mllama's do): in a packed row, to other samples' images, "
                "even with the mask joined block by block")
    return ""


def _within_limits(model: str, texts: list[Any], layers: Layers, pad: str) -> PackedRowSupport:
    """A model whose measured packed row is its samples alone, with the lengths up to which its
    layers keep it so: an indexer's ``index_topk`` a sample, NoPE layers' ``floor_scale`` a row."""
    top_k = _top_k(texts) if layers.indexed else None
    if layers.indexed and top_k is None:
        return PackedRowSupport(
            model, f"its {layers.indexed[0]} layers pick each query's keys with an indexer that keeps a packed "
                   f"row's short segments apart (measured) but keeps no number of keys (index_topk) below which a "
                   f"longer one is its sample alone", f"To train it, {pad}")
    max_tokens, limit = _row_limit(texts)
    sample_limit = (f"its {layers.indexed[0]} layers keep a query's index_topk={top_k} best-scored keys, and keys "
                    f"scored alike (a ReLU scores many 0) are told apart by their place in the row: a sample of at "
                    f"most {top_k} tokens keeps all of its own") if top_k is not None else ""
    return PackedRowSupport(model, max_tokens=max_tokens, limit=limit, max_sample_tokens=top_k,
                            sample_limit=sample_limit)


def _top_k(texts: list[Any]) -> int | None:
    """How many keys the indexer of ``indexed_attention`` layers keeps per query (``index_topk``), or
    None where the config says no such number (an indexer that compresses or pools keys instead).
    The indexer scores keys under the attention mask, which holds the segments' boundaries."""
    counts = [_read(text, "index_topk") for text in texts]
    found = [count for count in counts if isinstance(count, int) and count > 0]
    return min(found) if found else None


def _row_limit(texts: list[Any]) -> tuple[int | None, str]:
    """The longest packed row whose segments the layers keep apart, and why. Chunked attention:
    where this transformers counts the chunks from the row's first token (measured with chunks
    shorter than the measured rows), a row up to one chunk. Layers without RoPE (NoPE) that tune
    their attention temperature take it from each token's index in the row, which leaves a token
    as it is alone only below ``floor_scale`` (Llama 4)."""
    limits: list[tuple[int, str]] = []
    for text in texts:
        size = _read(text, "attention_chunk_size")
        if isinstance(size, int) and size > 0 and not keeps_segments_apart(
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


def _kernel_available(distribution: str) -> bool:
    """Whether transformers finds ``distribution``'s kernels usable here."""
    from transformers.utils import import_utils

    check = {"flash-linear-attention": "is_flash_linear_attention_available",
             "causal-conv1d": "is_causal_conv1d_available"}[distribution]
    return bool(getattr(import_utils, check, lambda: False)())
