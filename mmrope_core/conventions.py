"""Position conventions: whose positions a kernel reproduces.

``transformers`` (the default) is the installed transformers' own ``get_rope_index``, what the
model computes in training. A ``vllm-X.Y`` convention is what vLLM X.Y computes when it samples
a rollout; where the two differ, training on the rollout's positions keeps the response's rotary
angles those it was sampled with. A convention names the release whose rules it matches: when
vLLM changes them, a new name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .errors import UnknownConventionError

TRANSFORMERS = "transformers"
VLLM_0_33 = "vllm-0.33"

#: ``convention="vllm"`` means the newest vLLM convention mmrope knows.
ALIASES = {"vllm": VLLM_0_33}

KNOWN = (TRANSFORMERS, VLLM_0_33)


def convention(options: Mapping[str, Any], family: str, offered: Collection[str]) -> str:
    """The convention ``options`` ask for (``options["convention"]``, default ``transformers``),
    resolved from its alias, after checking that ``family`` offers it.

    Example::

        chosen = convention(options, "Qwen2-VL", (TRANSFORMERS, VLLM_0_33))
    """
    asked = options.get("convention", TRANSFORMERS)
    name = ALIASES.get(asked, asked)
    if name not in offered:
        what = f"unknown; {family} offers" if name not in KNOWN else f"not offered by {family}, which offers"
        raise UnknownConventionError(
            f"position convention {asked!r} is {what} {', '.join(repr(c) for c in offered)}"
            f"{' (vllm means ' + repr(ALIASES['vllm']) + ')' if VLLM_0_33 in offered else ''}"
        )
    return name


def described(name: str) -> str:
    """How a description names the convention: nothing for transformers'."""
    return "" if name == TRANSFORMERS else f", {name.replace('vllm-', 'vLLM ')} convention"
