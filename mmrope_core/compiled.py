"""The compiled CPU loops a plugin may count on, and whether they are loaded.

The loops are missing where mmrope-core was installed without a C compiler (or the Python
headers), and switched off by ``MMROPE_DISABLE_COMPILED=1``: :func:`available` is then False.
Plugins reach them through family-neutral calls that take numpy paths of their own without them,
with the same results: :mod:`mmrope_core.items` (media items between markers, placed by a layout
given as data) and :mod:`mmrope_core.mrope` (runs of placeholders). Those calls read ``native``
(the loops, or None) when called, so replacing it switches the loops for their callers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._compiled import DISABLE_VARIABLE, native

__all__ = ["DISABLE_VARIABLE", "available", "switched_off"]


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
