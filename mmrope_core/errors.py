"""The exceptions mmrope raises.

Every message says what went wrong, where (sample index, key, plugin) and how to fix it.
"""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """``"1 image"``, ``"2 images"``: a count and its noun, for messages."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}es" if noun.endswith(("s", "x", "ch")) else f"{count} {noun}s"


def a(noun: str) -> str:
    """``"an image"``, ``"a video"``: a noun with its indefinite article, for messages."""
    return f"an {noun}" if noun[:1].lower() in "aeio" else f"a {noun}"


class MmropeError(Exception):
    """Base class of every error mmrope raises on purpose."""


class InvalidInputError(MmropeError, ValueError):
    """Tensors given to the engine have the wrong type, rank, shape or values."""


class PlaceholderMismatchError(InvalidInputError):
    """Placeholder tokens in ``input_ids`` do not match the media grids."""


class SegmentCutError(PlaceholderMismatchError):
    """A boundary of a packed row cuts a media item in two.

    Attributes:
        segments: each segment whose start cuts an item the segment before it began (in the
            row the kernel was given), in order.
    """

    def __init__(self, segments: tuple[int, ...], where: str = "") -> None:
        self.segments = tuple(segments)
        first = self.segments[0]
        at = f" ({where})" if where else ""
        super().__init__(
            f"segment {first} starts inside a placeholder run that segment {first - 1} began{at}: the segment "
            f"boundary cuts a media item; move the boundary before or after the item"
        )


class UnknownInputKeyError(InvalidInputError):
    """A key of the multimodal inputs (or of ``mm_processor_kwargs``) that the family does not read
    but that resembles one it reads and did not find: probably misspelt. The message names both."""


class UnsupportedProcessorError(MmropeError):
    """No installed plugin recognises the processor."""


class UnknownOptionError(MmropeError, TypeError):
    """An engine option that neither the engine nor the plugin binding the processor knows."""


class UnknownKeywordError(MmropeError, TypeError):
    """A keyword argument the function does not take (a typo); the message names the one probably meant."""


class PretrainedLoadError(MmropeError, OSError):
    """The processor or config of a checkpoint cannot be loaded: a missing directory, a hub id that
    is unknown, private or unreachable. The message names the path or id and what to do."""


class UnknownConventionError(MmropeError, ValueError):
    """A position convention that does not exist, or that the family does not offer."""


class RopeIndexUnavailableError(MmropeError):
    """``get_rope_index`` was called on an engine whose model uses 1-D RoPE."""


class PackingUnsupportedError(MmropeError):
    """The model's layers would mix the segments of a packed row: packing is refused before any
    forward, naming the layers and what to do instead."""


class PaddingUnsupportedError(MmropeError, ValueError):
    """The model's own layers give a sample padded on this side other logits than the sample
    alone: ``PaddedCollator`` refuses the side, naming why and the side to use."""


class CollateError(InvalidInputError):
    """Per-sample multimodal inputs cannot be batched."""


class SequenceSplitError(InvalidInputError):
    """A packed row cannot be split for sequence or context parallel: an unknown scheme, a size or
    rank out of range, malformed boundaries, or a segment (or row) whose length the scheme cannot
    cut in equal parts. The message names the segment, its length and the multiple it needs."""


class PluginError(MmropeError):
    """A plugin misbehaved: failed to load, broke a hook's contract or raised inside a hook."""


class PluginLoadError(PluginError):
    """A plugin's entry point could not be imported or registered."""


class PluginConflictError(PluginError):
    """Two plugins gave contradicting answers."""


class PluginContractError(PluginError):
    """A hook returned something its contract does not allow."""


class PluginHookError(PluginError):
    """A hook raised an exception; the original is chained as ``__cause__``."""


class CompiledLoopsWarning(UserWarning):
    """mmrope's compiled CPU loops are not installed: positions are the same, computed more slowly."""


class PluginLoadWarning(UserWarning):
    """A plugin failed to load and was skipped (``MMROPE_STRICT_PLUGINS=1`` makes it an error)."""


class GeneratedMaskWarning(UserWarning):
    """A rollout convention that places generated tokens apart from a prefill got no
    ``generated_mask``: those tokens are placed as a prefill of the whole sequence."""
