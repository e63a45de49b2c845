"""A drop-in for verl's ``hf_processor``: verl's unchanged agent loop then takes every position
id from mmrope.

verl's ``AgentLoopWorker._compute_position_ids`` asks the processor for ``get_rope_index`` (and,
if present, ``get_rope_index_kwargs``) and falls back to 1-D positions when the processor has no
``get_rope_index``. :func:`hf_processor` returns a shallow copy of the processor, of the same
class, that carries those two from an mmrope engine, so verl reaches mmrope without any edit.

Switch with one config entry (verl imports it in every process before it builds the processor)::

    actor_rollout_ref.model.external_lib=mmrope_core.integrations.verl.patch

or call :func:`install` in your own entry point before verl builds its model config.

The positions follow the rollout engine verl's config names (``actor_rollout_ref.rollout.name``:
``vllm`` or ``sglang``), so that the trainer scores each response under the positions it was
sampled with; ``actor_rollout_ref.rollout.custom.mmrope_convention`` names a convention instead
(``transformers``, ``vllm-0.33``, ...). The agent loop's response mask reaches the engine as
``generated_mask``: the tokens the rollout engine generated, each turn a request of its own.
verl's trainer and each agent-loop worker check the rollout engine as soon as they hold the
processor and the config, so that one mmrope cannot place is refused at start-up.
"""

from __future__ import annotations

import contextvars
import copy
import dataclasses
import functools
import importlib.abc
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["RopeIndex", "RopeIndexKwargs", "as_verl_processor", "hf_processor", "install", "rollout_convention"]

#: Where verl 0.9.1 binds its processor factory; ``verl.workers.config.model`` imports it by name.
VERL_FACTORY_MODULES = ("verl.utils.tokenizer.tokenizer", "verl.utils.tokenizer", "verl.utils",
                        "verl.workers.config.model")
#: Where verl 0.9.1's agent loop computes position ids, from each trajectory.
VERL_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
#: The entry of ``actor_rollout_ref.rollout.custom`` that names a convention.
CONVENTION_ENTRY = "mmrope_convention"
#: verl's rollout engines (``actor_rollout_ref.rollout.name``) and the conventions of their positions.
ROLLOUT_CONVENTIONS = {"vllm": "vllm", "sglang": "sglang"}
#: Where verl 0.9.1 first holds both a processor and the rollout config, by module: the class, and
#: the attribute its rollout config is read from. The TaskRunner's trainer sets its processor before
#: any worker starts; each agent-loop worker sets its own before its first rollout.
START_UP_CHECKS = {
    "verl.trainer.ppo.v1.trainer_base": ("PPOTrainer", "config"),
    "verl.trainer.ppo.ray_trainer": ("RayPPOTrainer", "config"),
    VERL_AGENT_LOOP: ("AgentLoopWorker", "rollout_config"),
}


