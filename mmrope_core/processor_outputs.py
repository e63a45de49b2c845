"""Per-sample processor outputs merged into one batch (``engine.batch``, ``engine.collate``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .batching import MediaKey
from .errors import CollateError, a
from .media import require_string_keys, require_values

_ROWS = MediaKey()


def collate(samples: Iterable[Mapping[str, Any]], varlen_keys: Iterable[str] = (), *,
            token_aligned: Iterable[str] = (), padding_side: str = "right",
            media: Mapping[str, MediaKey] | None = None, lengths: Sequence[int] | None = None) -> dict[str, Any]:
    """Merge per-sample multimodal inputs into one batch.

    Tensors of ``varlen_keys`` are zero-padded at the end of every dimension but the first to
    the largest sample (for ``(N, L)`` masks and token types: the last dimension; for ``(N, T, F)``
    audio features: the time dimension too), then every tensor is concatenated on dim 0. Keys in
    ``token_aligned`` hold one value per token and are padded on ``padding_side``, as the tokens
    are. A key missing from some samples (a text-only sample has no ``pixel_values``) is
    concatenated over the samples that have it; a value of None counts as missing (a ``datasets``
    row holds None for a key its sample lacks). Lists are concatenated. Inputs are not modified.

    ``media`` maps keys the family's processor batches otherwise to their
    :class:`~mmrope_core.batching.MediaKey` (joined on the last dim, a row for every sample, a
    token dim padded as the ids are; a key declaring only its role is batched as the others);
    ``lengths``, each sample's token count, sizes the token dims of such keys to the batch's length.
    """
    samples = _listed(samples, "collate takes an iterable of per-sample dicts")
    if padding_side not in ("left", "right"):
        raise CollateError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    varlen, aligned = frozenset(varlen_keys), frozenset(token_aligned)
    rules = {key: rule for key, rule in (media or {}).items() if not rule.common_batching}
    keys: dict[str, None] = {}
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise CollateError(f"sample {index} is {a(type(sample).__name__)}, not a dict of multimodal inputs")
        require_string_keys(f"sample {index}", sample)
        keys.update(dict.fromkeys(key for key, value in sample.items() if value is not None))
    for key, rule in rules.items():
        _check_presence(key, rule, samples)
    return {key: _by_rule(key, samples, rules[key], padding_side, lengths) if key in rules
            else _merge(key, samples, key in varlen, padding_side == "left" and key in aligned) for key in keys}


def batch_processor_outputs(
    outputs: Iterable[Mapping[str, Any]],
    varlen_keys: Iterable[str] = (),
    *,
    pad_token_id: int = 0,
    padding_side: str = "right",
    media: Mapping[str, MediaKey] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Batch the outputs of one processor call per sample, as trainers do.

    Returns ``(input_ids, attention_mask, multi_modal_inputs)``: ids padded with ``pad_token_id``
    and masks with 0 on ``padding_side``, every other key through :func:`collate`; varlen keys
    holding one value per token (shaped like each sample's ``input_ids``) are padded on
    ``padding_side`` too, so that they stay in line with the tokens. ``media`` as in :func:`collate`.
    """
    if padding_side not in ("left", "right"):
        raise CollateError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    varlen_keys = frozenset(varlen_keys)
    outputs = _listed(outputs, "batch takes an iterable of per-sample processor outputs")
    if not outputs:
        raise CollateError("no samples to batch: pass one processor output per sample")
    rows = []
    for index, output in enumerate(outputs):
        if not isinstance(output, Mapping) or output.get("input_ids") is None:
            raise CollateError(f"sample {index} has no input_ids; pass the processor's outputs")
        ids = _token_row(index, "input_ids", output["input_ids"])
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise CollateError(f"sample {index}: input_ids must hold integer token ids, got {ids.dtype}; pass the "
                               f"tokenizer's ids")
        mask = output.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else _token_row(index, "attention_mask", mask)
        if mask.shape != ids.shape:
            raise CollateError(f"sample {index}: attention_mask has {mask.numel()} values for {ids.numel()} "
                               f"input_ids; pass one mask value per token")
        rows.append((ids, mask))
    length = max(ids.numel() for ids, _ in rows)
    # a dtype that holds every sample's values: the first sample's could wrap the others'
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=_common_dtype(ids for ids, _ in rows))
    attention_mask = torch.zeros(len(rows), length, dtype=_common_dtype(mask for _, mask in rows))
    for index, (ids, mask) in enumerate(rows):
        span = slice(length - ids.numel(), length) if padding_side == "left" else slice(0, ids.numel())
        input_ids[index, span] = ids
        attention_mask[index, span] = mask
    rest = [{key: value for key, value in output.items() if key not in ("input_ids", "attention_mask")}
            for output in outputs]
    # a varlen key shaped like every sample's input_ids (token types) is padded where its tokens are
    aligned = [key for key in varlen_keys
               if all(isinstance(extra.get(key), torch.Tensor) and extra[key].shape in ((1, ids.numel()), ids.shape)
                      for extra, (ids, _) in zip(rest, rows))]
    for extra in rest:
        extra.update({key: extra[key].reshape(1, -1) for key in aligned})
    return input_ids, attention_mask, collate(rest, varlen_keys, token_aligned=aligned, padding_side=padding_side,
                                              media=media, lengths=[length] * len(rows))


