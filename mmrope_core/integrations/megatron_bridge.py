"""A drop-in for Megatron-Bridge's Qwen3-VL and Qwen2.5-VL models: their unchanged forwards then
take every M-RoPE position from an engine, each segment of a packed row as its sample alone.

Megatron-Bridge 0.3.1's models compute positions inside ``forward`` and ignore the caller's:

- ``Qwen3VLModel.forward`` sets ``position_ids = None`` and calls its module's
  ``get_rope_index(..., packed_seq_params)``, which reads each ``cu_seqlens`` length as a batch
  row: a packed row of two or more segments raises ``IndexError``.
- ``Qwen25VLModel`` binds transformers' ``Qwen2_5_VLModel.get_rope_index`` at construction and
  calls it without ``packed_seq_params`` (a packed row is one sample to it, later segments placed
  after earlier ones); on transformers 5.x that call fails on every batch.

:func:`install` replaces exactly those two calls: the module-level ``get_rope_index`` that
Qwen3-VL's forward reads, and the ``get_rope_index`` Qwen2.5-VL binds to each model (a forward
wrapper hands it the call's ``packed_seq_params``). Everything else stays Megatron-Bridge's::

    from mmrope_core import RopeEngine
    from mmrope_core.integrations import megatron_bridge as mmrope_megatron_bridge

    mmrope_megatron_bridge.install(RopeEngine.from_pretrained(hf_checkpoint))  # before the model is built

A packed THD row (``packed_seq_params`` with ``cu_seqlens_q``, and ``cu_seqlens_q_padded`` where
the segments are padded) gets each segment's positions as its sample alone, padding 0; a batch
of rows without ``packed_seq_params`` gets the engine's positions of each row (a 2-D
``attention_mask``, 1 for real tokens, is honoured; Qwen3-VL keeps its own function for the 4-D
masks it collapses itself).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["install", "installed", "uninstall"]

#: Where Megatron-Bridge 0.3.1 computes the positions of its Qwen-VL models.
QWEN3_VL_MODULE = "megatron.bridge.models.qwen_vl.modelling_qwen3_vl.model"
QWEN2_5_VL_MODULE = "megatron.bridge.models.qwen_vl.modeling_qwen25_vl"
#: The module-level function Qwen3-VL's forward calls for its positions.
QWEN3_VL_FUNCTION = "get_rope_index"

_settings: dict[str, Any] = {"engine": None}
_packed_seq_params: contextvars.ContextVar[Any] = contextvars.ContextVar("mmrope_packed_seq_params", default=None)


def install(engine: Any) -> None:
    """Make Megatron-Bridge's Qwen3-VL and Qwen2.5-VL models take their positions from ``engine``
    (a :class:`~mmrope_core.RopeEngine` of the checkpoint the model was converted from).

    Call it before the Qwen2.5-VL model is built (it binds its position function then); Qwen3-VL
    models built earlier follow too. Calling it again only replaces the engine.
    """
    from mmrope_core.engine import RopeEngine
    from mmrope_core.errors import InvalidInputError

    if not isinstance(engine, RopeEngine) or engine.rope_kind != "mrope":
        raise InvalidInputError(f"install() takes the RopeEngine of an M-RoPE checkpoint, got {engine!r}; build it "
                                f"with RopeEngine.from_pretrained(path) of the Hugging Face checkpoint")
    _settings["engine"] = engine
    qwen3 = importlib.import_module(QWEN3_VL_MODULE)
    if not _is_ours(qwen3.get_rope_index):
        setattr(qwen3, QWEN3_VL_FUNCTION, _wrapped(qwen3.get_rope_index, _qwen3_vl_rope_index))
    model = importlib.import_module(QWEN2_5_VL_MODULE).Qwen25VLModel
    for name, replacement in (("__init__", _qwen2_5_vl_init), ("forward", _qwen2_5_vl_forward)):
        if not _is_ours(model.__dict__[name]):
            setattr(model, name, _wrapped(model.__dict__[name], replacement))


def installed() -> bool:
    """Whether :func:`install` has replaced Megatron-Bridge's position code in this process."""
    import sys

    module = sys.modules.get(QWEN3_VL_MODULE)
    return module is not None and _is_ours(module.get_rope_index)


def uninstall() -> None:
    """Put Megatron-Bridge's own position code back (models built meanwhile keep the engine's)."""
    import sys

    qwen3 = sys.modules.get(QWEN3_VL_MODULE)
    if qwen3 is not None and _is_ours(qwen3.get_rope_index):
        setattr(qwen3, QWEN3_VL_FUNCTION, qwen3.get_rope_index.__mmrope_original__)
    qwen2_5 = sys.modules.get(QWEN2_5_VL_MODULE)
    if qwen2_5 is not None:
        for name in ("__init__", "forward"):
            current = qwen2_5.Qwen25VLModel.__dict__[name]
            if _is_ours(current):
                setattr(qwen2_5.Qwen25VLModel, name, current.__mmrope_original__)
    _settings["engine"] = None


