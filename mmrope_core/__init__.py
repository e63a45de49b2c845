"""mmrope: multimodal RoPE position ids for trainers, computed by plugins per model family.

Importing this package loads no plugin; plugins are discovered when the first engine is built.
"""

from .engine import RopeEngine
from .errors import (
    CollateError,
    InvalidInputError,
    MmropeError,
    PlaceholderMismatchError,
    PluginConflictError,
    PluginContractError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    PluginLoadWarning,
    RopeIndexUnavailableError,
    UnsupportedProcessorError,
)
from .hookspecs import hookimpl
from .manager import PluginInfo, PluginManager, get_plugin_manager
from .types import ExampleCase, RopeBinding, ValidationPolicy

__version__ = "0.1.0"

__all__ = [
    "CollateError",
    "ExampleCase",
    "InvalidInputError",
    "MmropeError",
    "PlaceholderMismatchError",
    "PluginConflictError",
    "PluginContractError",
    "PluginError",
    "PluginHookError",
    "PluginInfo",
    "PluginLoadError",
    "PluginLoadWarning",
    "PluginManager",
    "RopeBinding",
    "RopeEngine",
    "RopeIndexUnavailableError",
    "UnsupportedProcessorError",
    "ValidationPolicy",
    "get_plugin_manager",
    "hookimpl",
]
