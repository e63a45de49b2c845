"""What a collator's batch must hold for the fuzzer: each sample's tokens and labels where the
collator put them, there the positions the model computes for that sample alone (for a padded
batch, the model's own positions on the whole batch too), and each sample's media, unchanged, in
the sample's order, where the family's batching rule puts them (padding holding zeros or the
rule's empty items)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..batching import MediaKey
from ._direct import ModelPositions
from ._mutations import COLLATOR_CALLS

__all__ = ["COLLATOR_CALLS", "collated_problem", "media_of"]

IGNORE_INDEX = -100


def media_of(sample: Mapping[Any, Any]) -> dict[str, Any]:
    """A processor output's media: what is not a token row (ids, mask, labels, token types)."""
    return {key: value for key, value in sample.items() if isinstance(key, str) and value is not None
            and key not in ("input_ids", "attention_mask", "labels") and not key.endswith("token_type_ids")}


def collated_problem(samples: Sequence[Mapping[str, Any]], batch: Mapping[str, Any], collator: Any, own: Any,
                     failed: Callable[[BaseException], None]) -> str:
    """Where ``batch``, what ``collator`` made of ``samples``, does not hold them as they are;
    ``own`` gives the positions to hold it to (the model's, or the reference engine's; None:
    tokens and labels only). Where ``own`` fails, ``failed`` is told and the positions go unchecked."""
    from ..collators import PackedCollator

    ids, labels = batch["input_ids"], batch["labels"]
    positions = batch.get("position_ids")
    if positions is None:  # a model that counts its own (InstructBLIP-Video): checked as the engine gives them
        if collator.engine.batch_layout.takes_positions:
            return "the batch holds no position_ids"
        positions = collator.engine.compute_position_ids(ids, batch.get("attention_mask"), media_of(batch),
                                                         collator.mm_processor_kwargs)
    four_rows = positions.dim() == 3
    laid = positions.transpose(0, 1) if four_rows else positions  # (B, rows, L) or (B, L)
    exact = ids.dtype == torch.int64
    kwargs = collator.mm_processor_kwargs
    layout = collator.engine.batch_layout
    packed = isinstance(collator, PackedCollator)
    if packed and ("attention_mask" in batch or batch.get("use_cache") is not False):
        return "a packed row comes with an attention_mask, or without use_cache=False"
    if ids.shape[0] != (1 if packed else len(samples)):
        return f"{len(samples)} samples in {ids.shape[0]} rows"
    start = 0
    for index, sample in enumerate(samples):
        row = sample["input_ids"].reshape(-1)
        mask = sample.get("attention_mask")
        mask = torch.ones_like(row) if mask is None or packed else mask.reshape(-1)
        given = sample.get("labels")
        # as int64: -100 written into narrow ids (uint8) would wrap
        given = (row if given is None else given.reshape(-1)).long()
        if packed:
            where, span = 0, slice(start, start + row.numel())
            want_labels = torch.cat((torch.tensor([IGNORE_INDEX]), given[1:]))
        else:
            where = index
            span = slice(0, row.numel()) if collator.padding_side == "right" else slice(ids.shape[1] - row.numel(), None)
            want_labels = torch.where(mask.bool(), given, IGNORE_INDEX)
            if collator.padding_side == "left":  # no pad predicts the first token: alone, nothing does
                want_labels[0] = IGNORE_INDEX
            outside = torch.ones(ids.shape[1], dtype=torch.bool)
            outside[span] = False
            if bool(batch["attention_mask"][where, outside].any()) or \
                    not torch.equal(batch["attention_mask"][where, span].long(), mask.long()):
                return f"sample {index}'s attention_mask is not in row {where}"
        if not torch.equal(ids[where, span].long(), row.long()):
            return f"sample {index}'s input_ids are not at row {where}, tokens {span.start}..{span.stop}"
        if not torch.equal(labels[where, span].long(), want_labels.long()):
            return f"sample {index}'s labels are not its own (-100 where it has no loss) at row {where}"
        # at its valid tokens: what the model puts at padding depends on the batch (Qwen3-Omni's on its media)
        alone = _rows(layout, _positions(own, row[None], None if packed else mask[None], media_of(sample), kwargs,
                                         failed))
        valid = mask.bool()
        if alone is not None and not _same(laid[where, ..., span][..., valid], alone[0][..., valid], exact):
            return f"sample {index}'s positions differ from what the model computes for it alone"
        start = span.stop
    problem = _media_problem(samples, batch, layout, collator)
    if problem:
        return problem
    if packed:
        bounds = torch.tensor([0, *(sample["input_ids"].numel() for sample in samples)]).cumsum(0)
        if start != ids.shape[1] or not torch.equal(batch["cu_seq_lens_q"].long(), bounds):
            return f"cu_seq_lens_q {batch['cu_seq_lens_q'].tolist()} for samples ending at {bounds.tolist()}"
        return ""
    if not collator.engine.samples_independent:
        return ""  # the model's method numbers the batch's media in order: each sample alone is the reference
    whole = _rows(layout, _positions(own, ids, batch["attention_mask"], media_of(batch), kwargs, failed))
    if whole is not None and not _same(laid, whole, exact):
        return "the batch's positions differ from what the model computes on it"
    return ""


