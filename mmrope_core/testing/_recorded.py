"""Sequences whose positions a rollout engine's own code recorded (the plugins' ``*_cases.json``),
checked in the layouts a trainer hands over: padded on the left and on the right among the
others, and packed (``cu_seqlens`` and ``segment_ids``), through ``get_rope_index`` and
``compute_position_ids``; each must hold what was recorded for it alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..tiny import padded_batch


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One sequence: its tokens, which of them the rollout generated, and what was recorded."""

    input_ids: Sequence[int]
    generated: Sequence[int]
    positions: Sequence[Sequence[int]]  # (3, L)
    delta: float


def assert_batches_reproduce(engine: Any, recorded: Sequence[Recorded], kwargs: Mapping[str, Any],
                             multi_modal_inputs: Mapping[str, Any] | None = None,
                             mm_processor_kwargs: Mapping[str, Any] | None = None) -> None:
    """Raise ``AssertionError`` naming the layout and the sequence where ``engine`` does not give
    each of ``recorded`` its positions (and, but for ``segment_ids``, its delta). ``kwargs``: the
    ``get_rope_index`` keyword arguments of all sequences, their items in order;
    ``multi_modal_inputs``: the processor outputs ``compute_position_ids`` takes (``kwargs`` where
    None)."""
    inputs = kwargs if multi_modal_inputs is None else multi_modal_inputs
    lengths = [len(case.input_ids) for case in recorded]
    for left in (False, True):
        side = "left" if left else "right"
        ids, mask = padded_batch([case.input_ids for case in recorded], 0, left=left)
        generated, _ = padded_batch([case.generated for case in recorded], 0, left=left)
        positions, deltas = engine.get_rope_index(ids, mask, generated_mask=generated, **kwargs)
        four = engine.compute_position_ids(ids, mask, inputs, mm_processor_kwargs, generated_mask=generated)
        for k, case in enumerate(recorded):
            valid = mask[k].bool()
            assert positions[:, k, valid].tolist() == case.positions, f"padded on the {side}, sequence {k}"
            assert float(deltas[k, 0]) == case.delta, f"padded on the {side}, sequence {k}: delta"
            assert four[k, 1:, valid].tolist() == case.positions, f"padded on the {side}, sequence {k}: 4 rows"
    joined = torch.tensor([[token for case in recorded for token in case.input_ids]])
    joined_generated = torch.tensor([[flag for case in recorded for flag in case.generated]])
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    packed, packed_deltas = engine.get_rope_index(joined, cu_seqlens=bounds, generated_mask=joined_generated, **kwargs)
    segments = torch.repeat_interleave(torch.arange(1, len(recorded) + 1), torch.tensor(lengths))[None]
    by_segments = engine.compute_position_ids(joined, None, inputs, mm_processor_kwargs, segment_ids=segments,
                                              generated_mask=joined_generated)
    for k, case in enumerate(recorded):
        span = slice(int(bounds[k]), int(bounds[k + 1]))
        assert packed[:, 0, span].tolist() == case.positions, f"packed (cu_seqlens), sequence {k}"
        assert float(packed_deltas[k, 0]) == case.delta, f"packed (cu_seqlens), sequence {k}: delta"
        assert by_segments[0, 1:, span].tolist() == case.positions, f"packed (segment_ids), sequence {k}"
