"""Recognising a processor by its class, the way plugins claim processors."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def class_name_in(processor: Any, names: Collection[str]) -> str | None:
    """The name of the first class of ``processor``'s MRO (its own class, then its bases) that is
    in ``names``, or None. Subclasses of a known processor are recognised as it."""
    for cls in type(processor).__mro__:
        if cls.__name__ in names:
            return cls.__name__
    return None
