"""A drop-in for ms-swift's multimodal templates: their unchanged collators and packing then take
every M-RoPE position id from mmrope.

ms-swift 4.6.0's templates compute positions in one method, ``_get_position_ids(inputs)``, called
by the data collator on padded batches and by ``packing_row`` on each sample of a packed
(``padding_free`` / ``packing``) row; it calls the model's ``get_rope_index``, building a model on
the meta device when the template holds none. :func:`install` replaces that method on the
templates that define it (``Qwen2VLTemplate`` and its subclasses, ``Qwen2_5OmniTemplate`` and
Qwen3-Omni's, ``GLM4vPackingTemplateMixin``) with one that asks an engine built from the
template's processor and model config.

Switch with ms-swift's own option, which loads the file (see :mod:`.plugin`)::

    swift sft ... --external_plugins "$(python -m mmrope_core.integrations.swift)"

or call :func:`install` in your own code before training.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["install", "installed", "template_engine"]

#: Where ms-swift 4.6.0 defines ``_get_position_ids`` for M-RoPE templates.
TEMPLATE_CLASSES = {
    "swift.template.templates.qwen": ("Qwen2VLTemplate", "Qwen2_5OmniTemplate"),
    "swift.template.templates.glm": ("GLM4vPackingTemplateMixin",),
}

#: Where ms-swift 4.6.0 defines ``Template``, whose ``init_processor`` sets a template's processor and config.
TEMPLATE_BASE = "swift.template.base"
#: templates whose positions ms-swift computes only in training (the model computes them otherwise)
_TRAINING_ONLY = ("Qwen2_5OmniTemplate",)

_settings: dict[str, Any] = {"mm_processor_kwargs": {}, "convention": None}


def install(*, mm_processor_kwargs: Mapping[str, Any] | None = None, convention: str | None = None) -> None:
    """Make ms-swift's M-RoPE templates take their positions from mmrope, in this process.

    Args:
        mm_processor_kwargs: processor keyword arguments the positions depend on, for every
            sample, on top of the template's own ``use_audio_in_video`` (ms-swift's
            ``USE_AUDIO_IN_VIDEO`` setting).
        convention: the position convention (see :mod:`mmrope_core.conventions`; default
            transformers'), e.g. ``"vllm"`` for GRPO with vLLM rollouts. A name mmrope does not
            know is refused here (:class:`~mmrope_core.UnknownConventionError`), a template
            whose family lacks it when its processor is set.

    Idempotent: calling it again only replaces the settings.
    """
    from mmrope_core.conventions import known

    known(convention, "mmrope_core.integrations.swift.install(convention=...)")
    _settings["mm_processor_kwargs"] = dict(mm_processor_kwargs or {})
    _settings["convention"] = convention
    for module_name, class_names in TEMPLATE_CLASSES.items():
        module = importlib.import_module(module_name)
        for name in class_names:
            cls = getattr(module, name)
            current = cls.__dict__["_get_position_ids"]
            if not hasattr(current, "__mmrope_original__"):
                replacement = _replacing(current, training_only=name in _TRAINING_ONLY)
                setattr(cls, "_get_position_ids", replacement)  # noqa: B010 (rebound on purpose)
    base = importlib.import_module(TEMPLATE_BASE).Template
    if not hasattr(base.init_processor, "__mmrope_original__"):
        base.init_processor = _checking_the_convention(base.init_processor)


def installed() -> bool:
    """Whether :func:`install` has replaced the templates' position method in this process."""
    import sys

    module = sys.modules.get("swift.template.templates.qwen")
    return module is not None and hasattr(module.Qwen2VLTemplate.__dict__["_get_position_ids"], "__mmrope_original__")


def template_engine(template: Any) -> Any:
    """The engine a template's positions come from, built on first use from its processor and
    its model config (``template.config``)."""
    from mmrope_core.engine import RopeEngine

    convention = _settings["convention"]
    key = (id(template.processor), id(template.config), convention)
    cached = template.__dict__.get("_mmrope_engine")
    if cached is None or cached[0] != key:
        options = {} if convention is None else {"convention": convention}
        cached = (key, RopeEngine.from_processor(template.processor, template.config, **options))
        template.__dict__["_mmrope_engine"] = cached
        _warn_without_generated_mask(cached[1])
    return cached[1]


def _warn_without_generated_mask(engine: Any) -> None:
    """ms-swift's rows carry no ``generated_mask``: where the convention places generated tokens
    apart from a prefill (SGLang's Qwen3-Omni), say what the positions are instead."""
    import warnings

    from mmrope_core.errors import GeneratedMaskWarning

    if getattr(engine.binding.kernel, "reads_generated_mask", False):
        warnings.warn(GeneratedMaskWarning(
            f"the {engine.convention} convention places the tokens the rollout engine generated apart from a prefill "
            f"of the whole sequence for {type(engine.processor).__name__}, and ms-swift's templates carry no "
            f"generated_mask: every token is placed as a prefill, so replies the engine decoded elsewhere are placed "
            f"where it would have prefilled them. For those positions, train with mmrope's collators "
            f"(PaddedCollator, PackedCollator), which take each sample's generated_mask"), stacklevel=3)


def _checking_the_convention(original: Any) -> Any:
    """``Template.init_processor``, then, where a convention was asked for and the template takes
    its positions from mmrope, the engine: a family that lacks the convention is refused here."""

    @functools.wraps(original)
    def init_processor(self: Any, processor: Any) -> None:
        original(self, processor)
        if _settings["convention"] is not None and processor is not None and \
                hasattr(type(self)._get_position_ids, "__mmrope_original__"):
            template_engine(self)

    init_processor.__mmrope_original__ = original  # type: ignore[attr-defined]
    return init_processor


def _replacing(original: Any, *, training_only: bool) -> Any:
    @functools.wraps(original)
    def _get_position_ids(self: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        if training_only and not self.is_training:
            return {}
        return position_ids(self, inputs)

    _get_position_ids.__mmrope_original__ = original  # type: ignore[attr-defined]
    return _get_position_ids


def position_ids(template: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What ms-swift's ``_get_position_ids`` returns, from mmrope: ``{"position_ids": (4, B, L)}``,
    the template's own text row above the model's ``(t, h, w)``; float32 for Qwen3-Omni, whose
    positions can be fractional (ms-swift alone casts them to int64)."""
    import torch

    engine = template_engine(template)
    input_ids = inputs["input_ids"]
    _follow_the_layout(engine, template, input_ids.shape[0])
    mask = inputs.get("attention_mask_2d")
    if mask is None:
        mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    mm_processor_kwargs = {"use_audio_in_video": bool(getattr(template, "use_audio_in_video", False)),
                           **_settings["mm_processor_kwargs"]}
    seconds = {key for key, rule in engine.batch_layout.media.items() if rule.role in ("seconds", "stamps")}
    media = {key: _tensor(value) if key in seconds else value for key, value in inputs.items()}
    positions, _ = engine.get_rope_index(input_ids, mask, **engine.rope_index_kwargs(media, mm_processor_kwargs))
    return {"position_ids": template._concat_text_position_ids(positions)}  # ms-swift's own text row


def _follow_the_layout(engine: Any, template: Any, rows: int) -> None:
    """Refuse what ms-swift's batch would give the model otherwise than its samples alone: a
    padding side its layers get wrong, or a padded batch of a model whose positions number media
    across the batch (ms-swift computes a padded batch's positions in one call; a ``padding_free``
    or ``packing`` row calls once per sample). ms-swift drops the text row itself where it trains."""
    from mmrope_core.errors import CollateError, PaddingUnsupportedError

    model = getattr(engine.config, "model_type", type(engine.processor).__name__)
    if getattr(template, "is_training", False):  # ms-swift pads on the left when it is not training
        side = template.padding_side
        refused = engine.batch_layout.refused_sides.get(side)
        if refused:
            other = "right" if side == "left" else "left"
            raise PaddingUnsupportedError(f"{model} cannot train samples padded on the {side}: {refused}; set "
                                          f"ms-swift's padding_side to {other!r}")
    if rows > 1 and not engine.samples_independent:
        raise CollateError(f"{model}'s positions may number media across the batch (mmrope cannot show "
                           f"otherwise), and ms-swift computes a padded batch's positions in one call over its "
                           f"{rows} samples; train with --padding_free true (or --packing true), where each sample's "
                           f"positions are computed alone, or with one sample a batch")


def _tensor(value: Any) -> Any:
    """Seconds per grid, which ms-swift gathers as a Python list, as the float32 tensor a processor gives."""
    import torch

    return torch.tensor(value, dtype=torch.float32) if isinstance(value, list) else value
