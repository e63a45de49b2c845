"""Packed cases for the fuzzer: samples laid out in rows (``cu_seqlens`` or ``segment_ids``), the
layouts a trainer may hand over (segments merged, boundaries moved, padding between segments,
other dtypes) and the corrupt ones it must be refused, and what each segment must hold: its
sample's positions alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ._mutations import REFUSED, Case, _ids_dtype, _keys_reversed, one_of

STYLES = ("cu_seqlens", "segment_ids")


@dataclasses.dataclass
class Segment:
    """One segment of a packed case: its tokens, and the media of the sample(s) it holds.

    ``exact`` is False for the pieces of a sample that a moved boundary cut: nothing is known of
    their positions but that the text row restarts. ``gap``: padding tokens before it in its row."""

    row: int
    ids: torch.Tensor  # (1, n)
    media: dict[str, Any]
    exact: bool = True
    gap: int = 0
    start: int = 0  # the column of its first token, set when laid out

    @property
    def length(self) -> int:
        return self.ids.shape[1]


@dataclasses.dataclass
class Packed:
    """How a packed case was laid out: its style, segments, padding token and row width. A case
    keeps it only while its ids, inputs and layout are as laid out here."""

    style: str
    segments: list[Segment]
    pad: int
    width: int
    ids: torch.Tensor  # the ids as laid out, int64


def packed_case(name: str, call: str, samples: Sequence[tuple[torch.Tensor, dict[str, Any]]], inputs: dict[str, Any],
                style: str, rows: int, pad: int, trailing: int, convention: str = "transformers") -> Case:
    """``samples`` (each ``(ids (1, n), media)``) packed into one row (``cu_seqlens``) or ``rows``
    rows of segments back to back (``segment_ids``) with ``trailing`` padding tokens after the
    longest; ``inputs``: the samples' media as one call takes them."""
    rows = 1 if style == "cu_seqlens" else max(1, min(rows, len(samples)))
    per_row = -(-len(samples) // rows)
    segments = [Segment(index // per_row, ids, media) for index, (ids, media) in enumerate(samples)]
    case = Case(name, call, None, None, inputs, {}, convention=convention)
    case.packed = Packed(style, segments, pad, 0, torch.empty(0))
    lay_out(case, trailing)
    return case


def lay_out(case: Case, trailing: int = 0) -> None:
    """Write the case's ids, packing (and mask, where it has one) from its segments."""
    packed = case.packed
    assert packed is not None
    ends: dict[int, int] = {}
    for segment in packed.segments:
        segment.start = ends.get(segment.row, 0) + segment.gap
        ends[segment.row] = segment.start + segment.length
    rows = max(ends) + 1
    if packed.style == "cu_seqlens":
        packed.width = ends[0]
    else:
        packed.width = max(packed.width, max(ends.values()) + trailing)
    ids = torch.full((rows, packed.width), packed.pad, dtype=torch.long)
    numbers = torch.zeros(rows, packed.width, dtype=torch.long)
    counts: dict[int, int] = {}
    for segment in packed.segments:
        counts[segment.row] = counts.get(segment.row, 0) + 1
        ids[segment.row, segment.start : segment.start + segment.length] = segment.ids[0]
        numbers[segment.row, segment.start : segment.start + segment.length] = counts[segment.row]
    packed.ids, case.ids = ids, ids
    if packed.style == "cu_seqlens":
        case.packing = {"cu_seqlens": torch.tensor([0, *(s.start + s.length for s in packed.segments)])}
    else:
        case.packing = {"segment_ids": numbers}
    if case.mask is not None:
        case.mask = (numbers > 0).long()


def merged_media(media: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several samples' media as one sample's: tensors concatenated on dim 0 (zero-padded on the
    others where they differ), lists joined, other values the first sample's."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(key for item in media for key, value in item.items() if value is not None):
        values = [item[key] for item in media if item.get(key) is not None]
        if all(isinstance(value, torch.Tensor) and value.dim() for value in values):
            sizes = [max(sizes) for sizes in zip(*(value.shape[1:] for value in values))]
            merged[key] = torch.cat([F.pad(value, [p for have, want in zip(reversed(value.shape[1:]), reversed(sizes))
                                                   for p in (0, want - have)]) for value in values])
        elif all(isinstance(value, list) for value in values):
            merged[key] = [item for value in values for item in value]
        else:
            merged[key] = values[0]
    return merged


# -- layouts a trainer may hand over: the segments' positions stay known --------------------------


def _neighbours(case: Case, choices: Any) -> int:
    """A segment followed by another in its row, with no padding between them."""
    segments = case.packed.segments
    return one_of(choices, [k for k in range(len(segments) - 1) if segments[k].row == segments[k + 1].row
                            and segments[k + 1].gap == 0])


def _merged(case: Case, choices: Any) -> str:
    k = _neighbours(case, choices)
    segments = case.packed.segments
    first, second = segments[k], segments[k + 1]
    segments[k : k + 2] = [Segment(first.row, torch.cat((first.ids, second.ids), dim=1),
                                   merged_media((first.media, second.media)), first.exact and second.exact, first.gap)]
    lay_out(case)
    return f"segments {k} and {k + 1} as one"


def _moved(case: Case, choices: Any) -> str:
    """A boundary between two segments moved into one of them: a sample cut in two."""
    k = _neighbours(case, choices)
    segments = case.packed.segments
    first, second = segments[k], segments[k + 1]
    both = torch.cat((first.ids, second.ids), dim=1)
    cut = choices.integer(1, both.shape[1] - 1)
    if cut == first.length:
        return "a boundary kept"
    segments[k : k + 2] = [Segment(first.row, both[:, :cut], {}, False, first.gap), Segment(first.row, both[:, cut:], {}, False)]
    lay_out(case)
    return f"the boundary after segment {k} moved by {cut - first.length}"


def _split(case: Case, choices: Any) -> str:
    """A boundary put inside a segment."""
    segments = case.packed.segments
    k = one_of(choices, [k for k, segment in enumerate(segments) if segment.length > 1])
    segment = segments[k]
    cut = choices.integer(1, segment.length - 1)
    segments[k : k + 1] = [Segment(segment.row, segment.ids[:, :cut], {}, False, segment.gap),
                           Segment(segment.row, segment.ids[:, cut:], {}, False)]
    lay_out(case)
    return f"segment {k} split at token {cut}"


def _padding_between(case: Case, choices: Any) -> str:
    if case.packed.style != "segment_ids":
        raise ValueError("cu_seqlens cover every token")
    segments = case.packed.segments
    k = choices.integer(0, len(segments) - 1)
    segments[k].gap += choices.integer(1, 3)
    lay_out(case)
    return f"padding before segment {k}"


def _packing_dtype(case: Case, choices: Any) -> str:
    key, value = next(iter(case.packing.items()))
    dtype = choices.choice((torch.int32, torch.int16, torch.uint8))
    if int(value.max()) > torch.iinfo(dtype).max:
        dtype = torch.int32
    case.packing = {key: value.to(dtype)}
    return f"{key} as {dtype}"


def _segment_ids_flat(case: Case, choices: Any) -> str:
    value = case.packing["segment_ids"]
    if value.shape[0] != 1:
        raise ValueError("rows")
    case.packing = {"segment_ids": value.reshape(-1)}
    return "segment_ids of shape (L,)"


def _with_mask(case: Case, choices: Any) -> str:
    numbers = case.packing.get("segment_ids")
    case.mask = torch.ones_like(case.ids) if numbers is None else (numbers > 0).long()
    return "the attention_mask the layout implies"


#: mutations that keep the layout valid and its segments' positions known
LAYOUTS: tuple[Callable[[Case, Any], str], ...] = (_merged, _moved, _split, _padding_between, _packing_dtype,
                                                    _segment_ids_flat, _with_mask)


# -- corrupt layouts: each must be refused --------------------------------------------------------


def _cu(change: Callable[[torch.Tensor, Case], Any]) -> Callable[[Case], None]:
    def corrupt(case: Case) -> None:
        case.packing = {"cu_seqlens": change(case.packing["cu_seqlens"].clone(), case)}
    return corrupt


def _ids(change: Callable[[torch.Tensor, Case], Any]) -> Callable[[Case], None]:
    def corrupt(case: Case) -> None:
        case.packing = {"segment_ids": change(case.packing["segment_ids"].clone(), case)}
    return corrupt


def _set(values: torch.Tensor, index: Any, value: int) -> torch.Tensor:
    values[index] = value
    return values


def _both(case: Case) -> None:
    case.packing = {"cu_seqlens": torch.tensor([0, case.ids.shape[1]]), "segment_ids": torch.ones_like(case.ids)}


def _cu_with_padding(case: Case) -> None:
    case.mask = torch.ones_like(case.ids)
    case.mask[0, -1] = 0


def _cu_two_rows(case: Case) -> None:
    case.ids = torch.cat((case.ids, case.ids))


def _mask_disagrees(case: Case) -> None:
    numbers = case.packing["segment_ids"]
    case.mask = torch.ones_like(numbers) if bool((numbers == 0).any()) else (numbers > 0).long()
    if not bool((numbers == 0).any()):
        case.mask[0, 0] = 0


def _hole(values: torch.Tensor, case: Case) -> torch.Tensor:
    """A token inside a segment marked as padding (or, in a segment of one token, the segment
    number skipped)."""
    long = [(row, column) for row, column in (values[:, 1:-1] > 0).nonzero().tolist()
            if values[row, column] == values[row, column + 2]]
    if long:
        row, column = long[0]
        values[row, column + 1] = 0
    else:
        values[values > 0] += 1
    return values


def _resumed(values: torch.Tensor, case: Case) -> torch.Tensor:
    """A row's last token holding segment 1 again after segment 1 ended (or a second row
    starting at segment 2)."""
    last = int((values[0] > 0).nonzero()[-1])
    if int(values[0, last]) > 1:
        values[0, last] = 1
    else:
        values[values > 0] += 1
    return values


#: (name, corruption) of every corrupt layout: each gives a typed error
CORRUPT: dict[str, tuple[tuple[str, Callable[[Case], None]], ...]] = {
    "cu_seqlens": (
        ("cu_seqlens from 1", _cu(lambda b, c: _set(b, 0, 1))),
        ("cu_seqlens short of the row", _cu(lambda b, c: _set(b, -1, int(b[-1]) - 1))),
        ("cu_seqlens past the row", _cu(lambda b, c: _set(b, -1, int(b[-1]) + 1))),
        ("cu_seqlens with a boundary twice", _cu(lambda b, c: torch.cat((b[:2], b[1:])))),
        ("cu_seqlens not increasing", _cu(lambda b, c: torch.cat((b[:1], b[-1:], b[1:])))),
        ("cu_seqlens negative", _cu(lambda b, c: torch.cat((b[:1], torch.tensor([-1]), b[1:])))),
        ("cu_seqlens ending at 2**62", _cu(lambda b, c: _set(b, -1, 2**62))),
        ("cu_seqlens as float", _cu(lambda b, c: b.float())),
        ("cu_seqlens of shape (1, K + 1)", _cu(lambda b, c: b[None])),
        ("cu_seqlens as a list", _cu(lambda b, c: b.tolist())),
        ("cu_seqlens empty", _cu(lambda b, c: b[:0])),
        ("cu_seqlens of one value", _cu(lambda b, c: b[:1])),
        ("cu_seqlens on meta", _cu(lambda b, c: b.to("meta"))),
        ("cu_seqlens and a mask with padding", _cu_with_padding),
        ("cu_seqlens and segment_ids", _both),
        ("cu_seqlens for two rows", _cu_two_rows),
    ),
    "segment_ids": (
        ("a negative segment id", _ids(lambda s, c: _set(s, (0, -1), -1))),
        ("a segment id of 2**40", _ids(lambda s, c: _set(s, (0, 0), 2**40))),
        ("a hole in a segment", _ids(_hole)),
        ("a segment resumed", _ids(_resumed)),
        ("segment_ids from 2", _ids(lambda s, c: s + (s > 0).long())),
        ("segment_ids as float", _ids(lambda s, c: s.float())),
        ("segment_ids one column short", _ids(lambda s, c: s[:, :-1])),
        ("segment_ids with a row more", _ids(lambda s, c: torch.cat((s, s)))),
        ("segment_ids of shape (1, B, L)", _ids(lambda s, c: s[None])),
        ("segment_ids all 0", _ids(lambda s, c: s * 0)),
        ("segment_ids as a list", _ids(lambda s, c: s.tolist())),
        ("segment_ids as a numpy array", _ids(lambda s, c: s.numpy())),
        ("segment_ids on meta", _ids(lambda s, c: s.to("meta"))),
        ("segment_ids and an attention_mask that disagrees", _mask_disagrees),
        ("segment_ids and cu_seqlens", _both),
    ),
}


def corrupted(case: Case, name: str, corruption: Callable[[Case], None]) -> str:
    """Apply one corruption of :data:`CORRUPT`; the layout is then no longer the case's."""
    corruption(case)
    case.packed = None
    return REFUSED + name


def _corrupt(case: Case, choices: Any) -> str:
    style = "cu_seqlens" if "cu_seqlens" in case.packing else "segment_ids"
    name, corruption = choices.choice(CORRUPT[style])
    return corrupted(case, name, corruption)


def layout_mutations(case: Case) -> list[Callable[[Case, Any], str]]:
    """What may change a packed case's layout now."""
    if case.packed is None or len(case.packing) != 1 or not isinstance(next(iter(case.packing.values())), torch.Tensor):
        return []
    return [*LAYOUTS, _corrupt, _corrupt]


# -- what a packed result must hold ---------------------------------------------------------------


def packed_problem(case: Case, got: Any, alone: Callable[[Segment], Any], exact_dtype: bool = True) -> str:
    """Where a packed result does not hold, segment by segment, what ``alone(segment)`` gives for
    its exact segments (None: nothing to compare; dtypes compared where ``exact_dtype``); the text
    row restarting at 0 in every segment; and, between segments, 1 in the text row and 0 in the
    others."""
    packed = case.packed
    assert packed is not None
    four_rows = case.call == "position_ids"
    positions = got if four_rows else got[0]
    if four_rows and positions.dim() == 2:  # 1-D RoPE: the text row alone
        positions = positions[:, None]
    rows = positions.shape[1] if four_rows else positions.shape[0]
    shape = (packed.ids.shape[0], rows, packed.width) if four_rows else (rows, packed.ids.shape[0], packed.width)
    if tuple(positions.shape) != shape:
        return f"positions of shape {tuple(positions.shape)} for a layout of {shape}"
    laid = positions if four_rows else positions.transpose(0, 1)  # (B, rows, L)
    inside = torch.zeros(laid.shape[0], laid.shape[2], dtype=torch.bool)
    for k, segment in enumerate(packed.segments):
        span = slice(segment.start, segment.start + segment.length)
        inside[segment.row, span] = True
        mine = laid[segment.row, :, span]
        if four_rows and not torch.equal(mine[0].long(), torch.arange(segment.length)):
            return f"segment {k}'s text row does not count 0, 1, ... from its first token"
        want = alone(segment) if segment.exact else None
        if want is None:
            continue
        expected = (want if want.dim() == 3 else want[:, None])[0] if four_rows else want[0][:, 0]
        if (exact_dtype and mine.dtype != expected.dtype) or not torch.equal(mine.double(), expected.double()):
            return f"segment {k} (row {segment.row}, tokens {span.start}..{span.stop - 1}) differs from its sample alone"
        if not four_rows and not torch.equal(got[1][k].double(), want[1][0].double()):
            return f"segment {k}'s delta {got[1][k].tolist()} differs from its sample alone's {want[1][0].tolist()}"
    fill = torch.zeros(laid.shape[1], dtype=laid.dtype)
    if four_rows and laid.shape[1] > 1:
        fill[0] = 1
    between = laid.transpose(1, 2)[~inside]  # (tokens outside segments, rows)
    if between.numel() and not bool((between == fill).all()):
        return f"tokens outside the segments hold {between[0].tolist()}, not {fill.tolist()}"
    if not four_rows and tuple(got[1].shape) != (len(packed.segments), 1):
        return f"deltas of shape {tuple(got[1].shape)} for {len(packed.segments)} segments"
    return ""


#: mutations after which each segment's positions are still its sample's alone
KEEPS_LAYOUT = frozenset((*LAYOUTS, _ids_dtype, _keys_reversed))
