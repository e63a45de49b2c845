"""Checking what the caller hands the engine, and read-only views of it for plugins."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ._names import misspelt
from .compiled import native
from .errors import InvalidInputError, UnknownInputKeyError
from .media import require_string_keys, require_values
from .packed_layout import PackedLayout


def as_batch(
    input_ids: Any, attention_mask: Any, *, tokens_in_every_row: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return ``(input_ids, attention_mask)`` as ``(B, L)`` tensors, raising :class:`InvalidInputError`
    for anything the engine cannot use. ``(L,)`` inputs become ``B = 1``; the mask becomes bool, and
    a missing one stays None (every token is valid). ``tokens_in_every_row`` is for an unpacked
    multimodal batch: a sample whose mask is all 0 is refused (multimodal RoPE has nothing to
    place there), and a mask in which every token is valid becomes None. The caller's tensors are
    never modified."""
    ids = _require_tensor("input_ids", input_ids)
    require_values("input_ids", ids)
    if ids.dtype not in _INTEGER_DTYPES:
        raise InvalidInputError(
            f"input_ids must hold integer token ids, got dtype {ids.dtype}; pass the tokenizer's "
            f"output or convert with .long()"
        )
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    elif ids.dim() != 2:
        raise InvalidInputError(
            f"input_ids must have shape (L,) or (B, L), got {tuple(ids.shape)}; "
            f"for packed or nested batches pass one (B, L) tensor"
        )
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise InvalidInputError(f"input_ids is empty (shape {tuple(ids.shape)}); pass at least one token")
    if ids.dtype in _NARROW_DTYPES:  # positions in the ids' dtype, as the references give them, would wrap
        ids = ids.long()
    if attention_mask is None:
        return ids, None
    mask = _require_tensor("attention_mask", attention_mask)
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)
    if mask.shape != ids.shape:
        raise InvalidInputError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has "
            f"{tuple(input_ids.shape)}; they must match token for token"
        )
    if mask.device != ids.device:
        raise InvalidInputError(
            f"attention_mask is on {mask.device} but input_ids on {ids.device}; move both to one device"
        )
    if mask.dtype != torch.bool and mask.dtype not in _INTEGER_DTYPES:
        raise InvalidInputError(f"attention_mask must be bool or integer 0/1, got dtype {mask.dtype}")
    if mask.dtype == torch.bool and not tokens_in_every_row:
        return ids, mask
    read = _read_cpu_mask if mask.is_cpu and native is not None else _read_device_mask
    return ids, read(mask, tokens_in_every_row)


def _read_device_mask(mask: torch.Tensor, tokens_in_every_row: bool) -> torch.Tensor | None:
    """The mask as bool after checking its values (None where every token is valid and
    ``tokens_in_every_row``), in torch passes over it."""
    if tokens_in_every_row and _all_ones(mask):
        return None  # means what no mask means, and spares the plugin its masked work
    largest = _largest_per_row(mask)
    if largest.tolist() != [1] * len(largest):  # (cheaper than two reductions for the few rows)
        _refuse_mask_values(mask, largest, tokens_in_every_row)
    return mask if mask.dtype == torch.bool else mask.bool()


def _read_cpu_mask(mask: torch.Tensor, tokens_in_every_row: bool) -> torch.Tensor | None:
    """:func:`_read_device_mask` for a CPU mask, in one compiled pass over it."""
    batch, length = mask.shape
    values = mask.contiguous().numpy()
    valid = torch.empty(mask.shape, dtype=torch.bool)
    assert native is not None  # the caller's choice: _read_device_mask otherwise
    all_ones, first_bad, first_empty_row = native.read_mask(values, values.itemsize, batch, length, valid.numpy(),
                                                            torch.get_num_threads())
    if first_bad >= 0:
        _refuse_mask_value(mask, *divmod(first_bad, length))
    if tokens_in_every_row:
        if all_ones:
            return None
        if first_empty_row >= 0:
            _refuse_empty_row(first_empty_row)
    return valid


