"""What the trainer calls: positions for a batch, from the kernel a plugin bound."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from . import _guard, processor_outputs
from ._binding import bind, expect, read_mask_options
from ._names import checked_keywords, refuse_misspelt_keywords
from .batching import COMMON, BatchLayout
from .conventions import ALIASES, asked
from .errors import (
    InvalidInputError,
    PackingUnsupportedError,
    PluginConflictError,
    PluginContractError,
    RopeIndexUnavailableError,
    SegmentCutError,
)
from .independence import samples_independent
from .inputs import MODEL_INPUTS, ReadOnlyInputs, read_batch, read_generated_mask, require_mappings
from .manager import PluginInfo, PluginManager, get_plugin_manager
from .media import read_media, require_string_keys
from .options import EngineOptions
from .packed_layout import PackedLayout
from .positions import one_d_positions
from .types import STRICT, RopeBinding, ValidationPolicy

_TEXT_ONLY = RopeBinding(kind="1d", implementation="mask", description="no processor: 1-D positions")
_OUTSIDE_TEXT_ROW = 1  # what tokens outside every segment hold in the text row (0 in the others)
#: get_rope_index's own keywords, besides the family's inputs
_OWN_KEYWORDS = ("attention_mask", "cu_seqlens", "segment_ids", "generated_mask")
_KERNEL_ADVICE = "Check the inputs against the processor's output, or try implementation='reference'"


class RopeEngine:
    """Computes position ids for one processor (one model family).

    Build it once with :meth:`from_processor` or :meth:`from_pretrained`; every plugin hook that
    does not depend on the batch is resolved then. The engine is thread-safe and pickles (a
    worker rebuilds it from the processor and config with its own installed plugins).
    """

    def __init__(self, processor: Any, config: Any, binding: RopeBinding, *, plugin: PluginInfo | None = None,
                 policy: ValidationPolicy = STRICT, varlen_keys: frozenset[str] = frozenset(),
                 plugins: PluginManager | None = None, options: Mapping[str, Any] | None = None,
                 layout: BatchLayout = COMMON) -> None:
        self.processor = processor
        self.config = config
        self.binding = binding
        self.plugin = plugin
        self.validation_policy = policy
        self.varlen_keys = varlen_keys
        #: how the model takes a batch (what its media keys hold, those batched by the family's own rule,
        #: padding sides)
        self.batch_layout = layout
        self._plugins = plugins or get_plugin_manager()
        self._options = types.MappingProxyType(dict(options or {}))

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def from_processor(
        cls, processor: Any, config: Any = None, *, plugin_manager: PluginManager | None = None, **options: Any
    ) -> RopeEngine:
        """Ask the installed plugins how to compute positions for ``processor``.

        ``processor=None`` (a text-only model) gives 1-D positions. ``options`` are passed to the
        plugins' ``bind_rope_index`` (e.g. ``implementation="reference"``); one that the plugin
        binding the processor does not read raises :class:`~mmrope_core.UnknownOptionError`.
        ``convention=None`` is the default (transformers'), as everywhere else it is taken.
        """
        plugins = plugin_manager or get_plugin_manager()
        if "convention" in options and options["convention"] is None:  # plugins never see None
            options = {key: value for key, value in options.items() if key != "convention"}
        if processor is None:
            read = EngineOptions(options)
            read_mask_options(read, "a text-only model")
            read.refuse_unread("a text-only engine (processor=None)")
            return cls(None, config, _TEXT_ONLY, plugins=plugins, options=options)
        plugin, binding = bind(plugins, processor, config, EngineOptions(options))
        policy = STRICT
        for info, result in plugins.results("validate_inputs_policy", processor=processor):
            expect(isinstance(result, ValidationPolicy), info, "validate_inputs_policy", "a ValidationPolicy", result)
            policy = result
        keys: set[str] = set()
        for info, result in plugins.results("varlen_keys", processor=processor):
            expect(isinstance(result, Iterable) and not isinstance(result, (str, bytes)),
                    info, "varlen_keys", "an iterable of key names", result)
            keys.update(result)
        layout = COMMON
        for info, result in plugins.results("batch_layout", processor=processor, config=config):
            expect(isinstance(result, BatchLayout), info, "batch_layout", "a BatchLayout", result)
            layout = result
        return cls(processor, config, binding, plugin=plugin, policy=policy, varlen_keys=frozenset(keys),
                   plugins=plugins, options=options, layout=layout)

    @classmethod
    def from_pretrained(cls, name_or_path: str | os.PathLike[str], *, revision: str | None = None,
                        cache_dir: str | os.PathLike[str] | None = None, token: str | bool | None = None,
                        local_files_only: bool | None = None, plugin_manager: PluginManager | None = None,
                        **options: Any) -> RopeEngine:
        """Load processor and config (``AutoProcessor`` + ``AutoConfig``) from a checkpoint
        directory or a hub id such as ``"Qwen/Qwen2.5-VL-7B-Instruct"``, as transformers does:
        the processor's and config's files only, never the weights, from the local Hugging Face
        cache under ``HF_HUB_OFFLINE=1``. ``revision``, ``cache_dir``, ``token`` and
        ``local_files_only`` are transformers' own; ``options`` as in :meth:`from_processor`.
        Raises :class:`~mmrope_core.PretrainedLoadError` naming the path or id and what to do."""
        from .pretrained import load_pretrained

        processor, config = load_pretrained(name_or_path, revision=revision, cache_dir=cache_dir, token=token,
                                            local_files_only=local_files_only)
        return cls.from_processor(processor, config, plugin_manager=plugin_manager, **options)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.processor, self.config, dict(self._options)))

    # -- what trainers read ------------------------------------------------------------------

    @property
    def rope_kind(self) -> str:
        """``"mrope"`` or ``"1d"``."""
        return self.binding.kind

    @property
    def plugin_name(self) -> str | None:
        """The entry-point name of the plugin that bound the processor (None for text-only)."""
        return None if self.plugin is None else self.plugin.name

    @property
    def implementation(self) -> str:
        return self.binding.implementation

    @property
    def samples_independent(self) -> bool:
        """Whether a sample gets its positions alone wherever it stands in a batch (:mod:`.independence`)."""
        return samples_independent(self)

    @property
    def position_dtype(self) -> torch.dtype:
        """The dtype of :meth:`compute_position_ids`."""
        return torch.int64 if self.binding.kernel is None else self.binding.kernel.position_dtype

    @property
    def convention(self) -> str:
        """The position convention computed: the release the ``convention`` option names, its
        alias resolved (``"transformers"``, ``"vllm-0.34"``, ``"sglang-0.5.23"``)."""
        return asked(self._options)

    def with_convention(self, convention: str) -> RopeEngine:
        """An engine of this processor, config, plugins and options that computes ``convention``
        (this engine where it does already). Raises :class:`~mmrope_core.UnknownConventionError`
        where the family does not offer it."""
        if isinstance(convention, str) and ALIASES.get(convention, convention) == self.convention:
            return self
        options = {**self._options, "convention": convention}
        return RopeEngine.from_processor(self.processor, self.config, plugin_manager=self._plugins, **options)

    def __repr__(self) -> str:
        processor = type(self.processor).__name__ if self.processor is not None else None
        return (f"RopeEngine(processor={processor}, plugin={self.plugin_name}, kind={self.rope_kind}, "
                f"implementation={self.implementation}: {self.binding.description or '-'})")

    # -- positions ---------------------------------------------------------------------------

    @checked_keywords
    def compute_position_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        multi_modal_inputs: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        generated_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Positions in the layout trainers feed the model.

        Args:
            input_ids: ``(L,)`` or ``(B, L)`` token ids.
            attention_mask: same shape, 0/1 or bool; None means every token is valid.
            multi_modal_inputs: the processor's outputs for these samples (grids, masks, ...).
            mm_processor_kwargs: the keyword arguments the processor was called with.
            cu_seqlens: for one packed ``(1, T)`` row, ``(K + 1,)`` segment boundaries from 0 to T.
            segment_ids: for packed rows, ``(B, L)``: 0 for padding, 1..K for each row's segments.
            generated_mask: for RL, ``(B, L)`` like ``input_ids``: 1 where the rollout engine
                generated the token, 0 for the prompt and for tokens the environment or a tool
                inserted (and for padding). Each run of 1s is one request's decode, after a
                prompt of everything before it. Conventions whose decoded positions differ from
                a prefill of the whole sequence (SGLang's Qwen3-Omni) use it; the others give
                the same positions with or without it.

        Returns:
            For M-RoPE, ``(B, 4, L)``: row 0 counts valid tokens 0..n-1 (1 at padding), rows 1..3
            are the family's ``(t, h, w)`` positions (padding holds what the family's reference
            puts there). The model takes its transpose, ``(4, B, L)``. A kernel with more rows
            (:attr:`~mmrope_core.kernel.RopeKernel.rope_rows`) gives ``(B, rope_rows + 1, L)``. For 1-D RoPE, ``(B, L)``
            ``clip(cumsum(mask) - 1, 0)``. The dtype is :attr:`position_dtype`. Packed rows restart
            at 0 in every segment and hold 0 (row 0: 1) outside segments.
        """
        require_mappings(multi_modal_inputs, mm_processor_kwargs)
        mrope = self.binding.kind == "mrope"
        ids, mask, layout = read_batch(input_ids, attention_mask, cu_seqlens, segment_ids, mrope=mrope)
        generated = None if generated_mask is None else read_generated_mask(generated_mask, ids, mask, layout)
        if not mrope:
            return one_d_positions(ids, mask) if layout is None else layout.offsets()
        return self._positions(ids, mask, layout, self.rope_index_kwargs(multi_modal_inputs, mm_processor_kwargs),
                               four_rows=True, generated=generated)

    def get_rope_index(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        generated_mask: torch.Tensor | None = None,
        **inputs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop-in for the model's ``get_rope_index``: ``(3, B, L)`` positions (``(rope_rows, B, L)``
        for a kernel with more rows) and ``(B, 1)`` deltas.

        Keyword arguments are those of the family's reference (``image_grid_thw``, ...); a
        caller's ``mm_token_type_ids`` is ignored: the kernel builds its own from ``input_ids``.
        With ``cu_seqlens`` or ``segment_ids`` (see :meth:`compute_position_ids`) the deltas are
        per segment, ``(K, 1)``. ``generated_mask`` as in :meth:`compute_position_ids`; a sample
        ending in generated tokens then has the delta its last decoded token was placed with.
        """
        if self.binding.kind == "1d":
            raise RopeIndexUnavailableError(
                f"{type(self.processor).__name__ if self.processor is not None else 'a text-only model'} "
                f"uses 1-D RoPE{f' (plugin {self.plugin_name})' if self.plugin_name else ''}: there is no get_rope_index. "
                f"Use engine.compute_position_ids, which returns (B, L) positions"
            )
        inputs.pop("mm_token_type_ids", None)
        refuse_misspelt_keywords("get_rope_index", inputs, _OWN_KEYWORDS,
                                 getattr(self.binding.kernel, "input_keys", ()), MODEL_INPUTS)
        ids, mask, layout = read_batch(input_ids, attention_mask, cu_seqlens, segment_ids, mrope=True)
        generated = None if generated_mask is None else read_generated_mask(generated_mask, ids, mask, layout)
        return self._positions(ids, mask, layout, inputs, four_rows=False, generated=generated)

    @checked_keywords
    def rope_index_kwargs(
        self, multi_modal_inputs: Mapping[str, Any] | None, mm_processor_kwargs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The keyword arguments the plugins derive from one batch's inputs, merged."""
        require_mappings(multi_modal_inputs, mm_processor_kwargs)
        if multi_modal_inputs is not None:
            multi_modal_inputs = read_media(multi_modal_inputs, self.batch_layout.media)
        if mm_processor_kwargs is not None:
            require_string_keys("mm_processor_kwargs", mm_processor_kwargs)
        merged: dict[str, Any] = {}
        givers: dict[str, PluginInfo] = {}
        inputs, processor_kwargs = ReadOnlyInputs(multi_modal_inputs), ReadOnlyInputs(mm_processor_kwargs)
        for info, result in self._plugins.results(
            "get_rope_index_kwargs",
            processor=self.processor,
            multi_modal_inputs=inputs,
            mm_processor_kwargs=processor_kwargs,
        ):
            expect(isinstance(result, Mapping), info, "get_rope_index_kwargs", "a dict", result)
            for key, value in result.items():
                if key in merged and not _same(merged[key], value):
                    raise PluginConflictError(
                        f"plugins {givers[key].label} and {info.label} give different values for rope "
                        f"argument {key!r}; disable one of them with MMROPE_DISABLE_PLUGINS"
                    )
                merged[key] = value
                givers.setdefault(key, info)
        reader = f"plugin {self._label()}"
        inputs.refuse_misspelt_keys("multi_modal_inputs", reader)
        processor_kwargs.refuse_misspelt_keys("mm_processor_kwargs", reader)
        return merged

    def _positions(self, ids: torch.Tensor, mask: torch.Tensor | None, layout: PackedLayout | None,
                   inputs: dict[str, Any], *, four_rows: bool, generated: torch.Tensor | None = None) -> Any:
        """Where the layout is decided: the batch as it is; packed rows joined into one row for a
        kernel that places them, or else unpacked into a batch of segments; then laid back out
        as the caller's batch. ``generated`` reaches only a kernel that reads it, laid out as the ids."""
        inputs = read_media(inputs, self.batch_layout.media, tokens=ids.numel())
        kernel = self.binding.kernel
        if generated is not None and not kernel.reads_generated_mask:  # type: ignore[union-attr]
            generated = None
        if layout is None:
            if generated is not None:
                inputs["generated_mask"] = generated
            return self._kernel(ids, mask, inputs, four_rows)
        if not self.samples_independent:
            raise PackingUnsupportedError(
                f"{self._label()}'s kernel may number media across the batch (nothing shows otherwise): a packed "
                f"segment cannot be computed as its sample alone; pad the batch, where each sample is computed alone")
        with _segments_as_samples():
            if kernel.places_packed_rows:  # type: ignore[union-attr]
                if generated is not None:
                    inputs["generated_mask"] = layout.joined(generated)
                return self._joined(ids, layout, inputs, four_rows)
            segments = layout.unpack(ids)
            if generated is not None:
                inputs["generated_mask"] = layout.unpack(generated)
            result = self._kernel(segments, None if layout.uniform else layout.unpacked_mask(), inputs, four_rows)
        if four_rows:
            out = result.new_empty(layout.shape[0], result.shape[1], layout.shape[1])
            layout.pack(result.transpose(0, 1), _outside_segments(result.shape[1]), out=out.transpose(0, 1))
            return out
        positions, deltas = result
        return layout.pack(positions), deltas

    def _joined(self, ids: torch.Tensor, layout: PackedLayout, inputs: dict[str, Any], four_rows: bool) -> Any:
        """The packed rows' segments' tokens as one row, computed by the kernel in one call."""
        bounds = torch.from_numpy(layout.joined_bounds())
        try:
            result = self._kernel(layout.joined(ids), None, inputs, four_rows, cu_seqlens=bounds)
        except SegmentCutError as cut:  # say where the segment starts in the caller's batch
            row, column = divmod(int(layout.starts[cut.segments[0]]), layout.shape[1])
            raise SegmentCutError(cut.segments, f"row {row}, token {column}") from None
        if four_rows:
            rows = result.shape[1]
            if layout.gaps is None:  # the joined row is the batch: each row's four rows follow one another again
                return result.reshape(rows, *layout.shape).transpose(0, 1).contiguous()
            out = result.new_empty(layout.shape[0], rows, layout.shape[1])
            layout.spread(result.reshape(rows, -1), _outside_segments(rows), out=out.transpose(0, 1))
            return out
        positions, deltas = result
        return layout.spread(positions.reshape(positions.shape[0], -1)), deltas

    def _kernel(self, ids: torch.Tensor, mask: torch.Tensor | None, inputs: dict[str, Any], four_rows: bool,
                cu_seqlens: torch.Tensor | None = None) -> Any:
        """The bound kernel's positions, through the plugin guard, checked against the contract."""
        kernel = self.binding.kernel
        name = "position_ids" if four_rows else "rope_index"
        method = kernel.position_ids if four_rows else kernel.rope_index  # type: ignore[union-attr]
        arguments = inputs if cu_seqlens is None else {**inputs, "cu_seqlens": cu_seqlens}
        result = _guard.call(method, (ids, mask), arguments, plugin=self._label, what=f"the kernel's {name}",
                             advice=_KERNEL_ADVICE)
        rows = ids.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        axes = getattr(kernel, "rope_rows", 3)
        if four_rows:
            expected = f"a {self.position_dtype} tensor of shape {(ids.shape[0], axes + 1, ids.shape[1])} on {ids.device}"
            ok = (isinstance(result, torch.Tensor) and result.shape == (ids.shape[0], axes + 1, ids.shape[1])
                  and result.dtype == self.position_dtype and result.device == ids.device)
        else:
            expected = (f"positions of shape {(axes, *ids.shape)} and deltas of shape {(rows, 1)}, integer, float32 "
                        f"or float64 tensors on {ids.device}")
            ok = (isinstance(result, tuple) and len(result) == 2 and all(_exact(t, ids.device) for t in result)
                  and result[0].shape == (axes, *ids.shape) and result[1].shape == (rows, 1))
        if not ok:
            raise PluginContractError(f"the kernel's {name} of plugin {self._label()} returned {_shapes(result)}; "
                                      f"expected {expected}")
        return result

    def _label(self) -> str:
        return self.plugin.label if self.plugin is not None else "(none)"

    # -- batching and processing -------------------------------------------------------------

    @checked_keywords
    def collate(self, samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """Batch per-sample multimodal inputs; :attr:`varlen_keys` are zero-padded to the largest sample,
        the keys of :attr:`batch_layout` batched as the family's processor batches them."""
        return processor_outputs.collate(samples, self.varlen_keys, media=self.batch_layout.media)

    @checked_keywords
    def batch(self, outputs: Iterable[Mapping[str, Any]], padding_side: str = "right") -> tuple[Any, Any, dict[str, Any]]:
        """Batch per-sample processor outputs (any iterable; ids and masks ``(1, L)`` or ``(L,)``):
        ``(input_ids, attention_mask, multi_modal_inputs)``."""
        tokenizer = getattr(self.processor, "tokenizer", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        return processor_outputs.batch_processor_outputs(outputs, self.varlen_keys, pad_token_id=pad or 0,
                                                         padding_side=padding_side, media=self.batch_layout.media)

    def process(self, **processor_kwargs: Any) -> Any:
        """Call the processor under the plugins' validation policy.

        A relaxed policy is applied to a private shallow copy of the processor: the user's
        processor object is never changed.
        """
        if self.processor is None:
            raise InvalidInputError("this engine has no processor (text-only); tokenize with your tokenizer")
        return self._processing_processor(**processor_kwargs)

    @functools.cached_property
    def _processing_processor(self) -> Any:
        policy = self.validation_policy
        if policy.strict:
            return self.processor
        relaxed = copy.copy(self.processor)
        if policy.validate is None:
            relaxed.validate_inputs = _skip_validation
        else:
            relaxed.validate_inputs = functools.partial(policy.validate, relaxed)
        return relaxed


@contextlib.contextmanager
def _segments_as_samples() -> Iterator[None]:
    """Input errors raised inside speak of samples: say that sample k is segment k."""
    try:
        yield
    except SegmentCutError:  # speaks of segments already
        raise
    except InvalidInputError as exc:
        raise type(exc)(f"in the packed input, sample k below is segment k (counted row by row): {exc}") from exc


def _outside_segments(rows: int) -> tuple[int, ...]:
    """What tokens outside every segment hold in each of ``rows`` rows of the model's layout."""
    return (_OUTSIDE_TEXT_ROW,) + (0,) * (rows - 1)


def _skip_validation(*args: Any, **kwargs: Any) -> None:
    return None


def _rebuild(processor: Any, config: Any, options: dict[str, Any]) -> RopeEngine:
    return RopeEngine.from_processor(processor, config, **options)


def _exact(value: Any, device: torch.device) -> bool:
    """A tensor that holds positions exactly: integers, or float32/float64 (half precision rounds
    positions beyond 2048)."""
    return (isinstance(value, torch.Tensor) and value.device == device
            and (value.dtype in (torch.float32, torch.float64)
                 or not (value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool)))


def _shapes(result: Any) -> str:
    if isinstance(result, torch.Tensor):
        return f"a {result.dtype} tensor of shape {tuple(result.shape)}"
    if isinstance(result, tuple):
        return "(" + ", ".join(_shapes(item) for item in result) + ")"
    return type(result).__name__


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
    try:
        return bool(a == b)
    except Exception:
        return a is b
