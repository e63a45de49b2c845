"""The plugin manager: finds plugins through entry points, loads each one inside its own guard,
and calls hooks so that a misbehaving plugin is always named.

Environment variables, read when plugins are first loaded:

``MMROPE_DISABLE_PLUGINS=a,b``
    entry-point names never imported.
``MMROPE_LOAD_PLUGINS=a,b``
    when set, only these are imported (set but empty: none).
``MMROPE_STRICT_PLUGINS=1``
    a plugin that fails to load raises :class:`PluginLoadError` instead of a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import importlib_metadata
import pluggy

from . import _guard, hookspecs
from .errors import PluginError, PluginLoadError, PluginLoadWarning

ENTRY_POINT_GROUP = "mmrope"

PluginStatus = Literal["active", "disabled", "failed"]


@dataclasses.dataclass(frozen=True)
class PluginInfo:
    """One line of ``mmrope plugins``: a plugin known to the manager and its state."""

    name: str
    distribution: str | None
    version: str | None
    status: PluginStatus
    reason: str = ""
    hooks: tuple[str, ...] = ()
    processors: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``name (distribution version)``, the way errors name a plugin."""
        if self.distribution is None:
            return f"{self.name} (registered in-process)"
        return f"{self.name} ({self.distribution} {self.version})"

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _env_names(env: Mapping[str, str], key: str) -> frozenset[str] | None:
    value = env.get(key)
    if value is None:
        return None
    return frozenset(part.strip() for part in value.split(",") if part.strip())