def _refuse_mask_values(mask: torch.Tensor, largest: np.ndarray, tokens_in_every_row: bool) -> None:
    """Raise for a value other than 0 and 1, or, where each row needs a token, for an empty row."""
    if largest.max() > 1:
        _refuse_mask_value(mask, *((mask != 0) & (mask != 1)).nonzero()[0].tolist())
    if tokens_in_every_row:
        _refuse_empty_row(int(np.flatnonzero(largest == 0)[0]))


def _refuse_mask_value(mask: torch.Tensor, sample: int, position: int) -> None:
    raise InvalidInputError(
        f"attention_mask must hold only 0 and 1; sample {sample}, position {position} holds "
        f"{int(mask[sample, position])}. For packed rows use segment ids or cu_seqlens, not mask values"
    )


def _refuse_empty_row(sample: int) -> None:
    raise InvalidInputError(
        f"sample {sample} has no valid token (its attention_mask is all 0); "
        f"drop empty samples before computing positions"
    )


def _all_ones(mask: torch.Tensor) -> bool:
    """Every token valid, every value exactly 1. Padding shows at a row's first or last token in
    most batches, so those are read first."""
    if not mask[:, :: max(mask.shape[1] - 1, 1)].all():  # the first and last columns
        return False
    return bool(mask.all() if mask.dtype == torch.bool else (mask == 1).all())


def _largest_per_row(mask: torch.Tensor) -> np.ndarray:
    """Each row's largest value, negative values counting as larger than any other."""
    if mask.dtype == torch.bool:
        return mask.view(torch.uint8).amax(dim=1).cpu().numpy()
    low, high = torch.aminmax(mask, dim=1)
    return np.where(low.cpu().numpy() < 0, 2, high.cpu().numpy())


def _require_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    raise InvalidInputError(
        f"{name} must be a torch.Tensor, got {type(value).__name__}; "
        f"convert with torch.as_tensor({name}) or call the processor with return_tensors='pt'"
    )


_INTEGER_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_NARROW_DTYPES = frozenset({torch.int16, torch.int8, torch.uint8})


class ReadOnlyInputs(Mapping[str, Any]):
    """A read-only mapping over the caller's multimodal inputs.

    Tensors are copied on first access, so a plugin that writes into what it read cannot change
    the caller's data; tensors it never reads (pixel values) are never copied. It remembers the
    keys asked for, present or not, so that a misspelt key can be told from one nobody reads.
    """

    __slots__ = ("_asked", "_copies", "_read_all", "_source")

    def __init__(self, source: Mapping[str, Any] | None) -> None:
        self._source = source if source is not None else {}
        self._copies: dict[str, Any] = {}
        self._asked: set[Any] = set()
        self._read_all = False

    def __getitem__(self, key: str) -> Any:
        self._asked.add(key)
        if key not in self._copies:
            value = self._source[key]
            self._copies[key] = value.clone() if isinstance(value, torch.Tensor) else _frozen(value)
        return self._copies[key]

    def get(self, key: str, default: Any = None) -> Any:
        # Mapping.get would raise and catch a KeyError for every missing key
        self._asked.add(key)
        return self[key] if key in self._source else default

    def __contains__(self, key: object) -> bool:
        self._asked.add(key)
        return key in self._source

    def __iter__(self) -> Iterator[str]:
        self._read_all = True  # a reader that walks every key reads them all
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def __repr__(self) -> str:
        return f"ReadOnlyInputs({sorted(self._source)})"

    def refuse_misspelt_keys(self, name: str, reader: str) -> None:
        """Raise :class:`~mmrope_core.UnknownInputKeyError` for a key nobody asked for that
        resembles a key asked for and missing (``grid_thw`` where ``image_grid_thw`` was looked
        for); ``name`` is the mapping's name, ``reader`` who read it. Keys that resemble nothing
        read pass: processors return many that positions do not depend on."""
        if self._read_all:
            return
        missing = [key for key in self._asked if isinstance(key, str) and key not in self._source]
        if not missing:
            return
        for key in self._source:
            if key in self._asked or key in MODEL_INPUTS:
                continue
            meant = misspelt(key, missing)
            if meant:
                raise UnknownInputKeyError(
                    f"{name} holds {key!r}, which {reader} does not read: did you mean "
                    f"{' or '.join(map(repr, meant))}, which it looks for and did not find? Name the key as the "
                    f"processor's output does, or leave it out")