def _common_dtype(tensors: Iterable[torch.Tensor]) -> torch.dtype:
    return functools.reduce(torch.promote_types, (tensor.dtype for tensor in tensors))


def _listed(items: Any, what: str) -> list[Any]:
    """``items`` as a list, read once (a generator is consumed here and nowhere else)."""
    if isinstance(items, (Mapping, str, bytes, torch.Tensor)) or not isinstance(items, Iterable):
        raise CollateError(f"{what}, got {type(items).__name__}")
    return list(items)


def _token_row(index: int, key: str, value: Any) -> torch.Tensor:
    """One sample's ``(1, L)`` or ``(L,)`` ids or mask as its ``(L,)`` row."""
    if not isinstance(value, torch.Tensor):
        raise CollateError(f"sample {index}: {key} must be a (1, L) tensor, got {type(value).__name__}; call the "
                           f"processor with return_tensors='pt'")
    require_values(f"sample {index}: {key}", value)
    if value.dim() == 2 and value.shape[0] == 1:
        return value[0]
    if value.dim() != 1:
        raise CollateError(f"sample {index}: {key} must be (1, L) or (L,) per sample, got {tuple(value.shape)}; "
                           f"pass one processor output per sample")
    return value


def _merge(key: str, samples: Sequence[Mapping[str, Any]], varlen: bool, pad_left: bool) -> Any:
    present = [(index, sample[key]) for index, sample in enumerate(samples) if sample.get(key) is not None]
    values = [value for _, value in present]
    if all(isinstance(value, torch.Tensor) for value in values):
        return _cat(key, present, varlen, pad_left)
    if all(isinstance(value, (list, tuple)) for value in values):
        return [item for value in values for item in value]
    kinds = sorted({type(value).__name__ for value in values})
    raise CollateError(
        f"key {key!r} mixes or holds values that cannot be batched ({', '.join(kinds)}); "
        f"use tensors (return_tensors='pt') or lists for every sample"
    )


def _cat(key: str, present: list[tuple[int, torch.Tensor]], varlen: bool, pad_left: bool) -> torch.Tensor:
    tensors = [value for _, value in present]
    shapes = ", ".join(f"sample {index}: {tuple(value.shape)}" for index, value in present)
    if any(value.dim() == 0 for value in tensors):
        raise CollateError(f"key {key!r} holds a 0-d tensor, which has no batch dimension ({shapes})")
    if varlen:
        if len({value.dim() for value in tensors}) > 1:
            raise CollateError(f"varlen key {key!r} has tensors of different ranks ({shapes})")
        largest = [max(sizes) for sizes in zip(*(value.shape[1:] for value in tensors))]
        tensors = [_pad_to(value, largest, pad_left) for value in tensors]
    try:
        return torch.cat(tensors, dim=0)
    except RuntimeError as exc:
        hint = "" if varlen else "; if its last dimension varies per sample, a plugin must declare it in varlen_keys"
        raise CollateError(f"cannot concatenate key {key!r} on dim 0 ({shapes}){hint}") from exc


