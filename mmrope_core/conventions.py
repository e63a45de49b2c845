"""Position conventions: whose positions a kernel reproduces.

``transformers`` (the default) is the installed transformers' own ``get_rope_index``, what the
model computes in training. A ``vllm-X.Y`` or ``sglang-X.Y.Z`` convention is what that rollout
engine's release gives each token when it samples a rollout; where it differs from transformers,
training on the rollout's positions keeps the response's rotary angles those it was sampled with.
A convention names the release whose rules it matches: a later release whose rules were measured
unchanged gets a name of its own that computes the same (:data:`SAME_RULES`); one that changes
them, a new convention.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from .errors import UnknownConventionError

TRANSFORMERS = "transformers"
VLLM_0_33 = "vllm-0.33"
VLLM_0_34 = "vllm-0.34"
SGLANG_0_5_23 = "sglang-0.5.23"

#: Releases whose position rules are an earlier release's (compared on their code): accepted
#: wherever that release's convention is offered, with the same positions.
SAME_RULES = {VLLM_0_34: VLLM_0_33}

#: ``convention="vllm"`` and ``convention="sglang"`` mean the newest release mmrope knows.
ALIASES = {"vllm": VLLM_0_34, "sglang": SGLANG_0_5_23}

KNOWN = (TRANSFORMERS, VLLM_0_33, VLLM_0_34, SGLANG_0_5_23)

_LABELS = {"vllm": "vLLM", "sglang": "SGLang"}


def asked(options: Mapping[str, Any]) -> str:
    """The release ``options["convention"]`` names (default ``transformers``), its alias
    resolved; raises :class:`~mmrope_core.UnknownConventionError` for a name mmrope does not know."""
    name = _named(options)
    if not isinstance(name, str) or ALIASES.get(name, name) not in KNOWN:
        raise UnknownConventionError(f"position convention {name!r} is unknown; the known ones are {_listed(KNOWN)}")
    return ALIASES.get(name, name)


def known(name: str | None, where: str) -> str | None:
    """``name`` itself where mmrope knows it (a release, an alias, or None for the default);
    raises :class:`~mmrope_core.UnknownConventionError` naming ``where`` it was given
    (``"install(convention=...)"``, an environment variable) and the known conventions."""
    if name is None or (isinstance(name, str) and ALIASES.get(name, name) in KNOWN):
        return name
    raise UnknownConventionError(f"position convention {name!r} ({where}) is unknown; the known ones are "
                                 f"{_listed(KNOWN)}")


def rules(name: str) -> str:
    """The convention whose rules the release ``name`` follows (itself, or see :data:`SAME_RULES`)."""
    return SAME_RULES.get(name, name)


def convention(options: Mapping[str, Any], family: str, offered: Collection[str],
               missing: Mapping[str, str] | None = None) -> str:
    """The rules of the convention ``options`` ask for (``options["convention"]``, default
    ``transformers``): its alias and :data:`SAME_RULES` resolved, after checking that ``family``
    offers them. ``missing`` says why the family lacks a known convention, by name.

    Example::

        chosen = convention(options, "Qwen2.5-Omni", (TRANSFORMERS, VLLM_0_33),
                            missing={SGLANG_0_5_23: "SGLang 0.5.23 has no Qwen2.5-Omni model"})
    """
    name = _named(options)
    release = ALIASES.get(name, name) if isinstance(name, str) else name
    followed = rules(release) if isinstance(release, str) else release
    if followed in offered:
        return followed
    accepted = [known for known in KNOWN if rules(known) in offered]
    if release not in KNOWN:
        raise UnknownConventionError(f"position convention {name!r} is unknown; {family} offers {_listed(accepted)}")
    why = (missing or {}).get(followed)
    raise UnknownConventionError(f"position convention {name!r} is not offered by {family}"
                                 f"{f' ({why})' if why else ''}; it offers {_listed(accepted)}")


def described(name: str) -> str:
    """How a description names the convention ``name`` (a release): nothing for transformers'."""
    if name == TRANSFORMERS:
        return ""
    same = f" (the rules of {label(rules(name))})" if rules(name) != name else ""
    return f", {label(name)} convention{same}"


def label(name: str) -> str:
    """A release as prose: ``"vLLM 0.33"``, ``"SGLang 0.5.23"``."""
    engine, _, release = name.partition("-")
    return f"{_LABELS.get(engine, engine)} {release}".strip()


def _named(options: Mapping[str, Any]) -> Any:
    """``options["convention"]``, None (or absent) meaning transformers'."""
    name = options.get("convention")
    return TRANSFORMERS if name is None else name


def _listed(names: Collection[str]) -> str:
    aliases = [f"{alias} means {release!r}" for alias, release in ALIASES.items() if release in names]
    return ", ".join(repr(name) for name in names) + (f" ({'; '.join(aliases)})" if aliases else "")
