"""What the trainer calls: positions for a batch, from the binding a plugin made."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .collate import batch_processor_outputs
from .collate import collate as _collate
from .errors import (
    InvalidInputError,
    MmropeError,
    PluginConflictError,
    PluginContractError,
    PluginHookError,
    RopeIndexUnavailableError,
    UnsupportedProcessorError,
)
from .inputs import ReadOnlyInputs, as_batch
from .manager import PluginManager, get_plugin_manager
from .mrope._mismatch import segment_cut
from .mrope._runs import values_at
from .options import EngineOptions
from .packing import PackedLayout
from .positions import one_d_positions, text_positions
from .types import STRICT, RopeBinding, ValidationPolicy

_TEXT_ONLY = RopeBinding(kind="1d", implementation="mask", description="no processor: 1-D positions")
_NO_OPTIONS: Mapping[str, Any] = types.MappingProxyType({})
_NO_INPUTS = ReadOnlyInputs(None)  # empty, so it never holds a copy of anything


class RopeEngine:
    """Computes position ids for one processor (one model family).

    Build it once with :meth:`from_processor` or :meth:`from_pretrained`; every plugin hook that
    does not depend on the batch is resolved then. The engine is thread-safe and pickles (a
    worker rebuilds it from the processor and config with its own installed plugins).
    """

    def __init__(
        self,
        processor: Any,
        config: Any,
        binding: RopeBinding,
        policy: ValidationPolicy,
        varlen_keys: frozenset[str],
        plugins: PluginManager,
        options: Mapping[str, Any],
    ) -> None:
        self.processor = processor
        self.config = config
        self.binding = binding
        self.validation_policy = policy
        self.varlen_keys = varlen_keys
        self._plugins = plugins
        self._options = options

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def from_processor(
        cls, processor: Any, config: Any = None, *, plugin_manager: PluginManager | None = None, **options: Any
    ) -> RopeEngine:
        """Ask the installed plugins how to compute positions for ``processor``.

        ``processor=None`` (a text-only model) gives 1-D positions. ``options`` are passed to the
        plugins' ``bind_rope_index`` (e.g. ``impl="reference"``).
        """
        plugins = plugin_manager or get_plugin_manager()
        frozen = types.MappingProxyType(dict(options)) if options else _NO_OPTIONS
        if processor is None:
            EngineOptions(options).refuse_unread("a text-only engine (processor=None)")
            return cls(None, config, _TEXT_ONLY, STRICT, frozenset(), plugins, frozen)
        binding = _bind(plugins, processor, config, EngineOptions(options))
        policy = STRICT
        for info, result in plugins.call_each("validate_inputs_policy", processor=processor):
            _expect(isinstance(result, ValidationPolicy), info, "validate_inputs_policy", "a ValidationPolicy", result)
            policy = result
            break
        keys: set[str] = set()
        for info, result in plugins.call_each("varlen_keys", processor=processor):
            _expect(
                isinstance(result, Iterable) and not isinstance(result, (str, bytes)),
                info, "varlen_keys", "an iterable of key names", result,
            )
            keys.update(result)
        return cls(processor, config, binding, policy, frozenset(keys), plugins, frozen)

    @classmethod
    def from_pretrained(cls, path: str, *, plugin_manager: PluginManager | None = None, **options: Any) -> RopeEngine:
        """Load processor and config from a local directory (``AutoProcessor`` + ``AutoConfig``)."""
        from transformers import AutoConfig, AutoProcessor

        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        config = AutoConfig.from_pretrained(path, local_files_only=True)
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
        return self.binding.plugin or None

    @property
    def implementation(self) -> str:
        return self.binding.implementation

    def __repr__(self) -> str:
        processor = type(self.processor).__name__ if self.processor is not None else None
        return (
            f"RopeEngine(processor={processor}, plugin={self.plugin_name}, kind={self.rope_kind}, "
            f"implementation={self.implementation})"
        )

    # -- positions ---------------------------------------------------------------------------

    def compute_position_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        multi_modal_inputs: Mapping[str, Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Positions in the layout trainers feed the model.

        Args:
            input_ids: ``(L,)`` or ``(B, L)`` token ids.
            attention_mask: same shape, 0/1 or bool; None means every token is valid.
            multi_modal_inputs: the processor's outputs for these samples (grids, masks, ...).
            mm_processor_kwargs: the keyword arguments the processor was called with.
            cu_seqlens: for one packed ``(1, T)`` row, ``(K + 1,)`` segment boundaries from 0 to T.
            segment_ids: for packed rows, ``(B, L)``: 0 for padding, 1..K for each row's segments.

        Returns:
            For M-RoPE, ``(B, 4, L)``: row 0 counts valid tokens 0..n-1 (1 at padding), rows 1..3
            are the family's ``(t, h, w)`` positions (padding holds what the family's reference
            puts there). For 1-D RoPE, ``(B, L)`` ``clip(cumsum(mask) - 1, 0)``. The dtype is
            ``binding.position_dtype`` (int64 unless the family documents otherwise). Packed rows
            restart at 0 in every segment and hold 0 (row 0: 1) outside segments.
        """
        packed = cu_seqlens is not None or segment_ids is not None
        ids, mask = as_batch(input_ids, attention_mask, tokens_in_every_row=self.binding.kind == "mrope" and not packed)
        layout = _packed_layout(ids, mask, cu_seqlens, segment_ids)
        if self.binding.kind == "1d":
            return one_d_positions(ids, mask) if layout is None else layout.offsets()
        kwargs = self.rope_index_kwargs(multi_modal_inputs, mm_processor_kwargs)
        if layout is None and self.binding.position_ids is not None:
            return self._position_ids(ids, mask, kwargs)
        if layout is not None and self.binding.packed_position_ids is not None:
            placed = self._packed_position_ids(ids, layout, kwargs)
            if placed is not None:
                return placed
        if layout is None:
            positions, _ = self._rope_index(ids, mask, kwargs)
        elif self.binding.packed_position_ids is not None:  # its packed row cannot be placed: nor can packed_rope_index's
            positions, _ = self._unpacked_rope_index(ids, layout, kwargs)
        else:
            positions, _ = self._packed_rope_index(ids, layout, kwargs)
        out = torch.empty(ids.shape[0], 4, ids.shape[1], dtype=self.binding.position_dtype, device=ids.device)
        if layout is None:
            text_positions(mask, out=out[:, 0])
        else:
            out[:, 0] = layout.offsets(outside=1)  # tokens outside every segment hold 1 in the text row
        out[:, 1:] = positions.transpose(0, 1)
        return out

    def get_rope_index(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        cu_seqlens: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop-in for the model's ``get_rope_index``: ``(3, B, L)`` positions and ``(B, 1)`` deltas.

        Keyword arguments are those of the family's reference (``image_grid_thw``, ...);
        ``mm_token_type_ids`` is rebuilt from ``input_ids``. With ``cu_seqlens`` or
        ``segment_ids`` (see :meth:`compute_position_ids`) the deltas are per segment, ``(K, 1)``.
        """
        if self.binding.kind == "1d":
            raise RopeIndexUnavailableError(
                f"{type(self.processor).__name__ if self.processor is not None else 'a text-only model'} "
                f"uses 1-D RoPE (plugin {self.plugin_name}): there is no get_rope_index. "
                f"Use engine.compute_position_ids, which returns (B, L) positions"
            )
        packed = cu_seqlens is not None or segment_ids is not None
        ids, mask = as_batch(input_ids, attention_mask, tokens_in_every_row=not packed)
        kwargs.pop("mm_token_type_ids", None)
        layout = _packed_layout(ids, mask, cu_seqlens, segment_ids)
        if layout is not None:
            return self._packed_rope_index(ids, layout, kwargs)
        return self._rope_index(ids, mask, kwargs)

    def _packed_rope_index(
        self, ids: torch.Tensor, layout: PackedLayout, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each segment computed as the sample it was, in one call: on the segments unpacked into a
        batch, or, for segments of different lengths, on their tokens as one packed row when the
        binding places packed rows (unpacking would pad every segment to the longest). Segments of
        one length unpack by reshaping, into a batch whose many rows the kernel's passes share out
        better among threads than one long row."""
        if self.binding.packed_rope_index is not None and not layout.uniform:
            placed = self._in_place(self.binding.packed_rope_index, "packed rope index", ids, layout, kwargs)
            if placed is not None:
                positions, deltas = placed
                self._check_packed_result(positions, deltas, (3, 1, layout.size), (layout.segments, 1))
                return layout.place(positions.reshape(3, -1)), deltas
        return self._unpacked_rope_index(ids, layout, kwargs)

    def _unpacked_rope_index(
        self, ids: torch.Tensor, layout: PackedLayout, kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The segments unpacked into a batch, the binding's ``rope_index`` on it, packed back."""
        segments = layout.unpack(ids)
        token_types, _ = self._segment_token_types(segments, layout, np.arange(layout.segments) * segments.shape[1])
        mask = None if layout.uniform else layout.unpacked_mask()  # segments of one length fill every slot
        with _segments_as_samples():
            positions, deltas = self._rope_index(segments, mask, kwargs, token_types)
        return layout.pack(positions), deltas

    def _packed_position_ids(self, ids: torch.Tensor, layout: PackedLayout, kwargs: dict[str, Any]) -> torch.Tensor | None:
        """``compute_position_ids`` of packed rows from their segments' tokens placed as one row, or
        None where that row cannot be placed (see :meth:`_in_place`)."""
        positions = self._in_place(self.binding.packed_position_ids, "packed position ids", ids, layout, kwargs)
        if positions is None:
            return None
        self._check_position_ids("packed_position_ids", positions, (1, 4, layout.size))
        if layout.gaps is None:  # the rows were placed as one: each row's four rows follow one another again
            return positions.reshape(4, *layout.shape).transpose(0, 1).contiguous()
        out = positions.new_empty(layout.shape[0], 4, layout.shape[1])
        layout.place(positions.reshape(4, -1), (1, 0, 0, 0), out=out.transpose(0, 1))  # outside segments, 1 in the text row
        return out

    def _in_place(self, function: Any, name: str, ids: torch.Tensor, layout: PackedLayout, kwargs: dict[str, Any]) -> Any:
        """``function`` called on the segments' tokens as one ``(1, N)`` row, with its ``cu_seqlens``.
        None, without calling it, when two segments that do not follow each other in the batch
        (across padding, or a row's end) end and begin with placeholders of one kind: in one row
        those would read as one run. The unpacked batch keeps them apart."""
        row, bounds = layout.packed_row(ids), layout.packed_row_bounds()
        cu_seqlens = torch.from_numpy(bounds)
        token_types, joined = self._segment_token_types(row, layout, bounds[:-1], cu_seqlens)
        if joined:
            return None
        kwargs["cu_seqlens"] = cu_seqlens
        with _segments_as_samples():
            return self._call_plugin(function, name, row, None, kwargs, token_types)

    def _segment_token_types(self, segments: torch.Tensor, layout: PackedLayout, firsts: np.ndarray,
                             cu_seqlens: torch.Tensor | None = None) -> tuple[Any, bool]:
        """The binding's token types for ``segments`` (an unpacked batch, or with ``cu_seqlens`` one
        packed row), after checking no segment starts inside a placeholder run; ``firsts``: the flat
        index of each segment's first token in them. Also whether segments apart in the batch end
        and begin with placeholders of one kind."""
        if self.binding.token_types is None:
            return None, False
        if cu_seqlens is not None and self.binding.packed_token_types is not None:
            token_types = self._token_types(self.binding.packed_token_types, "packed_token_types", segments, cu_seqlens)
        else:
            token_types = self._token_types(self.binding.token_types, "token_types", segments)
        return token_types, _check_segment_boundaries(layout, token_types.reshape(-1), firsts)

    def _token_types(self, function: Any, name: str, ids: torch.Tensor, *args: Any) -> torch.Tensor:
        """The binding's token types for ``ids``, one per token, or an error naming the plugin."""
        try:
            token_types = function(ids, *args)
        except MmropeError:
            raise
        except Exception as exc:
            raise self._plugin_raised(name, exc) from exc
        if not isinstance(token_types, torch.Tensor) or token_types.shape != ids.shape:
            found = f"shape {tuple(token_types.shape)}" if isinstance(token_types, torch.Tensor) else type(token_types).__name__
            raise PluginContractError(
                f"the {name} of plugin {self._plugin_label()} returned {found} for input_ids of shape "
                f"{tuple(ids.shape)}; expected one token type per token"
            )
        return token_types

    def rope_index_kwargs(
        self, multi_modal_inputs: Mapping[str, Any] | None, mm_processor_kwargs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The keyword arguments the plugins derive from one batch's inputs, merged."""
        inputs = ReadOnlyInputs(multi_modal_inputs)
        processor_kwargs = _NO_INPUTS if mm_processor_kwargs is None else ReadOnlyInputs(mm_processor_kwargs)
        merged: dict[str, Any] = {}
        givers: dict[str, Any] = {}
        for info, result in self._plugins.call_each(
            "get_rope_index_kwargs",
            processor=self.processor,
            multi_modal_inputs=inputs,
            mm_processor_kwargs=processor_kwargs,
        ):
            _expect(isinstance(result, Mapping), info, "get_rope_index_kwargs", "a dict", result)
            for key, value in result.items():
                if key in merged and not _same(merged[key], value):
                    raise PluginConflictError(
                        f"plugins {givers[key].label} and {info.label} give different values for rope "
                        f"argument {key!r}; disable one of them with MMROPE_DISABLE_PLUGINS"
                    )
                merged[key] = value
                givers.setdefault(key, info)
        return merged

    def _rope_index(
        self, ids: torch.Tensor, mask: torch.Tensor | None, kwargs: dict[str, Any], token_types: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``token_types``: ``binding.token_types(ids)`` when the caller has already built them.
        Every row of ``mask`` holds a token (checked by :func:`as_batch`, or a packed layout's)."""
        return self._call_plugin(self.binding.rope_index, "rope index", ids, mask, kwargs, token_types)

    def _position_ids(self, ids: torch.Tensor, mask: torch.Tensor | None, kwargs: dict[str, Any]) -> torch.Tensor:
        positions = self._call_plugin(self.binding.position_ids, "position_ids", ids, mask, kwargs)
        self._check_position_ids("position_ids", positions, (ids.shape[0], 4, ids.shape[1]))
        return positions

    def _check_position_ids(self, name: str, positions: Any, expected: tuple[int, ...]) -> None:
        if not isinstance(positions, torch.Tensor) or positions.shape != expected or positions.dtype != self.binding.position_dtype:
            found = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise PluginContractError(
                f"the {name} of plugin {self._plugin_label()} returned {found}; expected a "
                f"{self.binding.position_dtype} tensor of shape {expected}"
            )

    def _check_packed_result(self, positions: Any, deltas: Any, shape: tuple[int, ...], deltas_shape: tuple[int, int]) -> None:
        if not (isinstance(positions, torch.Tensor) and positions.shape == shape
                and isinstance(deltas, torch.Tensor) and deltas.shape == deltas_shape):
            found = " and ".join(f"{name} {tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__}"
                                 for name, value in (("positions", positions), ("deltas", deltas)))
            raise PluginContractError(
                f"the packed_rope_index of plugin {self._plugin_label()} returned {found}; expected positions of "
                f"shape {shape} and deltas of shape {deltas_shape}"
            )

    def _call_plugin(
        self, function: Any, name: str, ids: torch.Tensor, mask: torch.Tensor | None, kwargs: dict[str, Any],
        token_types: Any = None,
    ) -> Any:
        if self.binding.token_types is not None:
            kwargs["mm_token_type_ids"] = (token_types if token_types is not None
                                           else self._token_types(self.binding.token_types, "token_types", ids))
        try:
            return function(ids, attention_mask=mask, **kwargs)
        except MmropeError:
            raise
        except Exception as exc:
            raise self._plugin_raised(name, exc) from exc

    def _plugin_raised(self, name: str, exc: Exception) -> PluginHookError:
        return PluginHookError(
            f"the {name} of plugin {self._plugin_label()} ({self.implementation}) raised {type(exc).__name__}: "
            f"{exc}. Check the inputs against the processor's output, or try impl='reference'"
        )

    def _plugin_label(self) -> str:
        try:
            return self._plugins.info(self.binding.plugin).label
        except KeyError:
            return self.binding.plugin

    # -- batching and processing -------------------------------------------------------------

    def collate(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Batch per-sample multimodal inputs; :attr:`varlen_keys` are zero-padded to the largest sample."""
        return _collate(samples, self.varlen_keys)

    def batch(self, outputs: Sequence[Mapping[str, Any]], padding_side: str = "right") -> tuple[Any, Any, dict[str, Any]]:
        """Batch per-sample processor outputs: ``(input_ids, attention_mask, multi_modal_inputs)``."""
        tokenizer = getattr(self.processor, "tokenizer", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        return batch_processor_outputs(outputs, self.varlen_keys, pad_token_id=pad or 0, padding_side=padding_side)

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


def _packed_layout(ids: torch.Tensor, mask: torch.Tensor | None, cu_seqlens: Any, segment_ids: Any) -> PackedLayout | None:
    if cu_seqlens is None and segment_ids is None:
        return None
    if cu_seqlens is not None and segment_ids is not None:
        raise InvalidInputError("pass either cu_seqlens or segment_ids, not both")
    if cu_seqlens is not None:
        if mask is not None and not bool(mask.all()):
            raise InvalidInputError("with cu_seqlens every token belongs to a segment: attention_mask must be all 1 "
                                    "or None; mark padding with segment_ids instead")
        return PackedLayout.from_cu_seqlens(cu_seqlens, tuple(ids.shape), ids.device)
    layout = PackedLayout.from_segment_ids(segment_ids, tuple(ids.shape))
    if mask is not None and not torch.equal(mask, layout.valid()):
        raise InvalidInputError("attention_mask disagrees with segment_ids: a token is valid exactly when its "
                                "segment id is not 0; keep the mask 0/1 and the segments in segment_ids")
    return layout


@contextlib.contextmanager
def _segments_as_samples() -> Iterator[None]:
    """Errors raised inside speak of samples: say that sample k is segment k."""
    try:
        yield
    except MmropeError as exc:
        raise type(exc)(f"in the packed input, sample k below is segment k (counted row by row): {exc}") from exc


def _check_segment_boundaries(layout: PackedLayout, token_types: torch.Tensor, firsts: np.ndarray) -> bool:
    """A segment must not start inside a placeholder run the previous segment began, right before
    it in the same row. ``token_types`` are flat, ``firsts`` the flat index of each segment's
    first token in them. Returns whether segments that do not follow each other so (padding or a
    row's end between them) end and begin with placeholders of one kind."""
    previous_last = firsts[:-1] + (layout.lengths[:-1] - 1)
    types = values_at(token_types, np.concatenate((firsts[1:], previous_last)))
    first, last = types[: firsts.size - 1], types[firsts.size - 1 :]
    meet = ((first == last) & (last != 0)).nonzero()[0]  # boundaries k | k + 1 where runs of one kind meet
    if not meet.size:  # (placeholder runs inside markers never meet)
        return False
    starts = layout.starts[meet + 1]
    cut = meet[(starts == layout.starts[meet] + layout.lengths[meet]) & (starts % layout.shape[1] != 0)]
    if cut.size:
        k = int(cut[0])
        row, column = divmod(int(layout.starts[k + 1]), layout.shape[1])
        raise segment_cut(k + 1, f"row {row}, token {column}")
    return True


def _skip_validation(*args: Any, **kwargs: Any) -> None:
    return None


def _rebuild(processor: Any, config: Any, options: dict[str, Any]) -> RopeEngine:
    return RopeEngine.from_processor(processor, config, **options)


def _bind(plugins: PluginManager, processor: Any, config: Any, options: EngineOptions) -> RopeBinding:
    for info, result in plugins.call_each("bind_rope_index", processor=processor, config=config, options=options):
        _expect(isinstance(result, RopeBinding), info, "bind_rope_index", "a RopeBinding", result)
        options.refuse_unread(f"plugin {info.label}, which binds {type(processor).__name__}")
        return result if result.plugin else _with_plugin(result, info.name)
    raise UnsupportedProcessorError(_unsupported_message(plugins, processor))


def _with_plugin(binding: RopeBinding, name: str) -> RopeBinding:
    return dataclasses.replace(binding, plugin=name)


def _unsupported_message(plugins: PluginManager, processor: Any) -> str:
    infos = plugins.plugins()
    by_status = {status: [info for info in infos if info.status == status] for status in ("active", "failed", "disabled")}
    lines = [f"no installed mmrope plugin handles {type(processor).__name__}."]
    lines.append("  Installed: " + (", ".join(info.label for info in by_status["active"]) or "none") + ".")
    if by_status["failed"]:
        lines.append("  Failed to load: " + "; ".join(f"{info.label}: {info.reason}" for info in by_status["failed"]) + ".")
    if by_status["disabled"]:
        lines.append("  Disabled: " + ", ".join(f"{info.label} ({info.reason})" for info in by_status["disabled"]) + ".")
    claimed = [info for info in by_status["active"] if type(processor).__name__ in info.processors]
    if claimed:
        lines.append(
            "  " + ", ".join(info.label for info in claimed) + " lists this class but did not bind it; "
            "check the options passed to RopeEngine.from_processor."
        )
    else:
        lines.append(
            "  Install or repair the plugin for this family (`mmrope plugins` lists what is installed), "
            "or write one: see docs/plugin-authoring.md."
        )
    return "\n".join(lines)


def _expect(ok: bool, info: Any, hook: str, what: str, result: Any) -> None:
    if not ok:
        raise PluginContractError(f"plugin {info.label} returned {type(result).__name__} from {hook}; expected {what}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool((a == b).all())
    try:
        return bool(a == b)
    except Exception:
        return a is b
