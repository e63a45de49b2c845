"""Batching per-sample multimodal inputs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .errors import CollateError


def collate(samples: Sequence[Mapping[str, Any]], varlen_keys: Iterable[str] = ()) -> dict[str, Any]:
    """Merge per-sample multimodal inputs into one batch.

    Tensors of ``varlen_keys`` are zero-padded at the end of every dimension but the first to
    the largest sample (for ``(N, L)`` masks and token types: the last dimension; for ``(N, T, F)``
    audio features: the time dimension too), then every tensor is concatenated on dim 0. A key missing from some samples (a text-only
    sample has no ``pixel_values``) is concatenated over the samples that have it. Lists are
    concatenated. Inputs are not modified.
    """
    if isinstance(samples, Mapping) or not isinstance(samples, Sequence):
        raise CollateError(f"collate takes a list of per-sample dicts, got {type(samples).__name__}")
    varlen = frozenset(varlen_keys)
    keys: dict[str, None] = {}
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise CollateError(f"sample {index} is a {type(sample).__name__}, not a dict of multimodal inputs")
        keys.update(dict.fromkeys(sample))
    return {key: _merge(key, samples, key in varlen) for key in keys}


def _merge(key: str, samples: Sequence[Mapping[str, Any]], varlen: bool) -> Any:
    present = [(index, sample[key]) for index, sample in enumerate(samples) if key in sample]
    values = [value for _, value in present]
    if all(isinstance(value, torch.Tensor) for value in values):
        return _cat(key, present, varlen)
    if all(isinstance(value, (list, tuple)) for value in values):
        return [item for value in values for item in value]
    kinds = sorted({type(value).__name__ for value in values})
    raise CollateError(
        f"key {key!r} mixes or holds values that cannot be batched ({', '.join(kinds)}); "
        f"use tensors (return_tensors='pt') or lists for every sample"
    )


def _cat(key: str, present: list[tuple[int, torch.Tensor]], varlen: bool) -> torch.Tensor:
    tensors = [value for _, value in present]
    shapes = ", ".join(f"sample {index}: {tuple(value.shape)}" for index, value in present)
    if any(value.dim() == 0 for value in tensors):
        raise CollateError(f"key {key!r} holds a 0-d tensor, which has no batch dimension ({shapes})")
    if varlen:
        if len({value.dim() for value in tensors}) > 1:
            raise CollateError(f"varlen key {key!r} has tensors of different ranks ({shapes})")
        largest = [max(sizes) for sizes in zip(*(value.shape[1:] for value in tensors))]
        tensors = [_pad_to(value, largest) for value in tensors]
    try:
        return torch.cat(tensors, dim=0)
    except RuntimeError as exc:
        hint = "" if varlen else "; if its last dimension varies per sample, a plugin must declare it in varlen_keys"
        raise CollateError(f"cannot concatenate key {key!r} on dim 0 ({shapes}){hint}") from exc


def _pad_to(value: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    padding = []
    for have, want in zip(reversed(value.shape[1:]), reversed(sizes)):
        padding += [0, want - have]
    return F.pad(value, padding) if any(padding) else value
