"""The compiled CPU loops (``mmrope_core._native``), and whether they are loaded.

The loops are missing where mmrope-core was installed without a C compiler (or the Python
headers), and switched off by ``MMROPE_DISABLE_COMPILED=1``: :func:`available` is then False.
Every caller has a numpy/torch path taken without them, with the same results. Plugins reach
them through family-neutral calls: :mod:`mmrope_core.items` (media items between markers, placed
by a layout given as data) and :mod:`mmrope_core.mrope` (runs of placeholders). ``native`` holds
the loops, or None; :mod:`mmrope_core.items` reads it when called, so replacing it (as
:func:`switched_off` does) switches the loops for its callers.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from types import ModuleType

from .errors import CompiledLoopsWarning

__all__ = ["DISABLE_VARIABLE", "available", "switched_off"]

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


def available() -> bool:
    """Whether the compiled loops are loaded."""
    return native is not None


@contextlib.contextmanager
def switched_off() -> Iterator[None]:
    """The calls inside take their numpy paths, as without the compiled loops: for tests and
    benchmarks that compare both (it switches them off for every thread of the process)."""
    global native
    loops, native = native, None
    try:
        yield
    finally:
        native = loops
