"""What hooks return. Each type checks itself when built, so a plugin's mistake is caught
where it is made and reported with the plugin's name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .kernel import RopeKernel

RopeKind = Literal["mrope", "1d"]


@dataclasses.dataclass(frozen=True)
class RopeBinding:
    """How positions are computed for one processor, as ``bind_rope_index`` returns it.

    Attributes:
        kind: ``"mrope"`` for multimodal RoPE, whose positions the ``kernel`` computes; ``"1d"``
            for plain positions, which the engine counts from the attention mask.
        kernel: for ``"mrope"``, a :class:`~mmrope_core.kernel.RopeKernel`.
        implementation: a short name of what computes the positions (``"fast"``, ``"reference"``).
        description: one line shown by ``mmrope plugins`` and the engine's repr, e.g. which
            kernel was chosen and why.
        mixes_segments: why the model's own layers mix the segments of a packed row, as the
            packing collators tell users when they refuse it (e.g. "image tokens attend to one
            another through a mask overlay that transformers reads by position"); empty when
            nothing the plugin knows does. The core decides the rest for every binding alike, from
            what a tiny random model of the config does with a packed row and the layers it
            builds: see :mod:`mmrope_core.segments`.
    """

    kind: RopeKind
    kernel: RopeKernel | None = None
    implementation: str = "fast"
    description: str = ""
    mixes_segments: str = ""

    def __post_init__(self) -> None:
        from .kernel import RopeKernel  # torch, which listing plugins does not need

        if self.kind not in ("mrope", "1d"):
            raise TypeError(f"RopeBinding.kind must be 'mrope' or '1d', got {self.kind!r}")
        if self.kind == "mrope" and not isinstance(self.kernel, RopeKernel):
            raise TypeError(f"RopeBinding(kind='mrope') needs a RopeKernel, got {type(self.kernel).__name__}")
        if self.kind == "1d" and self.kernel is not None:
            raise TypeError("RopeBinding(kind='1d') must not carry a kernel: 1-D positions come from the mask")
        if not isinstance(self.implementation, str) or not self.implementation:
            raise TypeError("RopeBinding.implementation must be a non-empty string")
        if not isinstance(self.description, str):
            raise TypeError("RopeBinding.description must be a string")
        if not isinstance(self.mixes_segments, str):
            raise TypeError("RopeBinding.mixes_segments must be a string (empty when the layers keep segments apart)")


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
        batches: optional, ``batches(processor, config, rng) -> dict``: one generated sample laid
            out as the family's processor lays it out, for any processor and config of the family
            (their own token ids and sizes): ``input_ids`` and ``attention_mask`` of shape
            ``(1, L)`` and the keyword arguments of ``get_rope_index``. ``mmrope verify`` draws its samples from it; videos
            included, since that is where conventions differ.
    """

    name: str
    build: Callable[[], tuple[Any, Any]]
    samples: Callable[[Any, Any], Sequence[Mapping[str, Any]]]
    batches: Callable[[Any, Any, Any], Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TypeError("ExampleCase.name must be a non-empty string")
        if not callable(self.build) or not callable(self.samples):
            raise TypeError("ExampleCase.build and ExampleCase.samples must be callable")
        if self.batches is not None and not callable(self.batches):
            raise TypeError("ExampleCase.batches must be callable or None")
