"""Binding a processor by what its model config says: the model class's own ``get_rope_index``
(or a batched kernel proven equal to it), or 1-D positions."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from mmrope_core import InvalidInputError, MediaKey, RopeBinding
from mmrope_core.batching import GRID, IMAGE_GRID, VIDEO_GRID, Medium
from mmrope_core.reference import ReferenceKernel

from .fast import Candidate, candidates, probed_kernel
from .models import Decision, decide, sees_images
from .reference import _SUPPLIED, TransformersReference, media_token_ids, processor_token_types
from .rollouts import bind_convention

IMPLEMENTATIONS = ("fast", "reference")

#: Keys of a processor's outputs that are no multimodal input of the model's positions or its
#: forward: the token ids and mask are batched by the engine, labels are the trainer's.
_NOT_MULTIMODAL = frozenset({"input_ids", "attention_mask", "labels"})
#: Outputs that hold one value per token, which some processors return without declaring them.
_TOKEN_ALIGNED = frozenset({"mm_token_type_ids", "token_type_ids"})
_SECONDS = MediaKey(role="seconds", grid="video_grid_thw")
#: What transformers' media inputs of positions hold, by their names in its processors and
#: ``get_rope_index`` methods (and every name ending in ``_grid_thw``: a grid), as the engine reads them.
MEDIA_KEYS = {"image_grid_thw": IMAGE_GRID, "video_grid_thw": VIDEO_GRID, "second_per_grid_ts": _SECONDS,
              "second_per_grids": _SECONDS, "video_second_per_grid": _SECONDS,
              "audio_seqlens": MediaKey(role="audio_lengths"), "feature_attention_mask": MediaKey(role="audio_mask")}
#: The kind of media item an argument of transformers' ``get_rope_index`` methods holds one entry
#: of each (MiniCPM-V names its grids ``target_sizes``); the others (``images_per_sample``, one
#: value a sample, and switches such as ``downsample_mode``) hold none.
MEDIUM_OF_ARGUMENT: dict[str, Medium] = {
    "image_grid_thw": "image", "target_sizes": "image", "video_grid_thw": "video", "target_sizes_videos": "video",
    "second_per_grid_ts": "video", "second_per_grids": "video", "video_second_per_grid": "video",
    "audio_seqlens": "audio", "feature_attention_mask": "audio"}


@dataclasses.dataclass(frozen=True)
class Bound:
    """What the other hooks need to know of a processor this plugin bound.

    Attributes:
        rope_arguments: names of the reference's arguments taken from the processor's outputs
            (or from the keyword arguments it was called with).
        varlen_keys: the processor's outputs that are zero-padded to the largest sample.
    """

    rope_arguments: frozenset[str] = frozenset()
    varlen_keys: frozenset[str] = frozenset()

    def __or__(self, other: Bound) -> Bound:
        return Bound(self.rope_arguments | other.rope_arguments, self.varlen_keys | other.varlen_keys)

    @property
    def media_keys(self) -> dict[str, MediaKey]:
        """What the processor's outputs and the reference's arguments hold, as the engine reads them."""
        grids = sorted(key for key in self.rope_arguments | self.varlen_keys if key.endswith("_grid_thw"))
        keys = {**MEDIA_KEYS, **{key: GRID for key in grids if key not in MEDIA_KEYS}}
        for key in sorted(self.rope_arguments | set(keys)):
            medium = MEDIUM_OF_ARGUMENT.get(key)
            rule = keys.get(key, MediaKey())
            if medium is not None and rule.medium is None:
                keys[key] = dataclasses.replace(rule, medium=medium)
        return keys


_bound: weakref.WeakKeyDictionary[Any, Bound] = weakref.WeakKeyDictionary()
_bound_lock = threading.Lock()


def bound(processor: Any) -> Bound | None:
    """What this plugin bound ``processor`` to (in any engine of this process), or None."""
    try:
        return _bound.get(processor)
    except TypeError:  # neither hashable nor weakly referable: never bound
        return None


def _remember(processor: Any, what: Bound) -> None:
    with _bound_lock, contextlib.suppress(TypeError):  # neither hashable nor weakly referable: nothing to keep
        _bound[processor] = _bound.get(processor, Bound()) | what  # engines of one processor share the union


def bind(processor: Any, config: Any, options: Mapping[str, Any]) -> RopeBinding | None:
    """The binding of ``processor`` for ``config``'s model, or None when the config does not say
    what positions the model computes (see :func:`~.models.decide`)."""
    if config is None or not hasattr(processor, "tokenizer"):
        return None
    names = _input_names(processor)
    if "position_ids" in names:  # the processor computes positions itself (NeoMME)
        return None
    decision = decide(config)
    if decision.kind is None:
        return None
    varlen = frozenset((names | _TOKEN_ALIGNED) - _NOT_MULTIMODAL)
    if decision.kind == "1d":
        if any(media_token_ids(processor)) and not sees_images(config):
            raise InvalidInputError(
                f"{type(processor).__name__} places media tokens, but the config given (model_type "
                f"{decision.model_type!r}) describes a model that takes no images; pass the vision-language model's "
                f"own config (AutoConfig.from_pretrained on its checkpoint)"
            )
        _remember(processor, Bound(varlen_keys=varlen))
        return RopeBinding("1d", implementation="mask",
                           description=f"{decision.model_type}: 1-D positions from the attention mask ({decision.reason})")
    implementation = options.get("implementation", "fast")
    if implementation not in IMPLEMENTATIONS:
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {decision.model_type}; "
                                f"use one of {IMPLEMENTATIONS}")
    binding, reference = _mrope(processor, decision, implementation)
    binding = bind_convention(binding, decision.model_type, config, options)
    _remember(processor, Bound(frozenset(reference.takes - _SUPPLIED), varlen))
    return binding


def _mrope(processor: Any, decision: Decision, implementation: str) -> tuple[RopeBinding, TransformersReference]:
    model_class, config, model_type = decision.model_class, decision.config, decision.model_type
    assert model_class is not None
    method = f"{model_class.__name__}.get_rope_index"
    token_types = processor_token_types(processor)
    rows, dtype = _output_of(model_class, config, token_types, method)
    reference = TransformersReference(model_class, config, token_types=token_types, position_dtype=dtype,
                                      rope_rows=rows)
    options: list[Candidate]
    if rows != 3:
        options, why_none = [], f"it computes {rows} rows of positions, the kernel 3"
    elif dtype.is_floating_point:
        options, why_none = [], f"it computes {dtype} positions, the kernel integers"
    else:
        options, why_none = candidates(model_type, processor, config)
    key = ("mmrope-transformers", reference.probe_key, type(processor).__qualname__, tuple(options),
           config.to_json_string(use_diff=False))
    found = probed_kernel(key, options, reference, _types_agree(processor, token_types), what=method,
                          why_none=why_none)
    if found is not None:
        reference.check = found[1].check  # typed errors instead of a crash inside the reference
    if found is None or implementation == "reference":
        why = "requested" if implementation == "reference" else "no batched layout reproduces it"
        return RopeBinding("mrope", reference, "reference",
                           f"{model_type}: transformers reference {method} ({why})"), reference
    candidate, kernel = found
    timed = f", temporal ids {kernel.family.temporal}" if kernel.family.temporal is not None else ""
    return RopeBinding("mrope", kernel, "fast",
                       f"{model_type}: batched kernel ({candidate.layout}{timed}), equal to {method} on probe "
                       f"inputs"), reference


def _output_of(model_class: type, config: Any, token_types: Any, method: str) -> tuple[int, torch.dtype]:
    """Rows and dtype of the method's positions, from a text-only call; a config the method
    cannot run on is refused here rather than on the first batch."""
    reference = TransformersReference(model_class, config, token_types=token_types)
    ids = torch.tensor([[0, 0, 0]])
    try:  # the method itself, without the wrapping of its failures meant for batches
        positions, _ = ReferenceKernel.rope_index(reference, ids, torch.ones_like(ids, dtype=torch.bool))
    except Exception as exc:
        raise InvalidInputError(
            f"{method} fails on the config given ({type(exc).__name__}: {exc}); pass the checkpoint's own config "
            f"(AutoConfig.from_pretrained), which carries what the method reads"
        ) from exc
    dtype = positions.dtype if positions.dtype.is_floating_point else torch.int64
    return int(positions.shape[0]), dtype


def _types_agree(processor: Any, token_types: Any) -> Any:
    """``agree(family)``: whether the family's token types equal the processor's rule on every
    special and added token of its tokenizer, outside and inside the family's video markers."""
    tokenizer = processor.tokenizer
    ids = sorted({*getattr(tokenizer, "all_special_ids", ()), *getattr(tokenizer, "get_added_vocab", dict)().values()})

    def agree(family: Any) -> bool:
        row = list(ids)
        if family.video_markers is not None:
            begin, end = family.video_markers
            row = [*ids, begin, *ids, end, *ids]
        if not row:
            return True
        tokens = torch.tensor([row])
        try:
            return torch.equal(family.token_types()(tokens).to(torch.int64), token_types(tokens))
        except Exception:
            return False

    return agree


def _input_names(processor: Any) -> set[str]:
    try:
        names = processor.model_input_names
    except Exception:
        return set()
    return {name for name in names or () if isinstance(name, str)}
