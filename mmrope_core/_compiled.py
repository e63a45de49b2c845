"""The compiled CPU loops (``mmrope_core._native``), or None where they are missing or switched off.

Every caller has a numpy/torch path for other devices; without the loops the CPU takes it too,
with the same results. ``MMROPE_DISABLE_COMPILED=1`` switches them off (the tests run both ways).
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

from .errors import CompiledLoopsWarning

DISABLE_VARIABLE = "MMROPE_DISABLE_COMPILED"


def _load() -> ModuleType | None:
    if os.environ.get(DISABLE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    try:
        from . import _native
    except ImportError as exc:
        warnings.warn(
            f"mmrope's compiled CPU loops (mmrope_core._native) are not installed ({exc}): positions are the "
            f"same, only slower. Reinstall mmrope-core where a C compiler and the Python headers are available "
            f"to build them, or set {DISABLE_VARIABLE}=1 to silence this.",
            CompiledLoopsWarning,
            stacklevel=2,
        )
        return None
    return _native


native: ModuleType | None = _load()
