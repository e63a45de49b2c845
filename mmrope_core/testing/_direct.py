"""What the fuzzer holds engines to: the positions the model computes itself. That is the
``get_rope_index`` of the model class transformers maps the config to (for an Omni model, its
thinker's), bound to the config alone and fed as the model's forward feeds it; or, for a model
without one, the valid tokens counted. None of mmrope's input reading runs here: the engine's
declared layout only names which keys the forward renames."""

from __future__ import annotations

import inspect
import types
from collections.abc import Mapping
from typing import Any

import torch

_SUPPLIED = frozenset({"self", "input_ids", "attention_mask", "mm_token_type_ids"})


class ModelPositions:
    """The model's own positions for one processor and config, in the engine's layouts.

    ``method`` is the model's ``get_rope_index`` bound to a config-only model, or None for
    1-D RoPE (``clip(cumsum(mask) - 1, 0)``, as trainers count them). ``media`` is the engine's
    declared media keys (``engine.batch_layout.media``): by their roles the forward's renames are
    found, whatever the family names its keys."""

    def __init__(self, processor: Any, method: Any, media: Mapping[str, Any] | None = None) -> None:
        self.processor = processor
        self.method = method
        self.takes = frozenset(inspect.signature(method).parameters) if method is not None else frozenset()
        self.media = dict(media or {})

    @classmethod
    def of(cls, processor: Any, config: Any, rope_kind: str,
           media: Mapping[str, Any] | None = None) -> ModelPositions | None:
        """None where transformers maps the config to no model class with ``get_rope_index``.
        Without ``media``, the layout an engine of the installed plugins declares for the processor."""
        if rope_kind == "1d":
            return cls(processor, None, media)
        found = _model_class(config)
        if found is None:
            return None
        if media is None:
            from ..engine import RopeEngine

            media = RopeEngine.from_processor(processor, config).batch_layout.media
        model_class, model_config = found
        return cls(processor, _config_only(model_class, model_config).get_rope_index, media)

    def rope_index(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   inputs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``get_rope_index(input_ids, attention_mask, **inputs)``: the arguments it names, and the
        token types by the processor's own rule."""
        ids = input_ids.reshape(1, -1) if input_ids.dim() == 1 else input_ids
        ids = ids.long()
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.reshape(ids.shape).long()
        arguments = {key: _wide(value) for key, value in inputs.items() if key in self.takes and key not in _SUPPLIED}
        if "mm_token_type_ids" in self.takes:
            arguments["mm_token_type_ids"] = torch.tensor(self.processor.create_mm_token_type_ids(ids.tolist()))
        return self.method(input_ids=ids, attention_mask=mask, **arguments)

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     multi_modal_inputs: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any] | None) -> Any:
        """``(B, rows + 1, L)``: the valid tokens counted (1 at padding) above the model's
        ``(t, h, w)``; ``(B, L)`` for 1-D RoPE."""
        ids = input_ids.reshape(1, -1) if input_ids.dim() == 1 else input_ids
        valid = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else \
            attention_mask.reshape(ids.shape).bool()
        counted = valid.long().cumsum(-1) - 1
        if self.method is None:
            return counted.clamp(min=0)
        positions, _ = self.rope_index(ids, valid, self.forward_arguments(multi_modal_inputs, mm_processor_kwargs))
        text = torch.where(valid, counted, 1).to(positions.dtype)
        return torch.cat((text[:, None], positions.transpose(0, 1)), dim=1)

    def forward_arguments(self, multi_modal_inputs: Mapping[str, Any],
                          mm_processor_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        """What the model's forward passes its ``get_rope_index`` from the processor's outputs: a
        seconds (or time stamps) argument it takes under another name than the processor's (as
        Qwen-Omni's ``video_second_per_grid`` for ``second_per_grids``), and audio lengths counted
        from the audio mask, each matched by its declared role."""
        arguments = dict(mm_processor_kwargs or {})
        arguments.update(multi_modal_inputs)
        for name in sorted(self.takes - set(multi_modal_inputs)):
            wanted = self.media.get(name)
            if wanted is None or wanted.role not in ("seconds", "stamps"):
                continue
            for key, rule in self.media.items():
                if key in multi_modal_inputs and rule.role == wanted.role and rule.grid == wanted.grid:
                    arguments[name] = multi_modal_inputs[key]
        masks = [key for key, rule in self.media.items()
                 if rule.role == "audio_mask" and multi_modal_inputs.get(key) is not None]
        lengths = [name for name in sorted(self.takes) if getattr(self.media.get(name), "role", None) == "audio_lengths"]
        if masks and lengths:
            arguments[lengths[0]] = multi_modal_inputs[masks[0]].sum(-1)
        return arguments


def _wide(value: Any) -> Any:
    """Integers as int64, as processors give them: in a narrower dtype the model's own arithmetic
    on a grid wraps around, and there is no result to hold an engine to."""
    if isinstance(value, torch.Tensor) and value.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        return value.long()
    return value


#: transformers' auto mappings that name a vision-language model's class, base models first
_MAPPINGS = ("MODEL_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "MODEL_FOR_MULTIMODAL_LM_MAPPING")


def _model_class(config: Any) -> tuple[type, Any] | None:
    """The model class transformers maps ``config`` (an Omni model's: its thinker's) to that has
    ``get_rope_index`` (or the one of its module for that config, where a generation class is
    mapped), and the config it takes."""
    import sys

    from transformers.models.auto import modeling_auto

    from ..language_models import nested_language_models

    for candidate in (*nested_language_models(config), config):  # (an Omni model's thinker computes its positions)
        for name in _MAPPINGS:
            mapping = getattr(modeling_auto, name, None)
            if mapping is None or type(candidate) not in mapping:
                continue
            mapped = mapping[type(candidate)]
            for model_class in mapped if isinstance(mapped, tuple) else (mapped,):
                for found in (model_class, *vars(sys.modules[model_class.__module__]).values()):
                    if isinstance(found, type) and hasattr(found, "get_rope_index") \
                            and getattr(found, "config_class", None) is type(candidate):
                        return found, candidate
    return None


def _config_only(model_class: type, config: Any) -> Any:
    """A model of ``model_class`` holding its config and no weights: its methods bound to it (its
    static methods as they are) and the merge size its ``__init__`` copies from the config."""
    model = types.SimpleNamespace(config=config)
    for name in dir(model_class):
        found = inspect.getattr_static(model_class, name, None)
        if isinstance(found, staticmethod):
            setattr(model, name, found.__func__)
        elif inspect.isfunction(found) and not name.startswith("__"):
            setattr(model, name, types.MethodType(found, model))
    merge = getattr(getattr(config, "vision_config", None), "spatial_merge_size", None)
    if merge is not None:
        model.spatial_merge_size = merge
    return model