def strict_plugins(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``MMROPE_STRICT_PLUGINS`` is set (in ``env``, default the process environment)."""
    value = (os.environ if env is None else env).get("MMROPE_STRICT_PLUGINS", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


class PluginManager:
    """Holds the plugins of one process (or of one test).

    Entry points are read once, on the first call that needs plugins, never on import.
    """

    def __init__(self, *, env: Mapping[str, str] | None = None, load_entry_points: bool = True) -> None:
        self._env = os.environ if env is None else env
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        self._shadowed: list[PluginInfo] = []
        self._lock = threading.RLock()
        self._loaded = not load_entry_points
        self._failures: list[tuple[PluginInfo, BaseException | None]] = []

    # -- loading -----------------------------------------------------------------------------

    def load(self) -> None:
        """Import the entry points of group ``mmrope`` once; later calls do nothing but, with
        ``MMROPE_STRICT_PLUGINS`` set, raise again for a plugin that failed to load."""
        with self._lock:
            if not self._loaded:
                self._loaded = True
                allow = _env_names(self._env, "MMROPE_LOAD_PLUGINS")
                block = _env_names(self._env, "MMROPE_DISABLE_PLUGINS") or frozenset()
                for entry_point in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
                    self._load_one(entry_point, allow, block)
            if self._failures and strict_plugins(self._env):
                info, exc = self._failures[0]
                raise PluginLoadError(f"mmrope plugin {info.label} failed to load: {info.reason} "
                                      f"(MMROPE_STRICT_PLUGINS is set)") from exc

    def _load_one(self, entry_point: Any, allow: frozenset[str] | None, block: frozenset[str]) -> None:
        name = entry_point.name
        dist = entry_point.dist
        dist_name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
        if name in block or (allow is not None and name not in allow):
            why = "MMROPE_DISABLE_PLUGINS" if name in block else "not in MMROPE_LOAD_PLUGINS"
            self._infos[name] = PluginInfo(name, dist_name, version, "disabled", reason=why)
            return
        if name in self._infos:
            other = self._infos[name]
            reason = (
                f"entry point name {name!r} is provided by both {other.distribution} {other.version} "
                f"and {dist_name} {version}; uninstall one of them"
            )
            self._fail(PluginInfo(name, dist_name, version, "failed", reason=reason), None)
            return
        try:
            plugin = entry_point.load()
            self._register_checked(plugin, name)
        except Exception as exc:  # a broken plugin must never take the host down
            reason = f"{type(exc).__name__}: {exc}"
            self._fail(PluginInfo(name, dist_name, version, "failed", reason=reason), exc)
            return
        self._infos[name] = self._describe(plugin, name, dist_name, version)

    def _fail(self, info: PluginInfo, exc: BaseException | None) -> None:
        if info.name in self._infos:  # a second distribution reusing an active plugin's name
            self._shadowed.append(info)
        else:
            self._infos[info.name] = info
        self._failures.append((info, exc))
        if strict_plugins(self._env):
            return  # raised by load(), once every entry point has been read
        warnings.warn(f"mmrope plugin {info.label} failed to load: {info.reason}; it is skipped. Set "
                      f"MMROPE_DISABLE_PLUGINS={info.name} to silence this.", PluginLoadWarning, stacklevel=5)

    def _register_checked(self, plugin: Any, name: str) -> None:
        self._pm.register(plugin, name=name)  # validates hookimpl signatures against the specs
        callers = self._pm.get_hookcallers(plugin) or []
        unknown = [caller.name for caller in callers if caller.spec is None]
        if unknown:
            self._pm.unregister(plugin)
            known = ", ".join(sorted(self.hook_names()))
            raise pluggy.PluginValidationError(
                plugin, f"implements unknown hook(s) {', '.join(unknown)}; the hooks are: {known}"
            )
        # pluggy calls the implementations; each is guarded so that a failure names its plugin
        label = functools.partial(self._label, name)
        for caller in callers:
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin:
                    guarded = _guard.hook_implementation(impl.function, hook=caller.name, name=name, label=label,
                                                         wrapper=impl.wrapper or impl.hookwrapper)
                    impl.function = guarded  # type: ignore[misc]

    def _label(self, name: str) -> str:
        info = self._infos.get(name)
        return info.label if info is not None else f"{name} (registered in-process)"

    def _describe(self, plugin: Any, name: str, dist_name: str | None, version: str | None) -> PluginInfo:
        hooks = tuple(sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or ()))
        processors = tuple(getattr(plugin, "PROCESSOR_CLASSES", ()) or ())
        return PluginInfo(name, dist_name, version, "active", hooks=hooks, processors=processors)

    # -- in-process registration -------------------------------------------------------------

    def register(self, plugin: Any, name: str) -> None:
        """Register a module or object carrying hookimpls under ``name`` (tests, notebooks)."""
        with self._lock:
            self.load()
            if name in self._infos and self._infos[name].status == "active":
                raise PluginLoadError(f"a plugin named {name!r} is already registered: {self._infos[name].label}")
            self._register_checked(plugin, name)
            self._infos[name] = self._describe(plugin, name, None, None)

    def unregister(self, name: str) -> None:
        with self._lock:
            self._pm.unregister(name=name)
            self._infos.pop(name, None)

    @contextlib.contextmanager
    def registered(self, plugin: Any, name: str) -> Iterator[None]:
        """Register ``plugin`` for the duration of a ``with`` block, always unregistering it."""
        self.register(plugin, name)
        try:
            yield
        finally:
            self.unregister(name)

    # -- queries -----------------------------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        """Every plugin seen: active, disabled and failed, sorted by name. Listing never raises,
        not even with ``MMROPE_STRICT_PLUGINS`` set: a failed plugin is listed with its reason."""
        with contextlib.suppress(PluginLoadError):
            self.load()
        return sorted([*self._infos.values(), *self._shadowed], key=lambda info: info.name)

    def info(self, name: str) -> PluginInfo:
        """The plugin registered as ``name`` (its entry-point name), active, disabled or failed."""
        with contextlib.suppress(PluginLoadError):
            self.load()
        if name not in self._infos:
            raise PluginError(f"no mmrope plugin is named {name!r}; the plugins seen: "
                              f"{', '.join(map(repr, sorted(self._infos))) or 'none'} (see `mmrope plugins`)")
        return self._infos[name]

    @property
    def pluggy(self) -> pluggy.PluginManager:
        """The pluggy manager the hooks are called through, for pluggy's tracing and monitoring
        (``add_hookcall_monitoring``, ``enable_tracing``)."""
        return self._pm

    @staticmethod
    def hook_names() -> list[str]:
        return sorted(name for name in vars(hookspecs) if hasattr(getattr(hookspecs, name), "mmrope_spec"))

    def results(self, hook_name: str, **kwargs: Any) -> list[tuple[PluginInfo, Any]]:
        """Call hook ``hook_name`` through pluggy (its order, ``firstresult``, wrappers and tracing
        apply) and return ``(plugin, result)`` for each result that is not None: the first one
        only for ``firstresult`` hooks.

        An exception from an implementation becomes a :class:`PluginHookError` naming the plugin,
        its distribution and the hook; an :class:`MmropeError` a plugin raises on purpose passes
        through unchanged.
        """
        return [(info, value) for info, value, _ in self.answers(hook_name, **kwargs)]

    def answers(self, hook_name: str, **kwargs: Any) -> list[tuple[PluginInfo, Any, frozenset[str]]]:
        """:meth:`results`, each with the names of the plugins that took part in it: for a
        ``firstresult`` hook every plugin that answered (the one that computed the result and the
        wrappers around it, which may replace it), else those that returned that very result."""
        if not self._loaded or self._failures:
            self.load()
        caller = getattr(self._pm.hook, hook_name)
        with _guard.answers() as given:
            outcome = caller(**kwargs)
        if _firstresult(caller):
            return [] if outcome is None else [(self._answered(given, outcome), outcome,
                                                frozenset(name for name, _ in given))]
        return [(self._answered(given, value), value, frozenset(name for name, result in given if result is value))
                for value in outcome if value is not None]

    def results_of(self, name: str, hook_name: str, **kwargs: Any) -> list[Any]:
        """What plugin ``name`` alone answers to hook ``hook_name`` (through pluggy, so that its
        own wrappers apply): its results that are not None."""
        self.load()
        others = [plugin for other, plugin in self._pm.list_name_plugin() if other != name]
        caller = self._pm.subset_hook_caller(hook_name, remove_plugins=others)
        outcome = caller(**kwargs)
        values = [outcome] if _firstresult(caller) else outcome
        return [value for value in values if value is not None]

    def _answered(self, given: list[tuple[str, Any]], value: Any) -> PluginInfo:
        """The plugin whose implementation returned ``value`` last (a wrapper's, where it replaced
        the result)."""
        name = next((name for name, result in reversed(given) if result is value), None)
        if name is None:  # an old-style hook wrapper forced the result
            return PluginInfo("a hook wrapper", None, None, "active")
        return self._infos.get(name) or PluginInfo(name, None, None, "active")

    def conflicts(self) -> dict[str, list[PluginInfo]]:
        """Processor classes that more than one active plugin declares it handles
        (``PROCESSOR_CLASSES``), with those plugins in the order ``bind_rope_index`` asks them:
        the first binding wins."""
        order = [impl.plugin_name for impl in reversed(self._pm.hook.bind_rope_index.get_hookimpls())]
        claims: dict[str, list[PluginInfo]] = {}
        for info in self.plugins():
            if info.status == "active":
                for processor in info.processors:
                    claims.setdefault(processor, []).append(info)
        rank = {name: index for index, name in enumerate(order)}
        return {processor: sorted(infos, key=lambda info: rank.get(info.name, len(rank)))
                for processor, infos in sorted(claims.items()) if len(infos) > 1}


def _firstresult(caller: Any) -> bool:
    return caller.spec is not None and bool(caller.spec.opts.get("firstresult"))


_default_manager: PluginManager | None = None
_default_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide manager, created on first use (entry points load on first hook call)."""
    global _default_manager
    with _default_lock:
        if _default_manager is None:
            _default_manager = PluginManager()
        return _default_manager
