"""Binding a processor: asking the plugins which of them computes its positions, and the
message when none does."""

from __future__ import annotations

from typing import Any

from .conventions import KNOWN, TRANSFORMERS, convention
from .errors import InvalidInputError, PluginContractError, UnsupportedProcessorError
from .manager import PluginInfo, PluginManager
from .options import EngineOptions
from .types import RopeBinding


def bind(plugins: PluginManager, processor: Any, config: Any, options: EngineOptions) -> tuple[PluginInfo, RopeBinding]:
    """The plugin that binds ``processor`` and its binding, after refusing options it never read."""
    for info, result, binders in plugins.answers("bind_rope_index", processor=processor, config=config,
                                                 options=options):
        expect(isinstance(result, RopeBinding), info, "bind_rope_index", "a RopeBinding", result)
        if result.kind == "1d":
            read_mask_options(options, type(processor).__name__)
        if options.given("convention") and not options.was_read("convention", binders):
            # a plugin that never asks for one computes transformers' positions: refuse the others
            convention(options, f"plugin {info.label}", (TRANSFORMERS,))
        options.refuse_unread(f"plugin {info.label}, which binds {type(processor).__name__}", binders)
        return info, result
    raise UnsupportedProcessorError(_unsupported_message(plugins, processor, config))


def read_mask_options(options: EngineOptions, what: str) -> None:
    """1-D positions come from the attention mask, in every convention and by one implementation
    that ``implementation="fast"`` and ``"reference"`` both name, so that one trainer
    configuration serves every family."""
    convention(options, what, KNOWN)
    implementation = options.get("implementation")
    if implementation not in (None, "fast", "reference"):
        raise InvalidInputError(f"implementation={implementation!r} is not an implementation of {what}: its 1-D "
                                f"positions come from the attention mask, which 'fast' and 'reference' both name")


def _unsupported_message(plugins: PluginManager, processor: Any, config: Any) -> str:
    infos = plugins.plugins()
    by_status = {status: [info for info in infos if info.status == status] for status in ("active", "failed", "disabled")}
    lines = [f"no installed mmrope plugin handles {type(processor).__name__}."]
    lines.append("  Installed: " + (", ".join(info.label for info in by_status["active"]) or "none") + ".")
    if by_status["failed"]:
        lines.append("  Failed to load: " + "; ".join(f"{info.label}: {info.reason}" for info in by_status["failed"]) + ".")
    if by_status["disabled"]:
        lines.append("  Disabled: " + ", ".join(f"{info.label} ({info.reason})" for info in by_status["disabled"]) + ".")
    claimed = [info for info in by_status["active"] if type(processor).__name__ in info.processors]
    if config is None:
        lines.append("  No config was given, and some plugins decide from the model's config: pass it, "
                     "RopeEngine.from_processor(processor, AutoConfig.from_pretrained(path)), or use "
                     "RopeEngine.from_pretrained(path).")
    if claimed:
        lines.append(
            "  " + ", ".join(info.label for info in claimed) + " lists this class but did not bind it; "
            "check the options passed to RopeEngine.from_processor."
        )
    else:
        lines.append(
            "  Install or repair the plugin for this family (`mmrope plugins` lists what is installed), "
            "or write one: see docs/plugin-authoring.md."
        )
    return "\n".join(lines)


def expect(ok: bool, info: PluginInfo, hook: str, what: str, result: Any) -> None:
    if not ok:
        raise PluginContractError(f"plugin {info.label} returned {type(result).__name__} from {hook}; expected {what}")
