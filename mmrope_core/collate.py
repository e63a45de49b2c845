"""Batching per-sample multimodal inputs."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .errors import CollateError, a
from .media import require_string_keys, require_values


def collate(samples: Iterable[Mapping[str, Any]], varlen_keys: Iterable[str] = (), *,
            token_aligned: Iterable[str] = (), padding_side: str = "right") -> dict[str, Any]:
    """Merge per-sample multimodal inputs into one batch.

    Tensors of ``varlen_keys`` are zero-padded at the end of every dimension but the first to
    the largest sample (for ``(N, L)`` masks and token types: the last dimension; for ``(N, T, F)``
    audio features: the time dimension too), then every tensor is concatenated on dim 0. Keys in
    ``token_aligned`` hold one value per token and are padded on ``padding_side``, as the tokens
    are. A key missing from some samples (a text-only sample has no ``pixel_values``) is
    concatenated over the samples that have it; a value of None counts as missing (a ``datasets``
    row holds None for a key its sample lacks). Lists are concatenated. Inputs are not modified.
    """
    samples = _listed(samples, "collate takes an iterable of per-sample dicts")
    if padding_side not in ("left", "right"):
        raise CollateError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    varlen, aligned = frozenset(varlen_keys), frozenset(token_aligned)
    keys: dict[str, None] = {}
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise CollateError(f"sample {index} is {a(type(sample).__name__)}, not a dict of multimodal inputs")
        require_string_keys(f"sample {index}", sample)
        keys.update(dict.fromkeys(key for key, value in sample.items() if value is not None))
    return {key: _merge(key, samples, key in varlen, padding_side == "left" and key in aligned) for key in keys}


def batch_processor_outputs(
    outputs: Iterable[Mapping[str, Any]],
    varlen_keys: Iterable[str] = (),
    *,
    pad_token_id: int = 0,
    padding_side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Batch the outputs of one processor call per sample, as trainers do.

    Returns ``(input_ids, attention_mask, multi_modal_inputs)``: ids padded with ``pad_token_id``
    and masks with 0 on ``padding_side``, every other key through :func:`collate`; varlen keys
    holding one value per token (shaped like each sample's ``input_ids``) are padded on
    ``padding_side`` too, so that they stay in line with the tokens.
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
    return input_ids, attention_mask, collate(rest, varlen_keys, token_aligned=aligned, padding_side=padding_side)


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
