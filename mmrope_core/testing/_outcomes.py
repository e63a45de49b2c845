"""What the fuzzer calls on a case and how it judges what came back: the call itself, the
model's own result, comparisons, snapshots of the inputs, the cost of a call."""
from __future__ import annotations

import dataclasses
import resource
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import MmropeError
from ._collated import COLLATOR_CALLS
from ._direct import ModelPositions
from ._mutations import Case
from ._packed import (
    Segment,
)


def _call(engine: Any, case: Case) -> Any:
    if case.call == "batch":
        return engine.batch(iter(case.outputs))
    if case.call in COLLATOR_CALLS:
        return engine(case.outputs)
    if case.call == "position_ids":
        return engine.compute_position_ids(case.ids, case.mask, case.inputs, case.options or None, **case.packing)
    return engine.get_rope_index(case.ids, case.mask, **case.packing, **case.inputs)


def _kind(case: Case) -> str:
    """Which group of bases a case is drawn from (engine batches are drawn twice as often)."""
    if case.convention != "transformers":
        return case.convention
    if case.packing:
        return "packed"
    return "collator" if case.call in COLLATOR_CALLS else case.call if case.call == "batch" else "engine"


def _copied(base: Case) -> Case:
    """A case to mutate: its own dicts, lists and segments (tensors are never changed in place)."""
    packed = base.packed
    if packed is not None:
        packed = dataclasses.replace(packed, segments=[dataclasses.replace(s) for s in packed.segments])
    return dataclasses.replace(base, inputs=dict(base.inputs), options=dict(base.options), packing=dict(base.packing),
                               outputs=[dict(output) for output in base.outputs], packed=packed)


def _unpadded(ids: torch.Tensor, mask: Any) -> torch.Tensor:
    """A sample's valid tokens as ``(1, n)``."""
    flat = ids.reshape(-1)
    return (flat if mask is None else flat[mask.reshape(-1).bool()]).reshape(1, -1)


def _alone(subject: Any, case: Case, segment: Segment) -> Any:
    """What ``subject`` (an engine, or the model's own positions) gives a packed case's segment alone."""
    if isinstance(subject, ModelPositions):
        if case.call == "position_ids":
            return subject.position_ids(segment.ids, None, segment.media, case.options)
        return subject.rope_index(segment.ids, None, segment.media)
    if case.call == "position_ids":
        return subject.compute_position_ids(segment.ids, None, segment.media, case.options or None)
    return subject.get_rope_index(segment.ids, None, **segment.media)


def _judge(call: Callable[[], Any], failed: Callable[[BaseException], None]) -> Any:
    """The model's own result, or None where its code fails: no result to hold an engine to, which
    ``failed`` is told of (the fuzzer counts such cases, so that a check that never runs shows)."""
    try:
        return call()
    except Exception as exc:
        failed(exc)
        return None


def _laid_out(case: Case) -> bool:
    """The case's ids are still the ones its layout wrote (a narrow dtype may have wrapped them)."""
    ids = case.ids
    return (case.packed is not None and isinstance(ids, torch.Tensor) and ids.device.type != "meta"
            and ids.shape == case.packed.ids.shape and bool(torch.equal(ids.long(), case.packed.ids)))


def _int64_ids(case: Case) -> bool:
    return isinstance(case.ids, torch.Tensor) and case.ids.dtype == torch.int64


def _timed_media(case: Case) -> bool:
    """Whether the case holds a video or audio, where conventions may differ."""
    inputs = case.inputs if isinstance(case.inputs, Mapping) else {}

    def present(key: str) -> bool:
        value = inputs.get(key)
        return value is not None and (len(value) > 0 if isinstance(value, (list, tuple, np.ndarray)) else
                                      not isinstance(value, torch.Tensor) or value.numel() > 0)

    # the keys of videos and audio, by the media and roles their plugin declares
    timed = {key for key, rule in case.media.items()
             if rule.medium in ("video", "audio") or rule.role in ("audio_lengths", "audio_mask")}
    timed |= {rule.grid for rule in case.media.values() if rule.role in ("seconds", "stamps") and rule.grid is not None}
    return (any(present(key) for key in sorted(timed))
            or bool(inputs.get("use_audio_in_video")) or bool(case.options.get("use_audio_in_video")))