def _rows(layout: Any, positions: Any) -> Any:
    """Positions as the collators hand them to the model: M-RoPE ones without the text row, for a
    model that reads only its rotary rows; 1-D ones from the model's first position."""
    if positions is None:
        return positions
    if positions.dim() != 3:
        return positions + layout.first_position if layout.first_position else positions
    return positions if layout.text_positions else positions[:, 1:]


def _media_problem(samples: Sequence[Mapping[str, Any]], batch: Mapping[str, Any], layout: Any,
                   collator: Any) -> str:
    """Where a sample's media are not in the batch as they are, in order, by the key's rule."""
    keys = dict.fromkeys(key for sample in samples for key in media_of(sample))
    for key in keys:
        if key not in batch:
            return f"media key {key!r} of the samples is not in the batch"
        got, rule = batch[key], layout.media.get(key, MediaKey())
        values: list[tuple[int, Any]] = [(index, media_of(sample)[key]) for index, sample in enumerate(samples)
                                         if key in media_of(sample)]
        if not isinstance(got, torch.Tensor):
            if isinstance(got, list) and got != [item for _, value in values for item in value]:
                return f"{key!r}: the batch's list is not the samples' lists in order"
            continue
        if rule.join == "last":
            joined = torch.cat([value for _, value in values], dim=-1)
            if not _equal(got, joined):
                return f"{key!r}: not each sample's {tuple(values[0][1].shape[:-1])} strip joined on the last dim"
            continue
        offset = 0
        for index, value in values:
            rows = 1 if rule.items_dim is not None else value.shape[0]
            where = index if rule.items_dim is not None else offset
            if got.dim() != value.dim() or got.shape[0] < where + rows:
                return f"{key!r}: sample {index}'s {tuple(value.shape)} does not fit the batch's {tuple(got.shape)}"
            rows_of_sample = got[where:where + rows]
            if any(value.shape[dim] > rows_of_sample.shape[dim] for dim in range(1, value.dim())):
                return f"{key!r}: sample {index}'s {tuple(value.shape)} does not fit the batch's {tuple(got.shape)}"
            left = getattr(collator, "padding_side", "right") == "left"
            if not _equal(rows_of_sample, _padded_as_the_rule(value, rows_of_sample, rule, left)):
                return (f"{key!r}: sample {index}'s value is not at its place in the batch (rows {where}..{where + rows}), "
                        f"or its padding holds other than zeros (the rule's empty items in unfilled item slots)")
            offset += rows
        if rule.items_dim is None and offset != got.shape[0]:
            return f"{key!r}: the batch holds {got.shape[0]} rows for the samples' {offset}"
    return ""


def _padded_as_the_rule(value: torch.Tensor, rows: torch.Tensor, rule: MediaKey, left: bool) -> torch.Tensor:
    """The sample's rows as the batch must hold them: ``value`` at its place (the token dim at the
    end under left padding), zeros around it, the rule's empty items in the item slots it does not
    fill (padded before the dims after the items dim: there as wide as the sample)."""
    want = torch.zeros(rows.shape, dtype=value.dtype)

    def place(target: torch.Tensor, dims: range, widths: tuple[int, ...]) -> torch.Tensor:
        for dim in dims:
            start = target.shape[dim] - widths[dim] if left and dim == rule.token_dim else 0
            target = target.narrow(dim, start, widths[dim])
        return target

    if rule.items_dim is not None and rule.empty_item is not None and rows.shape[rule.items_dim] > value.shape[rule.items_dim]:
        filled = value.shape[rule.items_dim]
        slots = want.narrow(rule.items_dim, filled, rows.shape[rule.items_dim] - filled)
        slots = place(slots, range(rule.items_dim + 1, value.dim()), tuple(value.shape))
        slots.copy_(rule.empty_item(tuple(slots.shape), value.dtype))
    place(want, range(1, value.dim()), tuple(value.shape)).copy_(value)
    return want


def _equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(torch.equal(got, want.to(got.dtype)))


def _positions(own: Any, ids: torch.Tensor, mask: Any, media: dict[str, Any], kwargs: Any,
               failed: Callable[[BaseException], None]) -> Any:
    try:
        if isinstance(own, ModelPositions):
            return own.position_ids(ids, mask, media, kwargs)
        return None if own is None else own.compute_position_ids(ids, mask, media, kwargs)
    except Exception as exc:  # the model's own code fails: nothing to hold the collator to, counted
        failed(exc)
        return None


def _same(got: torch.Tensor, want: torch.Tensor, exact_dtype: bool) -> bool:
    return got.shape == want.shape and (got.dtype == want.dtype or not exact_dtype) and bool(
        torch.equal(got.double(), want.double()))
