"""Calling a model class's own ``get_rope_index`` without building the model."""

from __future__ import annotations

import types
from collections.abc import Iterable
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
