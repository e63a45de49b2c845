"""The exceptions mmrope raises.

Every message says what went wrong, where (sample index, key, plugin) and how to fix it.
"""

from __future__ import annotations


class MmropeError(Exception):
    """Base class of every error mmrope raises on purpose."""


class InvalidInputError(MmropeError, ValueError):
    """Tensors given to the engine have the wrong type, rank, shape or values."""


class PlaceholderMismatchError(InvalidInputError):
    """Placeholder tokens in ``input_ids`` do not match the media grids."""


class UnsupportedProcessorError(MmropeError):
    """No installed plugin recognises the processor."""


class RopeIndexUnavailableError(MmropeError):
    """``get_rope_index`` was called on an engine whose model uses 1-D RoPE."""


class CollateError(InvalidInputError):
    """Per-sample multimodal inputs cannot be batched."""


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


class PluginLoadWarning(UserWarning):
    """A plugin failed to load and was skipped (``MMROPE_STRICT_PLUGINS=1`` makes it an error)."""
