"""The options given to ``RopeEngine.from_processor``, as ``bind_rope_index`` sees them."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from . import _guard
from .errors import UnknownOptionError


class EngineOptions(Mapping[str, Any]):
    """A read-only mapping that remembers which plugin asked for which option: an option that the
    plugin binding the processor never asks for is a mistake (a typo, or an option of another
    family) and is refused by name, whatever other plugins asked for."""

    __slots__ = ("_asked", "_values")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._asked: dict[str, set[str | None]] = {}

    def _ask(self, key: str) -> None:
        self._asked.setdefault(key, set()).add(_guard.running())

    def __getitem__(self, key: str) -> Any:
        self._ask(key)
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._ask(key)
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self._ask(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"EngineOptions({self._values!r})"

    def was_read(self, key: str, by: Collection[str] | None = None) -> bool:
        """Whether ``key`` was asked for: by any plugin, or by one of the plugins ``by`` (or by
        code outside every plugin's implementation: the core, hook wrappers)."""
        readers = self._asked.get(key, set())
        return bool(readers) if by is None else any(reader is None or reader in by for reader in readers)

    def given(self, key: str) -> bool:
        """Whether the caller gave ``key``, without counting as asking for it."""
        return key in self._values

    def refuse_unread(self, reader: str, by: Collection[str] | None = None) -> None:
        """Raise :class:`UnknownOptionError` for the options not asked for (by the plugins ``by``,
        see :meth:`was_read`); ``reader`` names who was asked (the plugin that bound the processor)."""
        unread = sorted(key for key in self._values if not self.was_read(key, by))
        if not unread:
            return
        known = ", ".join(repr(name) for name in sorted(key for key in self._asked if self.was_read(key, by))) or "none"
        names = ", ".join(repr(name) for name in unread)
        raise UnknownOptionError(
            f"RopeEngine option{'s' if len(unread) > 1 else ''} {names} {'are' if len(unread) > 1 else 'is'} not "
            f"known to {reader}; the options it reads: {known}. Check the spelling, or drop options meant for "
            f"another model family"
        )
