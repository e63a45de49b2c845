"""The options given to ``RopeEngine.from_processor``, as ``bind_rope_index`` sees them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .errors import UnknownOptionError


class EngineOptions(Mapping[str, Any]):
    """A read-only mapping that remembers which options were asked for: an option that no plugin
    asks for is a mistake (a typo, or an option of another family) and is refused by name."""

    __slots__ = ("_asked", "_values")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._asked: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self._asked.add(key)
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._asked.add(key)
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._asked.add(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"EngineOptions({self._values!r})"

    def was_read(self, key: str) -> bool:
        return key in self._asked

    def given(self, key: str) -> bool:
        """Whether the caller gave ``key``, without counting as asking for it."""
        return key in self._values

    def refuse_unread(self, reader: str) -> None:
        """Raise :class:`UnknownOptionError` for the options nobody asked for; ``reader`` names
        who was asked (the plugin that bound the processor)."""
        unread = sorted(set(self._values) - self._asked)
        if not unread:
            return
        known = ", ".join(repr(name) for name in sorted(self._asked)) or "none"
        names = ", ".join(repr(name) for name in unread)
        raise UnknownOptionError(
            f"RopeEngine option{'s' if len(unread) > 1 else ''} {names} {'are' if len(unread) > 1 else 'is'} not "
            f"known to {reader}; the options it reads: {known}. Check the spelling, or drop options meant for "
            f"another model family"
        )
