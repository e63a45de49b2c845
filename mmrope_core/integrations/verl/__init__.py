"""A drop-in for verl's ``hf_processor``: verl's unchanged agent loop then takes every position
id from mmrope.

verl's ``AgentLoopWorker._compute_position_ids`` asks the processor for ``get_rope_index`` (and,
if present, ``get_rope_index_kwargs``) and falls back to 1-D positions when the processor has no
``get_rope_index``. :func:`hf_processor` returns a shallow copy of the processor, of the same
class, that carries those two from an mmrope engine, so verl reaches mmrope without any edit.

Switch with one config entry (verl imports it in every process before it builds the processor)::

    actor_rollout_ref.model.external_lib=mmrope_core.integrations.verl.patch

or call :func:`install` in your own entry point before verl builds its model config.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["RopeIndex", "RopeIndexKwargs", "as_verl_processor", "hf_processor", "install"]

#: Where verl 0.9.1 binds its processor factory; ``verl.workers.config.model`` imports it by name.
VERL_FACTORY_MODULES = ("verl.utils.tokenizer.tokenizer", "verl.utils.tokenizer", "verl.utils",
                        "verl.workers.config.model")


def hf_processor(name_or_path: Any, *, mm_processor_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """verl's ``hf_processor`` contract, with mmrope's positions: the processor of
    ``name_or_path`` ready for verl's agent loop, or None for a text-only model.

    Args:
        name_or_path: what ``AutoProcessor.from_pretrained`` and ``AutoConfig.from_pretrained`` read.
        mm_processor_kwargs: the processor keyword arguments positions depend on, used for every
            sample (verl does not hand its ``mm_processor_kwargs`` on to the processor's rope
            hooks): e.g. ``{"use_audio_in_video": True}`` for Qwen-Omni.
        kwargs: passed to both ``from_pretrained`` calls (verl passes ``trust_remote_code``).

    Unlike verl's factory, errors are raised: a processor that fails to load, or that no
    installed mmrope plugin handles (:class:`~mmrope_core.UnsupportedProcessorError`), does not
    silently turn into 1-D positions.
    """
    from transformers import AutoConfig, AutoProcessor, PreTrainedTokenizerBase

    processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    if isinstance(processor, PreTrainedTokenizerBase):  # a text-only checkpoint has no processor
        return None
    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    return as_verl_processor(processor, config, mm_processor_kwargs=mm_processor_kwargs)


def as_verl_processor(processor: Any, config: Any = None, *, mm_processor_kwargs: Mapping[str, Any] | None = None,
                      **engine_options: Any) -> Any:
    """A shallow copy of ``processor`` that verl's agent loop takes its positions from.

    The copy is of the processor's own class and shares its tokenizer and image processor; it
    adds ``config``, ``rope_engine`` and, for M-RoPE families, ``get_rope_index`` and
    ``get_rope_index_kwargs``. A 1-D family (Gemma4) gets no ``get_rope_index``, which is how
    verl recognises 1-D RoPE. Calling the copy processes under the family's validation policy
    (Gemma4's relaxed check). ``processor`` itself is not changed. ``engine_options`` go to
    :meth:`RopeEngine.from_processor <mmrope_core.RopeEngine.from_processor>`.
    """
    from mmrope_core.engine import RopeEngine

    engine = RopeEngine.from_processor(processor, config, **engine_options)
    drop_in = copy.copy(processor)
    drop_in.config = config
    drop_in.rope_engine = engine
    if engine.rope_kind == "mrope":
        drop_in.get_rope_index = RopeIndex(engine)
        drop_in.get_rope_index_kwargs = RopeIndexKwargs(engine, mm_processor_kwargs)
    policy = engine.validation_policy
    if not policy.strict:
        drop_in.validate_inputs = (_skip_validation if policy.validate is None
                                   else functools.partial(policy.validate, drop_in))
    return drop_in


class RopeIndex:
    """``processor.get_rope_index`` as verl calls it: keyword ``input_ids``, ``attention_mask``,
    the grids, verl's own ``mm_token_type_ids`` (ignored: the engine types tokens as the
    processor does) and what ``get_rope_index_kwargs`` added. Returns ``(3, B, L)`` positions
    and ``(B, 1)`` deltas."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __call__(self, input_ids: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        inputs = {key: value for key, value in kwargs.items() if value is not None}
        return self.engine.get_rope_index(input_ids, attention_mask, **inputs)

    def __repr__(self) -> str:
        return f"RopeIndex({self.engine!r})"


class RopeIndexKwargs:
    """``processor.get_rope_index_kwargs(multi_modal_inputs)``: what the family's positions
    need from one sample's processor outputs (video timing, audio lengths), with the fixed
    ``mm_processor_kwargs`` the drop-in was made with."""

    def __init__(self, engine: Any, mm_processor_kwargs: Mapping[str, Any] | None = None) -> None:
        self.engine = engine
        self.mm_processor_kwargs = dict(mm_processor_kwargs or {})

    def __call__(self, multi_modal_inputs: Mapping[str, Any]) -> dict[str, Any]:
        return self.engine.rope_index_kwargs(multi_modal_inputs, self.mm_processor_kwargs)

    def __repr__(self) -> str:
        return f"RopeIndexKwargs({self.engine!r}, mm_processor_kwargs={self.mm_processor_kwargs!r})"


def install(*, mm_processor_kwargs: Mapping[str, Any] | None = None) -> None:
    """Make verl's processor factory this module's :func:`hf_processor`, in this process.

    Rebinds ``hf_processor`` where verl 0.9.1 defines and imports it. Call it before verl builds
    its model config (``HFModelConfig``); as ``external_lib`` (see :mod:`.patch`) verl does that
    itself, in every process. Safe to call while ``verl`` itself is still importing (a
    ``VERL_USE_EXTERNAL_MODULES`` module): it imports no verl module that verl has not.
    """
    import importlib

    factory = hf_processor if mm_processor_kwargs is None else functools.partial(
        hf_processor, mm_processor_kwargs=dict(mm_processor_kwargs))
    importlib.import_module("verl.utils.tokenizer.tokenizer")
    for name in VERL_FACTORY_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.hf_processor = factory  # type: ignore[attr-defined]


def _skip_validation(*args: Any, **kwargs: Any) -> None:
    return None