#: What processors return and models take besides the media: never a misspelt media key.
MODEL_INPUTS = frozenset({"input_ids", "attention_mask", "labels", "position_ids", "token_type_ids",
                           "mm_token_type_ids", "pixel_values", "pixel_values_videos"})


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    if isinstance(value, dict):
        return ReadOnlyInputs(value)
    return value


def read_generated_mask(value: Any, ids: torch.Tensor, mask: torch.Tensor | None,
                        layout: PackedLayout | None = None) -> torch.Tensor | None:
    """``generated_mask`` for the checked ``(B, L)`` ``ids`` and ``mask`` (and the packed
    ``layout``) as a bool ``(B, L)`` tensor, or None where it marks no token. Raises
    :class:`InvalidInputError` for a wrong type, dtype, shape, device or value, a 1 at padding (or
    outside every segment), and a 1 at a sample's (segment's) first token: a rollout generates
    after a prompt. The caller's tensor is never modified."""
    generated = _require_tensor("generated_mask", value)
    require_values("generated_mask", generated)
    if generated.dtype != torch.bool and generated.dtype not in _INTEGER_DTYPES:
        raise InvalidInputError(f"generated_mask must be bool or integer 0/1 (1 where the rollout generated the "
                                f"token), got dtype {generated.dtype}")
    if generated.dim() == 1:
        generated = generated.unsqueeze(0)
    if generated.shape != ids.shape:
        raise InvalidInputError(f"generated_mask has shape {tuple(value.shape)} but input_ids has {tuple(ids.shape)}; "
                                f"give one value per token, 1 where the rollout generated it")
    if generated.device != ids.device:
        raise InvalidInputError(f"generated_mask is on {generated.device} but input_ids on {ids.device}; move both "
                                f"to one device")
    if generated.dtype != torch.bool:
        generated = _flags(generated)
    if not _any(generated):
        return None
    length = ids.shape[1]
    if layout is None:  # each row's first valid token
        starts = np.arange(ids.shape[0]) * length
        if mask is not None:
            starts += mask.numpy().argmax(1) if mask.is_cpu else mask.view(torch.uint8).argmax(dim=1).cpu().numpy()
        outside, first_of = mask is not None and _any_outside(generated, mask), "sample {row}"
    else:  # (a token outside every segment is one the segments' tokens lack)
        starts = layout.starts
        outside = layout.gaps is not None and _count(generated) != _count(layout.joined(generated))
        first_of = "a segment (row {row}, token {token})"
    if outside:
        valid = layout.valid() if layout is not None else mask
        assert valid is not None
        row, token = (generated & ~valid).nonzero()[0].tolist()
        raise InvalidInputError(f"generated_mask marks sample {row}, token {token} as generated, but it is padding "
                                f"({'attention_mask' if layout is None else 'segment_ids'} 0); a padded token was not "
                                f"generated: mark it 0")
    if generated.is_cpu:
        at_first = generated.numpy().reshape(-1)[starts]
    else:
        at_first = generated.reshape(-1)[torch.from_numpy(starts).to(generated.device)].cpu().numpy()
    if at_first.any():
        row, token = divmod(int(starts[at_first.argmax()]), length)
        raise InvalidInputError(f"generated_mask marks the first token of {first_of.format(row=row, token=token)} as "
                                f"generated; a rollout generates after a prompt: mark the prompt's tokens 0")
    return generated