def hf_processor(name_or_path: Any, *, mm_processor_kwargs: Mapping[str, Any] | None = None,
                 convention: str | None = None, **kwargs: Any) -> Any:
    """verl's ``hf_processor`` contract, with mmrope's positions: the processor of
    ``name_or_path`` ready for verl's agent loop, or None for a text-only model.

    Args:
        name_or_path: what ``AutoProcessor.from_pretrained`` and ``AutoConfig.from_pretrained`` read.
        mm_processor_kwargs: the processor keyword arguments positions depend on, used for every
            sample (verl does not hand its ``mm_processor_kwargs`` on to the processor's rope
            hooks): e.g. ``{"use_audio_in_video": True}`` for Qwen-Omni.
        convention: the position convention (see :mod:`mmrope_core.conventions`); None follows
            the rollout engine of verl's config (see :func:`rollout_convention`).
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
    _follow_rollouts()
    return as_verl_processor(processor, config, mm_processor_kwargs=mm_processor_kwargs, convention=convention)


def as_verl_processor(processor: Any, config: Any = None, *, mm_processor_kwargs: Mapping[str, Any] | None = None,
                      convention: str | None = None, **engine_options: Any) -> Any:
    """A shallow copy of ``processor`` that verl's agent loop takes its positions from.

    The copy is of the processor's own class and shares its tokenizer and image processor; it
    adds ``config``, ``rope_engine`` and, for M-RoPE families, ``get_rope_index`` and
    ``get_rope_index_kwargs``. A 1-D family (Gemma4) gets no ``get_rope_index``, which is how
    verl recognises 1-D RoPE. Calling the copy processes under the family's validation policy
    (Gemma4's relaxed check). ``processor`` itself is not changed. ``engine_options`` go to
    :meth:`RopeEngine.from_processor <mmrope_core.RopeEngine.from_processor>`.

    ``convention`` fixes the position convention, refused here where the family lacks it; None
    follows the rollout engine of the agent loop that computes the positions, whenever verl's
    agent-loop module is imported (before or after the copy is made or unpickled), and gives
    transformers' positions outside one.
    """
    from mmrope_core.engine import RopeEngine

    if convention is not None:
        engine_options["convention"] = convention
    engine = RopeEngine.from_processor(processor, config, **engine_options)
    _refuse_text_row(engine)
    drop_in = copy.copy(processor)
    drop_in.config = config
    drop_in.rope_engine = engine
    if engine.rope_kind == "mrope":
        drop_in.get_rope_index = RopeIndex(engine, follow_rollout=convention is None)
        drop_in.get_rope_index_kwargs = RopeIndexKwargs(engine, mm_processor_kwargs)
    if engine.batch_layout.refused_sides.get("left"):  # the trainer's config says whether verl's batch keeps padding
        _follow_rollouts()
    policy = engine.validation_policy
    if not policy.strict:
        drop_in.validate_inputs = (_skip_validation if policy.validate is None
                                   else functools.partial(policy.validate, drop_in))
    return drop_in


def _refuse_text_row(engine: Any) -> None:
    """verl's agent loop puts a text row above the rows ``get_rope_index`` returns: a model that
    takes only its own rows (HunYuan-VL's) cannot train on verl's positions."""
    from mmrope_core.errors import UnsupportedProcessorError

    if engine.rope_kind == "mrope" and not engine.batch_layout.text_positions:
        raise UnsupportedProcessorError(
            f"{getattr(engine.config, 'model_type', type(engine.processor).__name__)}'s model takes only its "
            f"{engine.binding.kernel.rope_rows} rows of positions, and verl's agent loop puts a text row above the rows "
            f"get_rope_index returns, which the model refuses; train it with mmrope_core.collators.PaddedCollator")


def _refuse_left_padding(engine: Any, config: Any) -> None:
    """verl pads each prompt on the left; where its actor keeps the padding (``use_remove_padding``
    off), a model whose layers get left padding wrong is refused."""
    from mmrope_core.errors import PaddingUnsupportedError

    refused = engine.batch_layout.refused_sides.get("left")
    model = getattr(getattr(config, "actor_rollout_ref", None), "model", None)
    if refused and model is not None and not getattr(model, "use_remove_padding", False):
        raise PaddingUnsupportedError(
            f"{getattr(engine.config, 'model_type', type(engine.processor).__name__)} cannot train samples padded "
            f"on the left: {refused}; verl pads prompts on the left and keeps the padding with "
            f"actor_rollout_ref.model.use_remove_padding=false: set it to true")


class RopeIndex:
    """``processor.get_rope_index`` as verl calls it: keyword ``input_ids``, ``attention_mask``,
    the grids, verl's own ``mm_token_type_ids`` (ignored: the engine types tokens as the
    processor does) and what ``get_rope_index_kwargs`` added. Returns ``(3, B, L)`` positions
    and ``(B, 1)`` deltas.

    Inside verl's agent loop, the trajectory being post-processed (when ``input_ids`` hold its
    tokens) gives the ``generated_mask`` (its response mask) and, with ``follow_rollout``, the
    convention: that of the rollout engine verl's config names (:func:`rollout_convention`)."""

    def __init__(self, engine: Any, follow_rollout: bool = False) -> None:
        self.engine = engine
        self.follow_rollout = follow_rollout
        self._engines = {engine.convention: engine}
        if follow_rollout:  # in any process it is built or unpickled in, in any order of verl's imports
            _follow_rollouts()

    def __call__(self, input_ids: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        inputs = {key: value for key, value in kwargs.items() if value is not None}
        if input_ids.shape[0] > 1 and not self.engine.samples_independent:
            from mmrope_core.errors import CollateError

            raise CollateError(f"{self.engine!r} may number media across the batch (mmrope cannot show otherwise): "
                               f"call get_rope_index on one sample at a time, as verl's agent loop does")
        trajectory = _TRAJECTORY.get()
        # the trajectory recorded last, where these are its tokens (not those of an earlier call's)
        generated = None if trajectory is None else trajectory.generated_mask(input_ids, attention_mask)
        if trajectory is None or generated is None:
            return self.engine.get_rope_index(input_ids, attention_mask, **inputs)
        engine = self.for_convention(rollout_convention(trajectory.rollout)) if self.follow_rollout else self.engine
        return engine.get_rope_index(input_ids, attention_mask, generated_mask=generated, **inputs)

    def for_convention(self, convention: str) -> Any:
        """The engine of ``convention``, built on first use."""
        engine = self._engines.get(convention)
        if engine is None:
            engine = self._engines[convention] = self.engine.with_convention(convention)
        return engine

    def __getstate__(self) -> dict[str, Any]:
        return {"engine": self.engine, "follow_rollout": self.follow_rollout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["engine"], state["follow_rollout"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"RopeIndex({self.engine!r}{', following the rollout' if self.follow_rollout else ''})"


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


def install(*, mm_processor_kwargs: Mapping[str, Any] | None = None, convention: str | None = None) -> None:
    """Make verl's processor factory this module's :func:`hf_processor`, in this process.

    Rebinds ``hf_processor`` where verl 0.9.1 defines and imports it, and lets its agent loop hand
    each trajectory's rollout engine and response mask on to the positions. Call it before verl
    builds its model config (``HFModelConfig``); as ``external_lib`` (see :mod:`.patch`) verl does
    that itself, in every process. Safe to call while ``verl`` itself is still importing (a
    ``VERL_USE_EXTERNAL_MODULES`` module): it imports no verl module that verl has not.
    ``convention`` fixes the convention of every processor (None: see :func:`rollout_convention`).
    """
    import importlib

    from mmrope_core.conventions import known

    known(convention, "mmrope_core.integrations.verl.install(convention=...)")
    options: dict[str, Any] = {key: value for key, value in (("mm_processor_kwargs", mm_processor_kwargs),
                                                             ("convention", convention)) if value is not None}
    factory = functools.partial(hf_processor, **options) if options else hf_processor
    importlib.import_module("verl.utils.tokenizer.tokenizer")
    for name in VERL_FACTORY_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            module.hf_processor = factory  # type: ignore[attr-defined]
    _follow_rollouts()


def rollout_convention(rollout_config: Any) -> str:
    """The position convention of verl's rollout config (``actor_rollout_ref.rollout``): its
    ``custom.mmrope_convention`` where set, else that of the engine it names (``vllm`` or
    ``sglang``, the newest releases mmrope knows). Raises
    :class:`~mmrope_core.UnknownConventionError` for an engine whose positions mmrope does not
    know (``trtllm``), naming the entry that decides."""
    from mmrope_core.errors import UnknownConventionError

    custom = getattr(rollout_config, "custom", None) or {}
    named = custom.get(CONVENTION_ENTRY) if hasattr(custom, "get") else None
    if named is not None:
        return str(named)
    engine = getattr(rollout_config, "name", None)
    if engine not in ROLLOUT_CONVENTIONS:
        raise UnknownConventionError(
            f"mmrope knows the positions of verl's rollout engines {', '.join(map(repr, ROLLOUT_CONVENTIONS))}, not "
            f"{engine!r} (actor_rollout_ref.rollout.name). Name the convention its positions follow with "
            f"+actor_rollout_ref.rollout.custom.{CONVENTION_ENTRY}=... ('transformers' trains on transformers' "
            f"positions)"
        )
    return ROLLOUT_CONVENTIONS[engine]


# -- the agent loop's trajectories --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Trajectory:
    """What verl's agent loop post-processes: its rollout config (``actor_rollout_ref.rollout``),
    and its tokens with the response mask (1 where the rollout engine generated the token)."""

    rollout: Any
    tokens: Sequence[int]
    generated: Sequence[int]

    def generated_mask(self, input_ids: Any, attention_mask: Any) -> Any:
        """The trajectory's generated tokens laid out as ``input_ids`` (``(1, L)``, padded as verl
        pads it), or None where ``input_ids`` hold other tokens."""
        import torch

        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            return None
        valid = torch.ones_like(input_ids[0], dtype=torch.bool) if attention_mask is None else attention_mask[0].bool()
        tokens = torch.as_tensor(self.tokens, dtype=input_ids.dtype, device=input_ids.device)
        if int(valid.sum()) != tokens.numel() or not torch.equal(input_ids[0][valid], tokens):
            return None
        mask = torch.zeros_like(input_ids, dtype=torch.bool)
        mask[0, valid] = torch.as_tensor(self.generated, dtype=torch.bool, device=input_ids.device)
        return mask


_TRAJECTORY: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar("mmrope_verl_trajectory",
                                                                                  default=None)


def _follow_rollouts() -> None:
    """Let verl tell the drop-in which trajectory it computes positions for, and check the
    rollout engine where verl first holds a processor and its rollout config: in the verl
    modules imported already, and in the others as they are imported."""
    for name in START_UP_CHECKS:
        module = sys.modules.get(name)
        if module is not None:
            _patch(module)
        else:
            _AFTER_IMPORT.add(name, _patch)


def _patch(module: ModuleType) -> None:
    class_name, rollout_attribute = START_UP_CHECKS[module.__name__]
    cls = getattr(module, class_name, None)
    if cls is None:
        return
    for attribute in ("processor", rollout_attribute):
        if attribute not in cls.__dict__:  # an instance attribute (a class default is left alone)
            setattr(cls, attribute, _CheckedOnSet(attribute, rollout_attribute))
    if module.__name__ == VERL_AGENT_LOOP:
        _record_trajectories(cls)


class _CheckedOnSet:
    """An attribute of a verl class that, once the object holds both its processor and its
    rollout config, builds the drop-in's engine of that rollout: an engine mmrope has no
    convention for, or one the family lacks, is refused at start-up instead of at the first
    rollout."""

    def __init__(self, name: str, rollout_attribute: str) -> None:
        self.name, self.rollout_attribute = name, rollout_attribute

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        try:
            return instance.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.name] = value
        processor = instance.__dict__.get("processor")
        index = getattr(processor, "get_rope_index", None)
        rollout = instance.__dict__.get(self.rollout_attribute)
        if self.rollout_attribute == "config" and rollout is not None and hasattr(processor, "rope_engine"):
            _refuse_left_padding(processor.rope_engine, rollout)
        if isinstance(index, RopeIndex) and index.follow_rollout and rollout is not None:
            if self.rollout_attribute == "config":  # a trainer holds verl's whole config
                rollout = getattr(getattr(rollout, "actor_rollout_ref", None), "rollout", None)
            if rollout is not None:
                index.for_convention(rollout_convention(rollout))

    def __delete__(self, instance: Any) -> None:
        del instance.__dict__[self.name]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module right after it is imported (first in ``sys.meta_path``; it
    finds nothing itself, and leaves the module's loader as it was)."""

    def __init__(self) -> None:
        self.pending: dict[str, Callable[[ModuleType], None]] = {}
        self.lock = threading.Lock()

    def add(self, name: str, function: Callable[[ModuleType], None]) -> None:
        with self.lock:
            self.pending[name] = function
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        function = self.pending.get(name)
        if function is None:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *args: None)(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RunningAfter(spec.loader, function)
        return spec


class _RunningAfter:
    """A module's own loader, then ``function`` on the module."""

    def __init__(self, loader: Any, function: Callable[[ModuleType], None]) -> None:
        self.loader, self.function = loader, function

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # type: ignore[union-attr]
        self.loader.exec_module(module)
        self.function(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


_AFTER_IMPORT = _AfterImport()


def _record_trajectories(worker: Any) -> None:
    """The agent loop's ``_compute_multi_modal_inputs(output, input_ids)``, which runs right
    before each ``_compute_position_ids``, records the trajectory."""
    if hasattr(worker._compute_multi_modal_inputs, "__mmrope_original__"):
        return
    original = worker._compute_multi_modal_inputs

    @functools.wraps(original)
    def _compute_multi_modal_inputs(self: Any, output: Any, input_ids: Any) -> Any:
        _TRAJECTORY.set(_trajectory_of(self, output))
        return original(self, output, input_ids)

    _compute_multi_modal_inputs.__mmrope_original__ = original  # type: ignore[attr-defined]
    worker._compute_multi_modal_inputs = _compute_multi_modal_inputs


def _trajectory_of(worker: Any, output: Any) -> _Trajectory | None:
    """The trajectory ``output`` of ``worker``, where its processor is this module's drop-in."""
    if not isinstance(getattr(getattr(worker, "processor", None), "get_rope_index", None), RopeIndex):
        return None
    prompt, response = list(output.prompt_ids), list(output.response_ids)
    generated = list(output.response_mask or [1] * len(response))
    return _Trajectory(worker.rollout_config, prompt + response,
                       [0] * len(prompt) + generated[:len(response)] + [0] * (len(response) - len(generated)))


def _skip_validation(*args: Any, **kwargs: Any) -> None:
    return None