def _pad_to(value: torch.Tensor, sizes: list[int], pad_left: bool = False) -> torch.Tensor:
    padding: list[int] = []
    for have, want in zip(reversed(value.shape[1:]), reversed(sizes)):
        padding += [want - have, 0] if pad_left and not padding else [0, want - have]  # left: the last dim only
    return F.pad(value, padding) if any(padding) else value


# -- keys batched by their family's own rule -------------------------------------------------------


def _check_presence(key: str, rule: MediaKey, samples: Sequence[Mapping[str, Any]]) -> None:
    """A key the model places per row must be in every sample; one read for the whole batch must
    be the same in every sample, one whose padding the model reads of one shape."""
    held = [index for index, sample in enumerate(samples) if sample.get(key) is not None]
    if (rule.per_row or rule.all_or_none) and held and len(held) < len(samples):
        missing = next(index for index in range(len(samples)) if index not in held)
        why = (f"the model places each row's {key} itself (its text holds no placeholder), so every sample of a batch "
               f"needs one" if rule.per_row else
               f"the model reads a batch whose samples all hold {key} or none does, as its processor batches them")
        raise CollateError(f"sample {missing} has no {key!r}, which samples {held} hold: {why}; batch samples "
                           f"without it apart")
    switching = [index for index, sample in enumerate(samples) if sample.get(rule.switched_by or "") is not None]
    if rule.switched_by is not None and switching:
        for index in held:
            if index not in switching:
                raise CollateError(f"sample {index} holds {key!r} without {rule.switched_by!r}, which sample "
                                   f"{switching[0]} holds: the model takes {key} otherwise in a batch holding "
                                   f"{rule.switched_by}, so sample {index} would train otherwise than alone; batch "
                                   f"it apart from samples with {rule.switched_by}")
    values = [sample.get(key) for sample in samples]
    shapes = [(index, tuple(value.shape)) for index, value in enumerate(values) if isinstance(value, torch.Tensor)]
    other = next((item for item in shapes if item[1] != shapes[0][1]), None)
    if rule.one_shape and other is not None:
        raise CollateError(f"samples {shapes[0][0]} and {other[0]} hold {key!r} of shapes {shapes[0][1]} and {other[1]}, "
                           f"which one batch cannot hold: {rule.one_shape}; batch samples of one shape together "
                           f"(bucket them by length)")
    if rule.uniform and all(value is None or isinstance(value, torch.Tensor) for value in values):
        # other values are refused by the rule's batching, which names the tensors it needs
        first = values[0]
        for index, value in enumerate(values[1:], 1):
            same = (first is None and value is None) or (
                isinstance(first, torch.Tensor) and isinstance(value, torch.Tensor) and first.shape == value.shape
                and bool((first == value).all()))
            if not same:
                raise CollateError(f"samples 0 and {index} differ in {key!r} ({_shown(first)} and {_shown(value)}): "
                                   f"the model reads one {key} for the whole batch, as its processor batches only "
                                   f"such samples; batch samples of one kind together")


def _shown(value: Any) -> str:
    return "none" if value is None else str(value.tolist()) if isinstance(value, torch.Tensor) else type(value).__name__