def _flags(values: torch.Tensor) -> torch.Tensor:
    """Integer ``generated_mask`` values as bool, after checking they are 0 and 1: in one compiled
    pass on the CPU."""
    if values.is_cpu and native is not None:
        host = values.contiguous().numpy()
        flags = torch.empty(values.shape, dtype=torch.bool)
        _, bad, _ = native.read_mask(host, host.itemsize, *values.shape, flags.numpy(), torch.get_num_threads())
        beyond = bad >= 0
    else:
        flags, beyond = values != 0, _beyond_one(values)
    if beyond:
        sample, token = ((values != 0) & (values != 1)).nonzero()[0].tolist()
        raise InvalidInputError(f"generated_mask must hold only 0 and 1; sample {sample}, token {token} holds "
                                f"{int(values[sample, token])}")
    return flags


def _any(values: torch.Tensor) -> bool:
    """Whether bool ``values`` hold a True: on the CPU in numpy, ten times torch's speed on a batch."""
    return bool(values.numpy().any()) if values.is_cpu else bool(values.any())


def _count(values: torch.Tensor) -> int:
    """How many bool ``values`` are True (numpy on the CPU, as :func:`_any`)."""
    return int(np.count_nonzero(values.numpy())) if values.is_cpu else int(values.sum())


def _any_outside(flags: torch.Tensor, valid: torch.Tensor) -> bool:
    """Whether bool ``flags`` are True where bool ``valid`` is False (numpy on the CPU, as :func:`_any`)."""
    if flags.is_cpu and valid.is_cpu:
        return bool(np.greater(flags.numpy(), valid.numpy()).any())
    return bool(torch.gt(flags, valid).any())


def _beyond_one(values: torch.Tensor) -> bool:
    """Whether integer ``values`` hold anything but 0 and 1: on the CPU in one numpy pass, negative
    values read as unsigned being larger than 1."""
    if values.is_cpu:
        host = values.numpy()
        return bool((host.view(host.dtype.str.replace("i", "u")) > 1).any())
    return bool(((values < 0) | (values > 1)).any())


def read_batch(input_ids: Any, attention_mask: Any, cu_seqlens: Any, segment_ids: Any, *,
                mrope: bool) -> tuple[torch.Tensor, torch.Tensor | None, PackedLayout | None]:
    """The checked ``(B, L)`` ids and mask, and the packed layout when the batch is packed."""
    packed = cu_seqlens is not None or segment_ids is not None
    for key, value in (("cu_seqlens", cu_seqlens), ("segment_ids", segment_ids)):
        if isinstance(value, torch.Tensor):
            require_values(key, value)
    ids, mask = as_batch(input_ids, attention_mask, tokens_in_every_row=mrope and not packed)
    if not packed:
        return ids, mask, None
    if cu_seqlens is not None and segment_ids is not None:
        raise InvalidInputError("pass either cu_seqlens or segment_ids, not both")
    if cu_seqlens is not None:
        if mask is not None and not bool(mask.all()):
            raise InvalidInputError("with cu_seqlens every token belongs to a segment: attention_mask must be all 1 "
                                    "or None; mark padding with segment_ids instead")
        return ids, None, PackedLayout.from_cu_seqlens(cu_seqlens, (ids.shape[0], ids.shape[1]), ids.device)
    layout = PackedLayout.from_segment_ids(segment_ids, (ids.shape[0], ids.shape[1]))
    if mask is not None and not torch.equal(mask, layout.valid()):
        raise InvalidInputError("attention_mask disagrees with segment_ids: a token is valid exactly when its "
                                "segment id is not 0; keep the mask 0/1 and the segments in segment_ids")
    return ids, None, layout


def require_mappings(multi_modal_inputs: Any, mm_processor_kwargs: Any) -> None:
    """Refuse a ``multi_modal_inputs`` or ``mm_processor_kwargs`` that is no mapping of names."""
    for key, value in (("multi_modal_inputs", multi_modal_inputs), ("mm_processor_kwargs", mm_processor_kwargs)):
        if value is not None and not isinstance(value, Mapping):
            raise InvalidInputError(f"{key} must be a dict of the processor's outputs (or None), got "
                                    f"{type(value).__name__}")
        if value is not None:
            require_string_keys(key, value)
