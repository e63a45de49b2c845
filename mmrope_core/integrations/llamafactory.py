"""A drop-in for LLaMA-Factory's multimodal collators: they then take every M-RoPE position id
from mmrope.

LLaMA-Factory 0.9.5's ``MultiModalDataCollatorForSeq2Seq`` (and its subclasses: the SFT collator
with ``neat_packing``, the pairwise and KTO collators) asks the model object for
``get_rope_index`` and computes positions itself. :func:`install` wraps the collators'
``__call__``: LLaMA-Factory still builds the whole batch (padding, media, labels, packing), then
the positions come from an engine built from the collator's processor and the model's config.

Call it in your launcher before LLaMA-Factory builds its collator::

    from mmrope_core.integrations import llamafactory as mmrope_llamafactory

    mmrope_llamafactory.install()
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

__all__ = ["collator_engine", "install", "installed"]

#: Where LLaMA-Factory 0.9.5 defines its collators.
COLLATOR_MODULE = "llamafactory.data.collator"
#: Where LLaMA-Factory hands on Omni deltas counted over the padding too.
_OMNI_THINKERS = ("qwen2_5_omni_thinker", "qwen3_omni_moe_thinker")

_settings: dict[str, Any] = {"config": None, "mm_processor_kwargs": {}, "convention": None}
_exact = threading.local()  # the last batch's positions before the SFT collator's dtype cast


def install(*, config: Any = None, mm_processor_kwargs: Mapping[str, Any] | None = None,
            convention: str | None = None) -> None:
    """Make LLaMA-Factory's multimodal collators take their M-RoPE positions from mmrope.

    Args:
        config: the model config, for collators built without a model object (``model=None``),
            which then get positions too; a collator's own ``model.config`` is used when it has one.
        mm_processor_kwargs: processor keyword arguments the positions depend on, for every
            sample, on top of the processor's own ``use_audio_in_video`` that LLaMA-Factory sets.
        convention: the position convention (see :mod:`mmrope_core.conventions`; default
            transformers'). A name mmrope does not know is refused here
            (:class:`~mmrope_core.UnknownConventionError`), a collator whose family lacks it
            when it is built.

    Idempotent: calling it again only replaces the settings. Collators whose processor uses 1-D
    RoPE, that have no processor, or that have neither a model nor ``config``, keep
    LLaMA-Factory's own behaviour.
    """
    import importlib

    from mmrope_core.conventions import known

    known(convention, "mmrope_core.integrations.llamafactory.install(convention=...)")
    module = importlib.import_module(COLLATOR_MODULE)
    _settings["config"] = config
    _settings["mm_processor_kwargs"] = dict(mm_processor_kwargs or {})
    _settings["convention"] = convention
    _wrap(module.MultiModalDataCollatorForSeq2Seq, _call_with_mmrope_positions)
    _wrap(module.SFTDataCollatorWith4DAttentionMask, _call_keeping_exact_positions)
    _wrap(module.MultiModalDataCollatorForSeq2Seq, _built_with_the_convention, "__post_init__")


def installed() -> bool:
    """Whether :func:`install` has wrapped LLaMA-Factory's collators in this process."""
    import sys

    module = sys.modules.get(COLLATOR_MODULE)
    return module is not None and _is_wrapped(module.MultiModalDataCollatorForSeq2Seq.__dict__["__call__"])


def collator_engine(collator: Any) -> Any:
    """The engine a collator's positions come from (built on first use), or None where
    LLaMA-Factory's own behaviour is kept: no processor, a 1-D RoPE family, or no model and no
    config given to :func:`install` (LLaMA-Factory's collators for ``predict_with_generate``
    have no model, and the model computes positions as it generates)."""
    from mmrope_core.engine import RopeEngine
    from mmrope_core.errors import UnsupportedProcessorError

    config = _config_of(collator)
    convention = _settings["convention"]
    key = (id(collator.processor), id(config), convention)
    cached = collator.__dict__.get("_mmrope_engine")
    if cached is not None and cached[0] == key:
        return cached[1]
    if collator.processor is None or config is None:  # without a model LLaMA-Factory gives no positions either
        engine = None
    else:
        try:
            engine = RopeEngine.from_processor(collator.processor, config,
                                               **({} if convention is None else {"convention": convention}))
        except UnsupportedProcessorError:
            if getattr(collator, "get_rope_func", None) is not None:  # LLaMA-Factory would place M-RoPE itself
                raise
            engine = None
        if engine is not None:
            _refuse_padding_side(engine, collator)
        if engine is not None and engine.rope_kind != "mrope":
            engine = None
    collator.__dict__["_mmrope_engine"] = (key, engine)
    return engine


def _refuse_padding_side(engine: Any, collator: Any) -> None:
    """A padding side the model's own layers get wrong (the engine's ``batch_layout``) raises
    :class:`~mmrope_core.PaddingUnsupportedError`, whichever positions the batch gets."""
    from mmrope_core.errors import PaddingUnsupportedError

    side = getattr(collator.tokenizer, "padding_side", "right")
    refused = engine.batch_layout.refused_sides.get(side)
    if refused:
        other = "right" if side == "left" else "left"
        raise PaddingUnsupportedError(
            f"{getattr(engine.config, 'model_type', type(engine.processor).__name__)} cannot train samples padded on "
            f"the {side}: {refused}; LLaMA-Factory pads on its tokenizer's padding_side: set it to {other!r}")


# -- the wrappers -------------------------------------------------------------------------------


def _wrap(cls: type, replacement: Callable[..., Any], name: str = "__call__") -> None:
    current = cls.__dict__[name]
    if _is_wrapped(current):
        return

    @functools.wraps(current)
    def method(self: Any, *args: Any) -> Any:
        return replacement(current, self, *args)

    method.__mmrope_original__ = current  # type: ignore[attr-defined]
    setattr(cls, name, method)


def _built_with_the_convention(original: Callable[..., Any], collator: Any) -> None:
    """A collator whose family lacks the convention asked for is refused when it is built."""
    original(collator)
    if _settings["convention"] is not None:
        collator_engine(collator)


def _is_wrapped(function: Any) -> bool:
    return hasattr(function, "__mmrope_original__")


def _call_with_mmrope_positions(original: Callable[..., Any], collator: Any, features: list[dict[str, Any]]) -> Any:
    features, generated = _without_generated_masks(features)
    engine = collator_engine(collator)
    if engine is None:
        return original(collator, features)
    # read before LLaMA-Factory pops the media lists; what is no dict, LLaMA-Factory's own code refuses
    features_read = [feature for feature in features if isinstance(feature, Mapping)]
    if generated is None:
        _warn_without_generated_mask(collator, engine)
    injected = _injected_media(collator, features_read)
    counts = None if engine.samples_independent else _media_counts(features_read)
    packed = any(len((feature.get("packing_params") or {}).get("sequence_boundaries") or ()) > 2
                 for feature in features_read)
    with _framework_positions_off(collator):
        batch = original(collator, features)
    generated_mask = None if generated is None else _laid_out(generated, batch["input_ids"],
                                                              collator.tokenizer.padding_side)
    if packed:  # LLaMA-Factory gives the model a block-diagonal mask, or flash-attention's positions, nothing more
        support = _packing_support(collator, engine)
        support.require("LLaMA-Factory's neat_packing rows", gives_boundaries=False)
        for row in batch["attention_mask"].long():  # segment ids: some layers keep segments apart up to a length
            support.require_lengths(torch.bincount(row)[1:].tolist(), "a neat_packing row")
    if packed and "image" in injected:  # the SFT collator then keeps the fake image's tokens (its own flag)
        batch["has_dummy_image"] = True
    inputs = _inputs_without(batch, injected, engine.batch_layout)
    mm_processor_kwargs = {"use_audio_in_video": bool(getattr(collator.processor, "use_audio_in_video", False)),
                           **_settings["mm_processor_kwargs"]}
    if packed:
        positions = engine.compute_position_ids(batch["input_ids"], None, inputs, mm_processor_kwargs,
                                                segment_ids=batch["attention_mask"].long(), generated_mask=generated_mask)
        batch["position_ids"] = positions.transpose(0, 1)
        batch.pop("rope_deltas", None)
    else:
        batch["position_ids"], batch["rope_deltas"] = _padded_positions(engine, collator, batch, inputs,
                                                                        mm_processor_kwargs, generated_mask, counts)
        if engine.batch_layout.labels_right and collator.tokenizer.padding_side == "left" and "labels" in batch:
            batch["labels"] = _labels_on_the_right(batch["labels"], batch["attention_mask"])
    if batch["position_ids"].is_floating_point():  # what the SFT collator's dtype cast must not reach
        _exact.last = (collator, batch["position_ids"], batch["attention_mask"])
    return batch


def _packing_support(collator: Any, engine: Any) -> Any:
    """Whether the model keeps packed segments apart, worked out once per collator and engine."""
    from mmrope_core.segments import packed_row_support

    cached = collator.__dict__.get("_mmrope_packing")
    if cached is None or cached[0] is not engine:
        cached = (engine, packed_row_support(engine))
        collator.__dict__["_mmrope_packing"] = cached
    return cached[1]


def _call_keeping_exact_positions(original: Callable[..., Any], collator: Any, features: list[dict[str, Any]]) -> Any:
    """The SFT collator casts every float tensor to its compute dtype: give back float positions
    (Qwen3-Omni's) as they were, with the same padding removed."""
    _exact.last = None
    batch = original(collator, features)
    last, _exact.last = getattr(_exact, "last", None), None
    if last is None or last[0] is not collator:
        return batch
    _, positions, attention_mask = last
    if batch.get("position_ids") is None or batch["position_ids"].dtype == positions.dtype:
        return batch
    if batch["position_ids"].shape[-1] != positions.shape[-1]:  # neat packing removed the padding
        kept = {"attention_mask": attention_mask, "position_ids": positions}
        type(collator)._unpad_packed_features(kept)
        positions = kept["position_ids"]
    batch["position_ids"] = positions
    return batch


@contextlib.contextmanager
def _framework_positions_off(collator: Any) -> Iterator[None]:
    """Hide the model and its ``get_rope_index`` from LLaMA-Factory's ``__call__`` for one call:
    it then builds the batch without positions (and without refusing Omni packing)."""
    saved = collator.model, collator.get_rope_func
    collator.model, collator.get_rope_func = None, None
    try:
        yield
    finally:
        collator.model, collator.get_rope_func = saved


# -- positions ----------------------------------------------------------------------------------


def _padded_positions(engine: Any, collator: Any, batch: Mapping[str, Any], inputs: dict[str, Any],
                      mm_processor_kwargs: dict[str, Any], generated_mask: torch.Tensor | None = None,
                      counts: list[dict[str, int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(4, B, L)``: the text row counting valid tokens (1 at padding) above the model's own
    ``(t, h, w)`` (only the rows it reads, where it takes no text row); and the deltas as
    LLaMA-Factory hands them on. With ``counts`` (each row's media), each row is computed alone."""
    from mmrope_core.integrations._rows import each_row_alone

    mask = (batch["attention_mask"] != 0).long()
    kwargs = engine.rope_index_kwargs(inputs, mm_processor_kwargs)
    if counts is None:
        positions, deltas = engine.get_rope_index(batch["input_ids"], mask, generated_mask=generated_mask, **kwargs)
    else:  # the model's method numbers media across the batch: each row as its sample alone
        positions, deltas = each_row_alone(engine, batch["input_ids"], mask, kwargs, counts, generated_mask)
    text = torch.ones_like(mask)
    text[mask.bool()] = (torch.cumsum(mask, dim=-1) - 1)[mask.bool()]
    if _model_type(_config_of(collator)) in _OMNI_THINKERS:  # LLaMA-Factory counts Omni deltas over padding too
        deltas = deltas - (1 - mask).sum(dim=-1, keepdim=True).to(deltas.dtype)
    if not engine.batch_layout.text_positions:  # the model reads only its own rows (HunYuan-VL's four)
        return positions, deltas
    return torch.cat([text.to(positions.dtype)[None], positions], dim=0), deltas


def _media_counts(features: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    """Each feature's images, videos and audios, in the batch's order (the fake ones LLaMA-Factory
    adds place nothing: their inputs are left out)."""
    return [{kind: len(feature.get(f"{kind}s") or ()) for kind in ("image", "video", "audio")}
            for feature in features]


def _labels_on_the_right(labels: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """An encoder-decoder's labels, a sequence of their own, moved to the start of each row: the
    padding LLaMA-Factory put before them goes after them."""
    pads = (attention_mask == 0).sum(dim=-1)
    return torch.stack([row.roll(-int(pad)) for row, pad in zip(labels, pads)])


def _without_generated_masks(features: Any) -> tuple[Any, list[tuple[list[int], Any]] | None]:
    """The features without their ``generated_mask`` (copies: the caller's dicts keep theirs), and
    each feature's ids and mask (None where it has none); None where no feature has one."""
    if not isinstance(features, list) or not any(isinstance(feature, Mapping) and "generated_mask" in feature
                                                 for feature in features):
        return features, None
    kept, generated = [], []
    for feature in features:
        if not isinstance(feature, Mapping):  # LLaMA-Factory's own code refuses it
            kept.append(feature)
            continue
        generated.append((list(feature["input_ids"]), feature.get("generated_mask")))
        kept.append({key: value for key, value in feature.items() if key != "generated_mask"})
    return kept, generated


def _laid_out(generated: list[tuple[list[int], Any]], input_ids: torch.Tensor, padding_side: str) -> torch.Tensor:
    """Each feature's ``generated_mask`` where LLaMA-Factory put its tokens in the batch: from the
    row's start under right padding, at its end under left padding (its fake media tokens and the
    padding elsewhere); 0 for a feature without one."""
    from mmrope_core.errors import CollateError

    laid_out = torch.zeros_like(input_ids, dtype=torch.bool)
    width = input_ids.shape[1]
    for sample, (ids, mask) in enumerate(generated):
        if mask is None:
            continue
        values = torch.as_tensor(mask).reshape(-1)
        if values.numel() != len(ids):
            raise CollateError(f"sample {sample}: generated_mask has {values.numel()} values but input_ids has "
                               f"{len(ids)} tokens; give one value per token (1 where the rollout generated it)")
        span = slice(0, len(ids)) if padding_side == "right" else slice(width - len(ids), width)
        if input_ids[sample, span].tolist() != ids:
            raise CollateError(f"sample {sample}: its tokens are not where {padding_side} padding puts them in "
                               f"LLaMA-Factory's batch, so its generated_mask cannot be laid out")
        laid_out[sample, span] = values.bool()
    return laid_out


def _warn_without_generated_mask(collator: Any, engine: Any) -> None:
    """Once per collator: the engine places generated tokens apart from a prefill (SGLang's
    Qwen3-Omni), and the features say none were generated."""
    import warnings

    from mmrope_core.errors import GeneratedMaskWarning

    if not getattr(engine.binding.kernel, "reads_generated_mask", False) or collator.__dict__.get("_mmrope_warned"):
        return
    collator.__dict__["_mmrope_warned"] = True
    warnings.warn(GeneratedMaskWarning(
        f"the {engine.convention} convention places the tokens the rollout engine generated apart from a prefill "
        f"of the whole sequence for {type(engine.processor).__name__}, and these features carry no generated_mask: "
        f"every token is placed as a prefill, so replies the engine decoded elsewhere are placed where it would "
        f"have prefilled them. Add each feature's generated_mask (1 where the rollout generated the token) to the "
        f"features, e.g. as a column of the tokenized dataset"), stacklevel=4)


def _injected_media(collator: Any, features: list[dict[str, Any]]) -> set[str]:
    """Which fake media LLaMA-Factory will add to the first row (masked out), as it decides."""
    plugin = collator.template.mm_plugin
    images = sum(len(feature.get("images") or ()) for feature in features)
    videos = sum(len(feature.get("videos") or ()) for feature in features)
    audios = sum(len(feature.get("audios") or ()) for feature in features)
    injected = set()
    if plugin.image_token is not None and images == 0 and videos == 0:
        injected.add("image")
    if plugin.audio_token is not None and audios == 0:
        injected.add("audio")
    return injected


def _inputs_without(batch: Mapping[str, Any], injected: set[str], layout: Any) -> dict[str, Any]:
    """The batch's media inputs, less the fake ones: their tokens are padding, they place nothing.
    The fake image comes only to a batch without images or videos, the fake audio to one without
    audios: every key the plugin declares holding images or videos (and its grids and seconds of
    no declared medium), or audios, holds the fake ones' entries alone."""
    inputs = dict(batch)
    media = {key: (rule.role, layout.medium_of(key)) for key, rule in layout.media.items()}
    fake: set[str] = set()
    if "image" in injected:
        fake |= {key for key, (role, medium) in media.items()
                 if medium in ("image", "video") or (medium is None and role in ("grid", "seconds", "stamps"))}
    if "audio" in injected:
        fake |= {key for key, (_, medium) in media.items() if medium == "audio"}
    for key in fake:
        inputs.pop(key, None)
    return inputs


def _config_of(collator: Any) -> Any:
    model = collator.model
    if model is not None and getattr(model, "config", None) is not None:
        return model.config
    return _settings["config"]


def _model_type(config: Any) -> str | None:
    return getattr(config, "model_type", None)
