"""Where a model config describes language-model layers: itself, the sub-models holding a
language model of their own, and their text configs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def text_configs(config: Any) -> Iterator[Any]:
    """The configs of ``config`` that describe language-model layers: itself, its sub-models that
    hold a language model of their own (:func:`nested_language_models`) and their ``text_config``."""
    seen: list[Any] = []
    pending = [config]
    while pending:
        current = pending.pop(0)
        if current is None or any(current is known for known in seen):
            continue
        seen.append(current)
        yield current
        pending += [*nested_language_models(current), getattr(current, "text_config", None)]


def nested_language_models(config: Any) -> list[Any]:
    """The sub-configs of ``config`` that hold a language model of their own (a ``text_config``),
    in the config's order: an Omni model's thinker (and Qwen3-Omni's talker, whose layers are
    checked too: refusing where it would mix segments is the safe answer)."""
    return [value for value in getattr(config, "__dict__", {}).values()
            if value is not config and hasattr(value, "to_dict") and hasattr(value, "text_config")]
