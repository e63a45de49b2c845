"""The one guard around every call into plugin code: a raise becomes a PluginHookError naming the
plugin and what it was asked to do; an MmropeError a plugin raises on purpose passes unchanged."""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Generator
from typing import Any

from .errors import MmropeError, PluginHookError

#: (plugin name, result) of each hook implementation that answered, in the hook call under way
_NO_KEYWORDS: dict[str, Any] = {}
_answers: contextvars.ContextVar[list[tuple[str, Any]] | None] = contextvars.ContextVar("mmrope_answers", default=None)
#: the plugin whose hook implementation is running (None in the core, and in hook wrappers)
_running: contextvars.ContextVar[str | None] = contextvars.ContextVar("mmrope_running", default=None)


def running() -> str | None:
    """The name of the plugin whose hook implementation is running, or None."""
    return _running.get()


def call(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
         plugin: Callable[[], str], what: str, advice: str) -> Any:
    """``function(*args, **kwargs)``; ``plugin()`` is its plugin's label (asked for only on a
    failure), ``what`` what it does ("hook varlen_keys", "the kernel's rope_index"), ``advice``
    what a user can do about a failure."""
    try:
        return function(*args, **kwargs)
    except MmropeError:
        raise
    except Exception as exc:
        raise failure(exc, plugin=plugin(), what=what, advice=advice) from exc


def failure(exc: BaseException, *, plugin: str, what: str, advice: str) -> PluginHookError:
    return PluginHookError(f"plugin {plugin} raised in {what}: {type(exc).__name__}: {exc}. {advice}")


def hook_implementation(function: Callable[..., Any], *, hook: str, name: str, label: Callable[[], str],
                        wrapper: bool) -> Callable[..., Any]:
    """``function``, a hook implementation of plugin ``name``, guarded and recording its answer
    (see :func:`answers`); ``wrapper`` for pluggy wrapper implementations (generators)."""
    advice = f"Report it to the plugin's authors, or disable it with MMROPE_DISABLE_PLUGINS={name}."
    what = f"hook {hook}"

    if wrapper:
        @functools.wraps(function)
        def guarded_wrapper(*args: Any) -> Generator[Any, Any, Any]:
            try:
                result = yield from function(*args)
            except MmropeError:  # what the implementations it wraps raised, already guarded, included
                raise
            except Exception as exc:
                raise failure(exc, plugin=label(), what=what, advice=advice) from exc
            _record(name, result)
            return result

        return guarded_wrapper

    @functools.wraps(function)
    def guarded(*args: Any) -> Any:
        token = _running.set(name)
        try:
            result = call(function, args, _NO_KEYWORDS, plugin=label, what=what, advice=advice)
        finally:
            _running.reset(token)
        _record(name, result)
        return result

    return guarded


def _record(name: str, result: Any) -> None:
    answers = _answers.get()
    if answers is not None and result is not None:
        answers.append((name, result))


class answers:
    """Inside ``with answers() as given:``, ``given`` lists ``(plugin name, result)`` for each
    guarded implementation that returned something, so that results pluggy hands back can be
    told apart by plugin."""

    def __enter__(self) -> list[tuple[str, Any]]:
        given: list[tuple[str, Any]] = []
        self._token = _answers.set(given)
        return given

    def __exit__(self, *exc_info: Any) -> None:
        _answers.reset(self._token)
