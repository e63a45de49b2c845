"""mmrope: multimodal RoPE position ids for trainers, computed by plugins per model family.

Importing this package imports nothing else: each public name is loaded on first use, so
``import mmrope_core`` (and the pytest plugin it registers) costs nothing until an engine is
built, and loads no plugin.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it: the one list of public names (``__all__`` is its keys)
_PUBLIC = {
    "RopeEngine": "engine",
    "hookimpl": "hookspecs",
    "PluginInfo": "manager",
    "PluginManager": "manager",
    "get_plugin_manager": "manager",
    "ExampleCase": "types",
    "BatchLayout": "batching",
    "MediaKey": "batching",
    "RopeBinding": "types",
    "RopeKernel": "kernel",
    "ValidationPolicy": "types",
    **dict.fromkeys(
        (
            "CollateError",
            "CompiledLoopsWarning",
            "GeneratedMaskWarning",
            "InvalidInputError",
            "MmropeError",
            "PackingUnsupportedError",
            "PaddingUnsupportedError",
            "PlaceholderMismatchError",
            "PluginConflictError",
            "PluginContractError",
            "PluginError",
            "PluginHookError",
            "PluginLoadError",
            "PluginLoadWarning",
            "PretrainedLoadError",
            "RopeIndexUnavailableError",
            "SegmentCutError",
            "SequenceSplitError",
            "UnknownConventionError",
            "UnknownInputKeyError",
            "UnknownKeywordError",
            "UnknownOptionError",
            "UnsupportedProcessorError",
        ),
        "errors",
    ),
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mmrope_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from .batching import BatchLayout, MediaKey
    from .engine import RopeEngine
    from .errors import (
        CollateError,
        CompiledLoopsWarning,
        GeneratedMaskWarning,
        InvalidInputError,
        MmropeError,
        PackingUnsupportedError,
        PaddingUnsupportedError,
        PlaceholderMismatchError,
        PluginConflictError,
        PluginContractError,
        PluginError,
        PluginHookError,
        PluginLoadError,
        PluginLoadWarning,
        PretrainedLoadError,
        RopeIndexUnavailableError,
        SegmentCutError,
        SequenceSplitError,
        UnknownConventionError,
        UnknownInputKeyError,
        UnknownKeywordError,
        UnknownOptionError,
        UnsupportedProcessorError,
    )
    from .hookspecs import hookimpl
    from .kernel import RopeKernel
    from .manager import PluginInfo, PluginManager, get_plugin_manager
    from .types import ExampleCase, RopeBinding, ValidationPolicy