def _by_rule(key: str, samples: Sequence[Mapping[str, Any]], rule: MediaKey, padding_side: str,
             lengths: Sequence[int] | None) -> torch.Tensor:
    present = [(index, sample[key]) for index, sample in enumerate(samples) if sample.get(key) is not None]
    shapes = ", ".join(f"sample {index}: {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                       else f"sample {index}: {type(value).__name__}" for index, value in present)
    if not all(isinstance(value, torch.Tensor) and value.dim() >= (2 if rule.join == "last" else 1)
               for _, value in present):
        raise CollateError(f"key {key!r} must hold a tensor of its sample's rows per sample ({shapes}); call the "
                           f"processor with return_tensors='pt'")
    if rule.indexes is not None:
        present = _shifted_indices(key, samples, rule.indexes, present)
    if rule.join == "last":
        if any(value.shape[0] != 1 for _, value in present) or len({value.shape[:-1] for _, value in present}) > 1:
            raise CollateError(f"key {key!r} joins each sample's (1, ..., W) on its last dim and needs the other "
                               f"dims equal ({shapes}); pass one processor output per sample")
        return torch.cat([value for _, value in present], dim=-1)
    rank = present[0][1].dim()
    if any(value.dim() != rank for _, value in present):
        raise CollateError(f"key {key!r} has tensors of different ranks ({shapes})")
    if (rule.token_dim is not None and rule.token_dim >= rank) or (rule.items_dim is not None and rule.items_dim >= rank):
        raise CollateError(f"key {key!r} has {rank} dims, fewer than its plugin's batching rule reads ({shapes})")
    tensors = dict(present)
    if rule.token_dim is not None and lengths is None and rule.items_dim is not None and len(tensors) < len(samples):
        raise CollateError(f"key {key!r} holds one entry per token, and a sample without it needs a row as long as "
                           f"its tokens: batch it with the token ids (engine.batch or a collator)")
    if rule.items_dim is not None:  # every sample gets a row: one holding no items where the sample has none
        template = present[0][1]
        for index in range(len(samples)):
            if index not in tensors:
                shape = [1, *template.shape[1:]]
                shape[rule.items_dim] = 0
                if rule.token_dim is not None and lengths is not None:
                    shape[rule.token_dim] = lengths[index]
                tensors[index] = template.new_zeros(shape)
    ordered = [tensors[index] for index in sorted(tensors)]
    sizes = [max(value.shape[dim] for value in ordered) for dim in range(rank)]
    if rule.token_dim is not None and lengths is not None:
        sizes[rule.token_dim] = max(lengths)
    padded = [_padded_by_rule(value, sizes, rule, padding_side) for value in ordered]
    return torch.cat(padded, dim=0)


def _shifted_indices(key: str, samples: Sequence[Mapping[str, Any]], indexed: str,
                     present: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """Each sample's indices into ``indexed`` shifted past the entries of the samples before it
    (new tensors: the samples keep theirs)."""
    offsets, offset = {}, 0
    for index, sample in enumerate(samples):
        offsets[index] = offset
        entries = sample.get(indexed)
        if entries is not None:
            if not isinstance(entries, torch.Tensor) or entries.dim() < 2:
                raise CollateError(f"sample {index}: {key!r} indexes the entries of {indexed!r}, which must be a "
                                   f"tensor of them; call the processor with return_tensors='pt'")
            offset += entries.shape[:-1].numel()
    return [(index, torch.where(value >= 0, value + offsets[index], value)) if isinstance(value, torch.Tensor)
            else (index, value) for index, value in present]


def _padded_by_rule(value: torch.Tensor, sizes: list[int], rule: MediaKey, padding_side: str) -> torch.Tensor:
    if rule.token_dim is not None and value.shape[rule.token_dim] > sizes[rule.token_dim]:
        raise CollateError(f"a sample's token dim holds {value.shape[rule.token_dim]} entries, more than the batch's "
                           f"{sizes[rule.token_dim]} tokens; pass each sample's own processor output")
    for dim in range(1, value.dim()):
        missing = sizes[dim] - value.shape[dim]
        if missing <= 0:
            continue
        shape = list(value.shape)
        shape[dim] = missing
        if dim == rule.items_dim and rule.empty_item is not None:
            fill = rule.empty_item(tuple(shape), value.dtype).to(value.device)
        else:
            fill = value.new_full(shape, rule.pad_value)
        left = dim == rule.token_dim and padding_side == "left"
        value = torch.cat([fill, value] if left else [value, fill], dim=dim)
    return value
