"""Names a caller may have misspelt: keyword arguments a function does not take, and keys of the
multimodal inputs that resemble a key a family reads."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

from .errors import UnknownInputKeyError, UnknownKeywordError

_Function = TypeVar("_Function", bound=Callable[..., Any])
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def checked_keywords(function: _Function) -> _Function:
    """``function``, refusing a keyword argument it does not take with an
    :class:`~mmrope_core.UnknownKeywordError` that names it and the keyword probably meant
    (instead of Python's bare ``TypeError``)."""
    parameters = inspect.signature(function).parameters
    taken = [name for name, parameter in parameters.items() if parameter.kind in _KEYWORD_KINDS and name != "self"]
    known = frozenset(taken)

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not known.issuperset(kwargs):
            unknown = next(name for name in kwargs if name not in known)
            meant = closest(unknown, taken)
            hint = f"; did you mean {meant!r}?" if meant else "."
            raise UnknownKeywordError(f"{function.__qualname__}() got an unknown keyword argument {unknown!r}{hint} "
                                      f"It takes {', '.join(taken)}")
        return function(*args, **kwargs)

    return checked  # type: ignore[return-value]


def refuse_misspelt_keywords(function: str, given: Iterable[Any], own: Sequence[str], reads: Collection[str],
                             skipped: Collection[str] = ()) -> None:
    """Refuse a keyword of ``function`` that is neither its ``own`` nor one its kernel ``reads``
    but resembles one of them (``cu_seqlen``, ``second_per_grid_t``): an
    :class:`~mmrope_core.UnknownKeywordError` or :class:`~mmrope_core.UnknownInputKeyError` naming
    both. Keywords that resemble none (and ``skipped``) pass, as the family's reference lets them."""
    for key in given:
        if not isinstance(key, str) or key in own or key in reads or key in skipped:
            continue
        meant = misspelt(key, own)
        if meant:
            raise UnknownKeywordError(f"{function}() got an unknown keyword argument {key!r}; did you mean "
                                      f"{meant[0]!r}? It takes {', '.join(own)} and the family's inputs")
        meant = misspelt(key, reads)
        if meant:
            raise UnknownInputKeyError(f"{function}() got {key!r}, which the family's kernel does not read: did you "
                                       f"mean {' or '.join(map(repr, meant))}? Name it as the family's get_rope_index "
                                       f"does, or leave it out")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` most resembles (a typo, a missing prefix or suffix), or None."""
    known = list(known)
    strict = misspelt(name, known)
    if strict:
        return strict[0]
    loose = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return loose[0] if loose else None


def misspelt(name: str, known: Iterable[str]) -> list[str]:
    """The names of ``known`` that ``name`` is probably a misspelling of, fewest edits away."""
    return nearest(name, [candidate for candidate in known if resembles(name, candidate)])


def nearest(name: str, known: Iterable[str]) -> list[str]:
    """Those of ``known`` fewest edits away from ``name``, sorted (several where they tie)."""
    distances = {candidate: _distance(name, candidate) for candidate in known}
    best = min(distances.values(), default=None)
    return sorted(candidate for candidate, distance in distances.items() if distance == best)


@functools.lru_cache(maxsize=4096)  # the same keys come back with every batch
def resembles(name: str, known: str) -> bool:
    """Whether ``name`` is probably ``known`` misspelt: the same but for case, one or two typos
    (one in a short name, none in a name of four letters or fewer), or ``known`` without a leading or trailing word (``grid_thw`` for
    ``image_grid_thw``, ``image_grid`` for it too)."""
    if name == known:
        return False
    if name.lower() == known.lower():
        return True
    if "_" in name and (known.endswith("_" + name) or known.startswith(name + "_")):
        return True
    return len(known) > 4 and _distance(name, known) <= (1 if len(known) <= 8 else 2)


def _distance(a: str, b: str) -> int:
    """Edits (insertions, deletions, substitutions, swaps of neighbours) from ``a`` to ``b``."""
    if abs(len(a) - len(b)) > 2:
        return 3  # more than any resemblance allows; spares the table
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]