# -- the replacements ----------------------------------------------------------------------------


def _wrapped(original: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def function(*args: Any, **kwargs: Any) -> Any:
        return replacement(original, *args, **kwargs)

    function.__mmrope_original__ = original  # type: ignore[attr-defined]
    return function


def _is_ours(function: Any) -> bool:
    return hasattr(function, "__mmrope_original__")


def _qwen3_vl_rope_index(original: Callable[..., Any], spatial_merge_size: int, image_token_id: int,
                         video_token_id: int, vision_start_token_id: int, input_ids: torch.Tensor | None = None,
                         image_grid_thw: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                         attention_mask: torch.Tensor | None = None, packed_seq_params: Any = None) -> Any:
    """Megatron-Bridge's ``get_rope_index`` signature; the engine's positions."""
    if input_ids is None or (attention_mask is not None and attention_mask.dim() > 2 and packed_seq_params is None):
        return original(spatial_merge_size, image_token_id, video_token_id, vision_start_token_id, input_ids,
                        image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                        attention_mask=attention_mask, packed_seq_params=packed_seq_params)
    media = {"image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw}
    return _engine_positions(input_ids, attention_mask, packed_seq_params, media)


def _qwen2_5_vl_init(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> None:
    original(model, *args, **kwargs)
    model.get_rope_index = functools.partial(_qwen2_5_vl_rope_index, model)


def _qwen2_5_vl_forward(original: Callable[..., Any], model: Any, *args: Any, **kwargs: Any) -> Any:
    """The call's ``packed_seq_params``, for the positions the forward asks for."""
    bound = inspect.signature(original).bind(model, *args, **kwargs)
    token = _packed_seq_params.set(bound.arguments.get("packed_seq_params"))
    try:
        return original(model, *args, **kwargs)
    finally:
        _packed_seq_params.reset(token)


def _qwen2_5_vl_rope_index(model: Any, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None = None,
                           video_grid_thw: torch.Tensor | None = None, second_per_grid_ts: torch.Tensor | None = None,
                           attention_mask: torch.Tensor | None = None, **_: Any) -> Any:
    """transformers' ``Qwen2_5_VLModel.get_rope_index`` call as Megatron-Bridge makes it."""
    media = {"image_grid_thw": image_grid_thw, "video_grid_thw": video_grid_thw,
             "second_per_grid_ts": second_per_grid_ts}
    return _engine_positions(input_ids, attention_mask, _packed_seq_params.get(), media)


def _engine_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, packed_seq_params: Any,
                      media: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(3, B, S)`` positions and the deltas, from the installed engine."""
    engine = _settings["engine"]
    inputs = {key: value for key, value in media.items() if value is not None}
    if packed_seq_params is None or getattr(packed_seq_params, "cu_seqlens_q", None) is None:
        return engine.get_rope_index(input_ids, attention_mask, **inputs)
    segment_ids = _segment_ids(input_ids, packed_seq_params)
    positions, deltas = engine.get_rope_index(input_ids, None, segment_ids=segment_ids, **inputs)
    return positions.to(input_ids.device), deltas


def _segment_ids(input_ids: torch.Tensor, packed_seq_params: Any) -> torch.Tensor:
    """``(1, T)``: 1..K for the real tokens of each segment, 0 for the padding after them."""
    from mmrope_core.errors import InvalidInputError

    bounds = packed_seq_params.cu_seqlens_q.long().cpu()
    padded = getattr(packed_seq_params, "cu_seqlens_q_padded", None)
    starts = (bounds if padded is None else padded.long().cpu())[:-1]
    lengths = bounds[1:] - bounds[:-1]
    layout = bounds if padded is None else padded.long().cpu()
    total = int(layout[-1])
    if lengths.shape != starts.shape or bool((lengths > layout[1:] - layout[:-1]).any()):
        raise InvalidInputError(f"packed_seq_params' cu_seqlens_q {bounds.tolist()} do not fit its "
                                f"cu_seqlens_q_padded {layout.tolist()}: each segment's real length must be at most "
                                f"its padded one")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] != total:
        raise InvalidInputError(f"a packed THD batch is one (1, T) row of input_ids whose T is the last boundary "
                                f"({total}, from packed_seq_params), got input_ids of shape {tuple(input_ids.shape)}")
    segment_ids = torch.zeros(1, total, dtype=torch.long)
    for index, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        segment_ids[0, start:start + length] = index + 1
    return segment_ids.to(input_ids.device)
