"""Which positions a model config asks for, read off the installed transformers at run time.

No list of model types: a config's ``model_type`` is looked up in transformers' own auto
mappings, and the model class found there says what the model does.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any, Literal

#: The auto mappings searched, in order: the base models (where ``get_rope_index`` lives), then the
#: image-text-to-text and multimodal heads (the Omni thinkers of transformers 5.10 are only there).
MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES")
#: The same mappings by config class, which also hold models registered with ``AutoModel.register``.
_BY_CONFIG = ("MODEL_MAPPING", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING", "MODEL_FOR_MULTIMODAL_LM_MAPPING")

#: How deep :func:`computes_positions_with` follows ``self.<method>(`` calls from ``forward``.
_CALL_DEPTH = 4
_SELF_CALL = re.compile(r"self\.(\w+)\(")


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a config asks for.

    Attributes:
        kind: ``"mrope"`` (``model_class.get_rope_index`` computes the positions), ``"1d"``, or
            None when the config does not say (a model type transformers does not know, or one
            that declares M-RoPE sections but has no ``get_rope_index`` to compute them).
        model_type: the config's ``model_type``.
        model_class: for ``"mrope"``, the class whose ``get_rope_index`` is the reference.
        config: the config that method reads (for Omni models, the thinker's).
        reason: one line saying why, for listings and errors.
    """

    kind: Literal["mrope", "1d"] | None
    model_type: str
    model_class: type | None = None
    config: Any = None
    reason: str = ""


def decide(config: Any) -> Decision:
    """The positions ``config``'s model computes, from the installed transformers alone.

    M-RoPE when the model class of the config (or of its ``thinker_config``) defines
    ``get_rope_index`` and its ``forward`` computes positions with it. 1-D when the model type
    has a model class in transformers' auto mappings, none with a ``get_rope_index`` that its
    ``forward`` uses, and no text config declaring M-RoPE sections. Otherwise undecided.
    """
    model_type = str(getattr(config, "model_type", ""))
    found = rope_model_class(config)
    if found is not None:
        model_class, read = found
        if computes_positions_with(model_class, "get_rope_index"):
            return Decision("mrope", model_type, model_class, read,
                            f"{model_class.__name__}.get_rope_index computes the positions")
        unused = f"{model_class.__name__} has a get_rope_index that its forward never calls"
    else:
        unused = ""
    if declares_mrope(config):
        return Decision(None, model_type, reason="the config declares M-RoPE sections, but no model class of "
                                                 "this transformers computes them with get_rope_index")
    classes = list(model_classes(config))
    if not classes:
        return Decision(None, model_type, reason=f"transformers has no model class for model_type {model_type!r}")
    why = unused or f"{classes[0].__name__} has no get_rope_index"
    return Decision("1d", model_type, config=config, reason=f"{why} and the config declares no M-RoPE sections")


def rope_model_class(config: Any) -> tuple[type, Any] | None:
    """The class defining ``get_rope_index`` for ``config``, and the config it reads: the config
    itself or its ``thinker_config`` (Omni). Auto mappings first; then, for a model type whose
    mapped classes lack the method (PaddleOCR-VL in transformers 5.10), its own modeling module."""
    for candidate in _configs(config):
        for model_class in model_classes(candidate):
            if hasattr(model_class, "get_rope_index"):
                return model_class, candidate
    for candidate in _configs(config):
        for model_class in _module_classes(str(getattr(candidate, "model_type", ""))):
            return model_class, candidate
    return None


def model_classes(config: Any) -> Iterator[type]:
    """The classes transformers' auto mappings give ``config``'s model type, importable ones only,
    then those registered for its config class."""
    model_type = str(getattr(config, "model_type", ""))
    from transformers.models.auto import modeling_auto

    for mapping in MAPPINGS:
        names = getattr(modeling_auto, mapping, {}).get(model_type)
        for name in [names] if isinstance(names, str) else names or ():
            model_class = _resolve(model_type, name)
            if model_class is not None:
                yield model_class
    for mapping in _BY_CONFIG:
        try:
            found = getattr(modeling_auto, mapping)[type(config)]
        except Exception:  # not in this mapping, or not importable
            continue
        yield from found if isinstance(found, (tuple, list)) else (found,)


def computes_positions_with(model_class: type, method: str) -> bool:
    """Whether ``model_class.forward`` reaches ``self.<method>(`` through the methods it calls on
    ``self``, read from their source. A class defining ``get_rope_index`` that its forward never
    calls (EXAONE 4.5 in transformers 5.10, whose language model counts 1-D positions) is not an
    M-RoPE model. Where the source cannot be read the method is taken to be used."""
    seen, frontier = {"forward"}, ["forward"]
    for _ in range(_CALL_DEPTH):
        called: list[str] = []
        for name in frontier:
            function = getattr(model_class, name, None)
            if function is None:
                continue
            try:
                source = inspect.getsource(function)
            except (OSError, TypeError):
                return True
            for callee in _SELF_CALL.findall(source):
                if callee == method:
                    return True
                if callee not in seen:
                    seen.add(callee)
                    called.append(callee)
        frontier = called
    return False


def sees_images(config: Any) -> bool:
    """Whether ``config`` describes a model that takes images: transformers lists its model type
    among the image-text-to-text or multimodal models, or it has a vision sub-config."""
    from transformers.models.auto import modeling_auto

    model_type = str(getattr(config, "model_type", ""))
    if any(model_type in getattr(modeling_auto, mapping, {}) for mapping in MAPPINGS[1:]):
        return True
    return any("vision" in key for key in getattr(config, "sub_configs", None) or {}) or hasattr(config, "vision_config")


def declares_mrope(config: Any) -> bool:
    """Whether the config or one of its text configs lists M-RoPE sections (``mrope_section``,
    or HunYuan's ``xdrope_section``) in its RoPE parameters. Many M-RoPE checkpoints' defaults
    leave them to the model, so their absence proves nothing."""
    for candidate in _with_text_configs(config):
        for key in ("rope_parameters", "rope_scaling"):
            parameters = getattr(candidate, key, None)
            if isinstance(parameters, dict) and ({"mrope_section", "xdrope_section"} & set(parameters)):
                return True
    return False


def _configs(config: Any) -> Iterator[Any]:
    yield config
    thinker = getattr(config, "thinker_config", None)
    if thinker is not None:  # the talker has a get_rope_index too: only the thinker is asked
        yield thinker


def _with_text_configs(config: Any) -> Iterator[Any]:
    for candidate in _configs(config):
        yield candidate
        text = getattr(candidate, "text_config", None)
        if text is not None:
            yield text


def _resolve(model_type: str, name: str) -> type | None:
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    try:  # the top-level namespace knows classes living in another model's module (glmga: Glm46VModel)
        return getattr(transformers, name)
    except (AttributeError, ImportError, RuntimeError):
        pass
    try:
        module = importlib.import_module(f"transformers.models.{model_type_to_module_name(model_type)}")
        return getattr(module, name)
    except (AttributeError, ImportError, RuntimeError):
        return None


@functools.cache
def _module_classes(model_type: str) -> tuple[type, ...]:
    """Classes of the model type's own modeling module that define ``get_rope_index`` (talkers
    left out: an Omni talker's method answers for the thinker)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    if not model_type:
        return ()
    module_name = model_type_to_module_name(model_type)
    try:
        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except (ImportError, RuntimeError):
        return ()
    return tuple(value for name, value in vars(module).items()
                 if inspect.isclass(value) and value.__module__ == module.__name__
                 and "get_rope_index" in vars(value) and "Talker" not in name)
