"""A model class's own ``get_rope_index``, fed as the model feeds it: token types by the
processor's own rule, arguments picked by the method's signature."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mmrope_core import InvalidInputError, MmropeError
from mmrope_core.mrope import TokenTypeMap
from mmrope_core.reference import ReferenceKernel

#: Arguments of get_rope_index that the kernel contract supplies itself.
_SUPPLIED = frozenset({"input_ids", "attention_mask", "mm_token_type_ids"})


class ConfigOnlyModel:
    """A stand-in for a model instance holding only its config: what ``get_rope_index`` and the
    helpers it calls need, without weights.

    An attribute not set on the object is looked up, in order, as a method of the model class
    (bound to this object; static methods as they are), then on the config, then on the config's
    ``vision_config`` and ``text_config``: the attributes models copy from their config in
    ``__init__`` (an Omni thinker's ``spatial_merge_size``). Methods may set attributes (GLM-Image
    keeps decoding caches on the model).
    """

    def __init__(self, model_class: type, config: Any) -> None:
        self.__dict__["model_class"] = model_class
        self.__dict__["config"] = config

    def __getattr__(self, name: str) -> Any:
        model_class = self.__dict__["model_class"]
        if not name.startswith("__"):
            try:
                found = inspect.getattr_static(model_class, name)
            except AttributeError:
                found = None
            if isinstance(found, staticmethod):
                return found.__func__
            if inspect.isfunction(found):
                bound = found.__get__(self, type(self))
                self.__dict__[name] = bound  # bound once
                return bound
            for source in _config_sources(self.__dict__["config"]):
                if hasattr(source, name):
                    return getattr(source, name)
        raise AttributeError(f"{model_class.__name__} (config only) has no attribute {name!r}")


def _config_sources(config: Any) -> Iterator[Any]:
    yield config
    for key in ("vision_config", "text_config"):
        sub = getattr(config, key, None)
        if sub is not None:
            yield sub


class TransformersReference(ReferenceKernel):
    """:class:`~mmrope_core.reference.ReferenceKernel` over a :class:`ConfigOnlyModel`, so that
    any model class's method runs (helpers, static methods and attributes its ``__init__`` copies
    from the config included), serialised because some methods keep state on the model. Rows of
    positions: as many as the method returns (``rope_rows``)."""

    def __init__(self, model_class: type, config: Any, *, token_types: Callable[..., torch.Tensor] | None,
                 check: Callable[..., Any] | None = None, position_dtype: torch.dtype = torch.int64,
                 rope_rows: int = 3) -> None:
        super().__init__(model_class, config, token_types=token_types, check=check, position_dtype=position_dtype)
        self.model = ConfigOnlyModel(model_class, config)
        self.rope_rows = rope_rows
        self._lock = threading.Lock()

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with self._lock:
            try:
                return super().rope_index(input_ids, attention_mask, cu_seqlens=cu_seqlens, **inputs)
            except MmropeError:
                raise
            except Exception as exc:  # the method's own failure: say which of its arguments it did not get
                missing = sorted(self.takes - _SUPPLIED - {key for key, value in inputs.items() if value is not None})
                given = f"; not given: {', '.join(missing)} (pass them to engine.get_rope_index, or install the " \
                        f"model's family plugin, which derives them)" if missing else ""
                raise InvalidInputError(
                    f"{self.model_class.__name__}.get_rope_index failed on these inputs: {type(exc).__name__}: "
                    f"{exc}{given}. Check the inputs against the processor's output"
                ) from exc


def processor_token_types(processor: Any) -> Callable[..., torch.Tensor]:
    """``mm_token_type_ids`` for ``input_ids`` by the processor's own rule, as an int64 tensor.

    A processor keeping transformers' base rule (1 for its image token ids, 2 for video, 3 for
    audio, the later kind winning) gets that rule as a :class:`~mmrope_core.mrope.TokenTypeMap`,
    which reads each id once; a processor with its own ``create_mm_token_type_ids`` (GLM's video
    markers) is called itself."""
    from transformers.processing_utils import ProcessorMixin

    own = getattr(type(processor), "create_mm_token_type_ids", None)
    if own is ProcessorMixin.create_mm_token_type_ids:
        types: dict[int, int] = {}
        for media_type, ids in enumerate(media_token_ids(processor), start=1):
            types.update(dict.fromkeys(ids, media_type))
        table = TokenTypeMap(types)

        def by_table(input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
            return table(input_ids).to(torch.int64)

        return by_table

    def by_processor(input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        rows = processor.create_mm_token_type_ids(input_ids.tolist())
        return torch.tensor(rows, dtype=torch.int64, device=input_ids.device).reshape(input_ids.shape)

    return by_processor


def media_token_ids(processor: Any) -> tuple[list[int], list[int], list[int]]:
    """The processor's image, video and audio token ids (transformers' ``image_token_ids`` ...)."""
    return tuple(  # type: ignore[return-value]
        [token for token in getattr(processor, f"{kind}_token_ids", None) or () if isinstance(token, int)]
        for kind in ("image", "video", "audio")
    )
