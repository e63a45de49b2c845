"""Calling a model class's own ``get_rope_index`` without building the model (the reference
kernel), and checking once per process that a fast kernel still reproduces it."""

from __future__ import annotations

import inspect
import threading
import types
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from .kernel import RopeKernel


class _ConfigOnlyModel(types.SimpleNamespace):
    """A model's config and attributes, with the model class's methods bound on first use."""

    def __init__(self, model_class: type, config: Any, **attributes: Any) -> None:
        super().__init__(config=config, **attributes)
        self._model_class = model_class

    def __repr__(self) -> str:
        return f"{self._model_class.__name__} built from its config alone"

    def __getattr__(self, name: str) -> Any:  # called only for names not set: the class's methods
        found = None if name.startswith("__") else inspect.getattr_static(self._model_class, name, None)
        if isinstance(found, staticmethod):
            method = found.__func__
        elif isinstance(found, classmethod):
            method = types.MethodType(found.__func__, self._model_class)
        elif isinstance(found, types.FunctionType):
            method = types.MethodType(found, self)
        else:  # weights, buffers and properties of the built model are not there
            raise AttributeError(f"{self._model_class.__name__} built from its config alone has no {name!r}")
        setattr(self, name, method)
        return method


def config_only_model(model_cls: type, config: Any, **attributes: Any) -> Any:
    """A stand-in for ``model_cls`` holding only ``config`` (and ``attributes``), whose methods
    are the class's own, bound to it: enough to run ``get_rope_index`` (and the methods it calls)
    without weights.

    Example::

        from transformers.models.qwen2_vl import Qwen2VLModel
        model = config_only_model(Qwen2VLModel, config)
        positions, deltas = model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw)
    """
    return _ConfigOnlyModel(model_cls, config, **attributes)


_probed: dict[Hashable, Any] = {}
_probed_lock = threading.Lock()


Found = TypeVar("Found")


def probe_once(key: Hashable, probe: Callable[[], Found | None], *, fast: str) -> Found | None:
    """What ``probe()`` returns, worked out once per process for each ``key``: the rule under
    which a fast implementation equals the installed transformers' reference on probe batches,
    or None when none does. ``key`` names the plugin, the family and every config fact the answer
    depends on. A None comes with one ``RuntimeWarning`` saying that ``fast`` (what the warning
    calls the fast implementation) gives way to the reference.

    Example::

        rule = probe_once(("my-vl", family.name, merge), lambda: first_rule_matching_reference(...),
                          fast="my-vl: the fast MyVL kernel")
        if rule is None:
            return RopeBinding("mrope", reference, token_types, "reference")
    """
    with _probed_lock:  # engines built on several threads probe once
        if key not in _probed:
            _probed[key] = probe()
            if _probed[key] is None:
                import transformers

                warnings.warn(
                    f"{fast} does not reproduce transformers {transformers.__version__}'s get_rope_index on probe "
                    f"inputs, so the reference implementation is used (same results, slower). Please report this "
                    f"with your transformers version.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return _probed[key]


class ReferenceKernel(RopeKernel):
    """A transformers model class's own ``get_rope_index`` as a kernel: the positions the model
    computes itself, from its config alone.

    Args:
        model_class: the class defining ``get_rope_index`` (``Qwen2VLModel``, ...).
        config: the config that class reads (for Omni models, the thinker's).
        token_types: ``token_types(input_ids)`` builds ``mm_token_type_ids`` for references that
            take them, as the family's processor builds them.
        check: ``check(input_ids, attention_mask, **inputs)`` runs first and raises typed errors
            for inputs the reference would crash on or misplace; it may return the inputs as the
            reference takes them (a dict), or None to pass them on unchanged.
        position_dtype: the dtype of :meth:`position_ids` (the reference's own).
        attributes: further attributes the methods read from the model (see
            :func:`config_only_model`).

    Inputs the method's signature does not name are left out, as the model leaves them out.
    Packed rows are unpacked by the engine first.
    """

    def __init__(self, model_class: type, config: Any, *, token_types: Callable[..., torch.Tensor] | None = None,
                 check: Callable[..., Mapping[str, Any] | None] | None = None,
                 position_dtype: torch.dtype = torch.int64, **attributes: Any) -> None:
        self.model_class = model_class
        self.model = config_only_model(model_class, config, **attributes)
        self.token_types = token_types
        self.check = check
        self.position_dtype = position_dtype
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        parameters = inspect.signature(model_class.get_rope_index).parameters.values()  # type: ignore[attr-defined]
        self.takes = frozenset(parameter.name for parameter in parameters if parameter.kind in named) - {"self"}
        self.input_keys = self.takes - {"input_ids", "attention_mask", "mm_token_type_ids"}
        if "mm_token_type_ids" in self.takes and token_types is None:
            raise TypeError(f"{model_class.__name__}.get_rope_index takes mm_token_type_ids: pass token_types")

    @property
    def probe_key(self) -> tuple[str, str]:
        """What identifies this reference among the answers :func:`probe_once` keeps."""
        return self.model_class.__module__, self.model_class.__qualname__

    def __repr__(self) -> str:
        return f"ReferenceKernel({self.model_class.__name__})"

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   cu_seqlens: torch.Tensor | None = None, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if cu_seqlens is not None:
            raise TypeError("a reference kernel does not place packed rows: unpack them first")
        if self.check is not None:
            checked = self.check(input_ids, attention_mask, **inputs)
            inputs = dict(inputs) if checked is None else dict(checked)
        arguments = {key: value for key, value in inputs.items() if key in self.takes}
        if "mm_token_type_ids" in self.takes:
            arguments["mm_token_type_ids"] = self.token_types(input_ids)  # type: ignore[misc]
        try:
            return self.model.get_rope_index(input_ids=input_ids, attention_mask=attention_mask, **arguments)
        except RuntimeError:
            if input_ids.dtype == torch.int64:
                raise
        # some references put int64 values into a tensor of the ids' dtype and fail on int32 ids
        # (Qwen3-VL's videos): their positions from int64 ids, in the ids' dtype as elsewhere
        positions, deltas = self.model.get_rope_index(input_ids=input_ids.long(), attention_mask=attention_mask,
                                                      **arguments)
        return positions.to(input_ids.dtype), deltas


def kernels_agree(fast: RopeKernel, reference: RopeKernel, batches: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``fast`` gives exactly the positions and deltas of ``reference`` (values, dtypes
    and shapes) on every batch of keyword arguments. A batch the reference refuses counts as a
    disagreement: the batches follow rules this reference does not."""
    for batch in batches:
        try:
            want = reference.rope_index(**batch)
        except Exception:
            return False
        got = fast.rope_index(**batch)
        if not all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want)):
            return False
    return True