def _agrees(got: Any, want: Any, *, exact_dtype: bool) -> bool:
    """The same positions (and deltas): values and shapes, and dtypes where ``exact_dtype``."""
    if isinstance(got, tuple) or isinstance(want, tuple):
        return (isinstance(got, tuple) and isinstance(want, tuple) and len(got) == len(want)
                and all(_agrees(a, b, exact_dtype=exact_dtype) for a, b in zip(got, want)))
    return (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape == want.shape
            and (got.dtype == want.dtype or not exact_dtype) and bool(torch.equal(got.double(), want.double())))


def _batch_problem(outputs: list[dict[str, Any]], got: Any) -> str:
    """Where ``engine.batch``'s result does not hold each sample's ids, mask and media keys."""
    ids, mask, media = got
    for index, output in enumerate(outputs):
        row = output["input_ids"].reshape(-1)
        given = output.get("attention_mask")
        row_mask = torch.ones_like(row) if given is None else given.reshape(-1)
        for span in (slice(0, row.numel()), slice(ids.shape[1] - row.numel(), ids.shape[1])):
            if torch.equal(ids[index, span].long(), row.long()) and torch.equal(mask[index, span].long(), row_mask.long()):
                break
        else:
            return f"sample {index}'s ids or mask are not in row {index}"
    keys = {key for output in outputs for key, value in output.items()
            if value is not None and key not in ("input_ids", "attention_mask")}
    return "" if keys == set(media) else f"the media keys are {sorted(media)}, the samples hold {sorted(keys)}"


def _reference_failed(error: BaseException) -> bool:
    """A typed error the reference implementation raised because its own code failed on the input
    (chained from that failure): there is no reference result to hold the engine to."""
    return isinstance(error, MmropeError) and error.__cause__ is not None and not isinstance(
        error.__cause__, MmropeError)


def _in_range(result: Any) -> bool:
    """Positions between 0 and 2**62: none wrapped around or overflowed."""
    positions = (result[0] if isinstance(result, tuple) else result).double()
    return not positions.numel() or bool(((positions >= 0) & (positions < 2.0**62)).all())


def _as_int64(result: Any) -> Any:
    if isinstance(result, tuple):
        return tuple(_as_int64(item) for item in result)
    return result.long() if not result.dtype.is_floating_point else result


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # each is judged by the caller
        return exc


def _peak_memory() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- comparing ---------------------------------------------------------------------------------------

def _snapshot(case: Case, *, copied: bool = True) -> Any:
    """The case's arguments, copied (or, to compare a copy with, as they are now)."""
    return _copy((case.ids, case.mask, case.inputs, case.outputs, case.packing), copied)


def _copy(value: Any, copied: bool) -> Any:
    if isinstance(value, torch.Tensor):
        values = None if value.device.type == "meta" else value.detach()
        return ("tensor", value.device.type, value.dtype, tuple(value.shape),
                values.clone() if copied and values is not None else values)
    if isinstance(value, np.ndarray):
        return ("array", value.copy() if copied else value)
    if isinstance(value, Mapping):
        return ("dict", tuple((key, _copy(item, copied)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_copy(item, copied) for item in value))
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and bool(torch.equal(a, b) or (a.dtype.is_floating_point and torch.equal(
                    a.nan_to_num(), b.nan_to_num()))))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


def _equal(got: Any, want: Any) -> bool:
    if isinstance(got, tuple):
        return isinstance(want, tuple) and len(got) == len(want) and all(_equal(a, b) for a, b in zip(got, want))
    return (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.dtype == want.dtype
            and got.shape == want.shape and bool(torch.equal(got, want)))
