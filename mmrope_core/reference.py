"""Calling a model class's own ``get_rope_index`` without building the model, and checking once
per process that a fast implementation still reproduces it."""

from __future__ import annotations

import threading
import types
import warnings
from collections.abc import Callable, Hashable, Iterable
from typing import Any

ROPE_METHODS = ("get_vision_position_ids", "get_llm_pos_ids_for_vision", "get_chunked_index", "get_rope_index")


def config_only_model(model_cls: type, config: Any, methods: Iterable[str] = ROPE_METHODS, **attributes: Any) -> Any:
    """A stand-in for ``model_cls`` holding only ``config`` (and ``attributes``), with the named
    methods the class defines bound to it: enough to run ``get_rope_index`` without weights.

    Example::

        from transformers.models.qwen2_vl import Qwen2VLModel
        model = config_only_model(Qwen2VLModel, config)
        positions, deltas = model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw)
    """
    model = types.SimpleNamespace(config=config, **attributes)
    for name in methods:
        if hasattr(model_cls, name):
            setattr(model, name, types.MethodType(getattr(model_cls, name), model))
    return model


_probed: dict[Hashable, str | None] = {}
_probed_lock = threading.Lock()


def probe_once(key: Hashable, probe: Callable[[], str | None], *, fast: str) -> str | None:
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
