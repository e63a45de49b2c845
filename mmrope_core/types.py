"""What hooks return. Each type checks itself when built, so a plugin's mistake is caught
where it is made and reported with the plugin's name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Literal

RopeKind = Literal["mrope", "1d"]

#: ``rope_index(input_ids, attention_mask=None, **kwargs) -> (positions (3, B, L), deltas (B, 1))``
RopeIndexFn = Callable[..., tuple[Any, Any]]

#: ``position_ids(input_ids, attention_mask=None, **kwargs) -> (B, 4, L)`` (the layout of
#: ``RopeEngine.compute_position_ids``), called like ``rope_index``.
PositionIdsFn = Callable[..., Any]

#: ``packed_rope_index(input_ids, attention_mask=None, *, cu_seqlens, **kwargs) -> (positions
#: (3, 1, T), deltas (K, 1))`` for one packed ``(1, T)`` row, called like ``rope_index``.
PackedRopeIndexFn = Callable[..., tuple[Any, Any]]

#: ``packed_position_ids(input_ids, attention_mask=None, *, cu_seqlens, **kwargs) -> (1, 4, T)``
#: for one packed ``(1, T)`` row, called like ``packed_rope_index``.
PackedPositionIdsFn = Callable[..., Any]

#: ``token_types(input_ids) -> (B, L)`` integer tensor: 0 text, 1 image, 2 video, 3 audio.
TokenTypesFn = Callable[[Any], Any]

#: ``packed_token_types(input_ids, cu_seqlens) -> (1, T)``: ``token_types`` of one packed ``(1, T)``
#: row, each segment typed as the sample alone.
PackedTokenTypesFn = Callable[[Any, Any], Any]


@dataclasses.dataclass(frozen=True)
class RopeBinding:
    """How positions are computed for one processor, as returned by ``bind_rope_index``.

    Attributes:
        plugin: the plugin's entry-point name; the engine fills it in when the plugin leaves it empty.
        kind: ``"mrope"`` for 3-axis multimodal RoPE, ``"1d"`` for plain positions.
        rope_index: for ``"mrope"``, the callable returning ``(3, B, L)`` positions and ``(B, 1)`` deltas.
            It must accept ``input_ids`` and ``attention_mask`` plus the keyword arguments the
            plugin's ``get_rope_index_kwargs`` produces (and ``mm_token_type_ids`` when
            ``token_types`` is set).
        token_types: when the callable needs ``mm_token_type_ids``, how to build them from ``input_ids``.
            The engine never trusts the caller's copy.
        implementation: a short name of what computes the positions (``"fast"``, ``"reference"``).
        position_dtype: dtype of the positions ``compute_position_ids`` returns. ``int64`` unless the
            family's reference produces non-integer positions.
        description: one line shown by ``mmrope plugins`` and in logs.
        position_ids: optional, for ``"mrope"``: the ``(B, 4, L)`` result of
            ``compute_position_ids`` in one call, taking what ``rope_index`` takes. For kernels
            that place the text row together with the others, sparing the engine its own pass
            over the result. It must return, in ``position_dtype``, exactly what the engine builds
            from ``rope_index``: row 0 ``0..n-1`` over valid tokens and 1 at padding, rows 1..3
            ``rope_index``'s positions. The engine uses it for unpacked batches.
        packed_rope_index: optional, for ``"mrope"``: ``rope_index`` for one packed ``(1, T)`` row,
            taking what ``rope_index`` takes (``attention_mask`` None, ``mm_token_type_ids`` of
            the whole row) and ``cu_seqlens``, the ``(K + 1,)`` int64 segment boundaries. It
            returns ``(3, 1, T)`` positions that restart at 0 in every segment and ``(K, 1)``
            deltas, exactly what ``rope_index`` gives each segment alone. For kernels that place
            segments where they lie, sparing the engine the unpacking of segments into a padded
            batch and the packing back. The engine hands it the segments' tokens back to back as
            one row (the padding of ``segment_ids`` left out), with the token types
            ``packed_token_types`` builds (``token_types`` of the whole row without it).
        packed_position_ids: optional, for ``"mrope"``, with ``packed_rope_index``: the
            ``(1, 4, T)`` result of ``compute_position_ids`` for one packed row in one call, taking
            what ``packed_rope_index`` takes. Row 0 counts each segment's tokens from 0, rows 1..3
            are ``packed_rope_index``'s positions, in ``position_dtype``. The engine uses it where
            ``compute_position_ids`` would otherwise call ``packed_rope_index``, and for packed
            rows of segments of one length too.
        packed_token_types: optional, with ``packed_rope_index`` and ``token_types``, for families
            whose token types depend on earlier tokens of the row (GLM reads an image token as a
            video frame when a begin-of-video marker before it is still open):
            ``packed_token_types(input_ids, cu_seqlens)`` types one packed ``(1, T)`` row, each
            segment as the sample alone. Without it the engine types a packed row with
            ``token_types``, which must then give each token the type it has in its segment alone.
    """

    kind: RopeKind
    rope_index: RopeIndexFn | None = None
    token_types: TokenTypesFn | None = None
    implementation: str = "fast"
    position_dtype: Any = None
    description: str = ""
    plugin: str = ""
    position_ids: PositionIdsFn | None = None
    packed_rope_index: PackedRopeIndexFn | None = None
    packed_position_ids: PackedPositionIdsFn | None = None
    packed_token_types: PackedTokenTypesFn | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("mrope", "1d"):
            raise TypeError(f"RopeBinding.kind must be 'mrope' or '1d', got {self.kind!r}")
        if self.kind == "mrope" and not callable(self.rope_index):
            raise TypeError("RopeBinding(kind='mrope') needs a callable rope_index")
        if self.kind == "1d" and self.rope_index is not None:
            raise TypeError("RopeBinding(kind='1d') must not carry a rope_index: 1-D positions come from the mask")
        for name in ("position_ids", "packed_rope_index", "packed_position_ids", "packed_token_types"):
            value = getattr(self, name)
            if value is not None and (self.kind != "mrope" or not callable(value)):
                raise TypeError(f"RopeBinding.{name} must be a callable, and only for kind='mrope'")
        if self.packed_position_ids is not None and self.packed_rope_index is None:
            raise TypeError("RopeBinding.packed_position_ids needs packed_rope_index: get_rope_index places packed rows too")
        if self.token_types is not None and not callable(self.token_types):
            raise TypeError("RopeBinding.token_types must be callable or None")
        if self.packed_token_types is not None and (self.packed_rope_index is None or self.token_types is None):
            raise TypeError("RopeBinding.packed_token_types needs packed_rope_index and token_types: it types the rows "
                            "packed_rope_index places")
        if not isinstance(self.implementation, str) or not self.implementation:
            raise TypeError("RopeBinding.implementation must be a non-empty string")
        if self.position_dtype is None:
            import torch

            object.__setattr__(self, "position_dtype", torch.int64)


@dataclasses.dataclass(frozen=True)
class ValidationPolicy:
    """How strictly the processor's own ``validate_inputs`` runs inside ``engine.process``.

    Attributes:
        strict: True keeps the processor's check as it is.
        validate: with ``strict=False``, what runs instead of ``processor.validate_inputs``:
            ``validate(processor, images=..., text=..., videos=..., audio=..., **kwargs)``; it may
            raise to reject input. None skips validation altogether.
        reason: why the policy differs from the processor's own; shown in listings and docs.
    """

    strict: bool = True
    validate: Callable[..., None] | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.strict, bool):
            raise TypeError("ValidationPolicy.strict must be a bool")
        if self.strict and self.validate is not None:
            raise TypeError("ValidationPolicy(strict=True) keeps the processor's check; do not pass validate")
        if self.validate is not None and not callable(self.validate):
            raise TypeError("ValidationPolicy.validate must be callable or None")
        if not self.strict and not self.reason:
            raise TypeError("ValidationPolicy(strict=False) needs a reason users can read")


STRICT = ValidationPolicy()


@dataclasses.dataclass(frozen=True)
class ExampleCase:
    """A tiny, offline, real processor and samples for it: what ``mmrope demo`` shows and what the
    conformance checks exercise.

    Attributes:
        name: the model family, e.g. ``"Qwen2.5-VL"``.
        build: ``build() -> (processor, config)``; must work without network or weights.
        samples: ``samples(processor, rng) -> list of dict``: keyword arguments for
            ``processor(...)``, one call per sample, each with ``return_tensors="pt"`` (``rng`` is a
            ``random.Random``). Samples are processed one by one and batched as trainers do,
            so give at least two that differ in length and media.
    """

    name: str
    build: Callable[[], tuple[Any, Any]]
    samples: Callable[[Any, Any], list[Mapping[str, Any]]]

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TypeError("ExampleCase.name must be a non-empty string")
        if not callable(self.build) or not callable(self.samples):
            raise TypeError("ExampleCase.build and ExampleCase.samples must be callable")
