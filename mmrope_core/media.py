"""Reading the caller's media arrays: grids, seconds per grid, time stamps per frame, audio
lengths and audio masks.

A plugin declares what each of its family's media keys holds (a :class:`~mmrope_core.MediaKey`
``role`` in its ``batch_layout``); the engine reads every key so declared before a plugin's hook
or kernel sees it, so a bad array gets the same typed error in every family, third-party
plugins included. A reading checks type, dtype, shape, device and sign, and, given the batch's
token count, that the sizes fit the batch before anything is sized from them. Plugins may call
the readers themselves.

Example::

    grid = read_grid("image_grid_thw", torch.tensor([[1, 4, 4]]), tokens=input_ids.numel())
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import InvalidInputError, PlaceholderMismatchError, counted

if TYPE_CHECKING:
    from .batching import MediaKey

# A placeholder token stands for at most MERGE_BOUND**2 patches (merge sizes are 1 to 4 in
# practice), and for at most FRAMES_PER_AUDIO_TOKEN feature frames (the shipped families: 4 and ~8).
MERGE_BOUND = 32
FRAMES_PER_AUDIO_TOKEN = 64
#: Seconds per grid above this (12 days) would place temporal positions where int64 overflows.
MAX_SECONDS_PER_GRID = 2.0**20

_INTEGERS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                       torch.uint16, torch.uint32, torch.uint64})
_REALS = _INTEGERS | {torch.float64, torch.float32, torch.float16, torch.bfloat16}


def read_media(inputs: Mapping[str, Any], keys: Mapping[str, MediaKey], *, tokens: int | None = None) -> dict[str, Any]:
    """``inputs`` with every key that ``keys`` gives a role read as that role says (see the
    module); other keys as they are. ``keys``: a plugin's declared media keys
    (:attr:`BatchLayout.media <mmrope_core.BatchLayout.media>`). ``tokens``: the batch's token
    count, which bounds the sizes. Raises :class:`~mmrope_core.InvalidInputError` (or its
    subclass :class:`~mmrope_core.PlaceholderMismatchError` for sizes the batch cannot hold)."""
    require_string_keys("the multimodal inputs", inputs)
    read = dict(inputs)
    mask = next((key for key, rule in keys.items() if rule.role == "audio_mask"), None)  # what lengths sum
    for key, rule in keys.items():  # grids first: the seconds are counted against their grid's rows
        if rule.role == "grid" and (value := read.get(key)) is not None:
            read[key] = read_grid(key, value, tokens=tokens)
    for key, rule in keys.items():
        role = rule.role
        if role is None or role == "grid" or (value := read.get(key)) is None:
            continue
        if role == "seconds":
            grids = read.get(rule.grid or "")
            read[key] = read_seconds(key, value, videos=None if grids is None else grids.shape[0], grid=rule.grid)
        elif role == "stamps":
            grids = read.get(rule.grid or "")
            read[key] = read_stamps(key, value, frames=None if grids is None else grids[:, 0].tolist(), grid=rule.grid)
        elif role == "audio_lengths":
            read[key] = read_audio_lengths(key, value, tokens=tokens, mask=mask)
        else:
            read[key] = read_audio_mask(key, value)
    return read


def read_grid(key: str, value: Any, *, tokens: int | None = None) -> torch.Tensor | None:
    """An ``(N, 3)`` grid of positive ``(t, h, w)`` patch counts as int64, on its own device.

    Other integer dtypes are widened (the values are kept); floats, complex and bool are
    refused. With ``tokens``, the grids' frames and patches must fit in that many tokens."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        raise InvalidInputError(f"{key} must be a tensor of shape (N, 3), got {type(value).__name__}; "
                                f"convert with torch.as_tensor({key}) or use the processor's output")
    require_values(key, value)
    if value.dtype not in _INTEGERS or value.dim() != 2 or value.shape[1] != 3:
        raise InvalidInputError(f"{key} must be an integer tensor of shape (N, 3), got {value.dtype} "
                                f"{tuple(value.shape)}")
    host = value.numpy() if value.is_cpu and not value.requires_grad else value.detach().cpu().numpy()
    if host.size == 0:
        return value.long()
    if host.dtype != np.int64:  # products below must not wrap in a narrow dtype, nor a uint64 in int64
        host = np.minimum(host, 2**62).astype(np.int64) if host.dtype == np.uint64 else host.astype(np.int64)
    low, high, frames, patches = _grid_totals(host)
    if low <= 0:
        row = int(np.flatnonzero((host <= 0).any(axis=1))[0])
        raise InvalidInputError(f"{key} row {row} is {tuple(host[row].tolist())}: every size must be positive. "
                                f"Pass the processor's grids")
    if tokens is not None and (high >= 2**16 or len(host) >= 2**15 or frames > tokens
                               or patches > tokens * MERGE_BOUND**2):
        _refuse_sizes_beyond(key, host, tokens)
    return value if value.dtype == torch.int64 else value.long()


def _grid_totals(host: np.ndarray) -> tuple[int, int, int, int]:
    """The smallest and largest size of int64 grids, their frames and their patches. A few grids
    are summed in Python, whose integers cannot wrap, at a fraction of numpy's reductions' cost;
    more in numpy, whose sums cannot wrap where they are used (sizes below 2**16, fewer than 2**15
    grids: bigger grids are measured again in float64)."""
    if host.size <= 48:
        rows = host.tolist()
        return (min(min(row) for row in rows), max(max(row) for row in rows), sum(row[0] for row in rows),
                sum(row[0] * row[1] * row[2] for row in rows))
    return (int(host.min()), int(host.max()), int(host[:, 0].sum()),
            int((host[:, 0] * host[:, 1] * host[:, 2]).sum()))


def _refuse_sizes_beyond(key: str, host: np.ndarray, tokens: int) -> None:
    """Raise naming the first row where the grids' frames or patches outgrow ``tokens``: every
    frame takes a token, every token MERGE_BOUND**2 patches at most."""
    frames = np.cumsum(host[:, 0], dtype=np.float64)
    patches = np.cumsum(host.astype(np.float64).prod(axis=1))
    over = (frames > tokens) | (patches > float(tokens) * MERGE_BOUND**2)
    if over.any():
        row = int(over.argmax())
        raise PlaceholderMismatchError(
            f"{key} row {row} is {tuple(host[row].tolist())}: the grids up to it need more placeholder tokens "
            f"than the batch's {counted(tokens, 'token')} hold. The grid is corrupt or belongs to other "
            f"samples; pass the processor's grids for these samples")


def read_seconds(key: str, value: Any, *, videos: int | None = None, grid: str | None = None) -> torch.Tensor | None:
    """Seconds per video grid: finite, not negative, at most :data:`MAX_SECONDS_PER_GRID`, one
    per video where ``videos`` is given (the rows of the key ``grid``). A tensor keeps its dtype
    (the temporal rule depends on it); a list or number becomes float32, as processors return it."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        seconds = value
    elif isinstance(value, (list, tuple, int, float, np.ndarray, np.number)) and not isinstance(value, bool):
        given = _numbers(key, value, "iuf", "seconds per video grid")
        _check_seconds(key, given.astype(np.float64), videos, grid)  # before float32 could round or overflow them
        return torch.from_numpy(given.astype(np.float32).reshape(-1))
    else:
        raise InvalidInputError(f"{key} must be a tensor or list of seconds per video grid, got "
                                f"{type(value).__name__}; pass the processor's output")
    require_values(key, seconds)
    if seconds.dtype not in _REALS:
        raise InvalidInputError(f"{key} must hold real numbers (seconds per video grid), got {seconds.dtype}")
    if seconds.dim() != 1:
        seconds = seconds.reshape(-1)
    _check_seconds(key, seconds.detach().cpu().to(torch.float64).numpy(), videos, grid)
    return seconds


def _check_seconds(key: str, seconds: np.ndarray, videos: int | None, grid: str | None) -> None:
    if videos is not None and seconds.size != videos:
        raise InvalidInputError(f"{key} has {counted(seconds.size, 'value')} for {counted(videos, 'video')}"
                                f"{f' in {grid}' if grid else ''}; pass one value per video")
    if seconds.size:
        low, high = seconds.min(), seconds.max()
        if not (low >= 0 and high < np.inf):  # NaN fails both
            what = "a negative" if low < 0 else "a non-finite"
            raise InvalidInputError(f"{key} holds {what} value: {seconds.tolist()}")
        if high > MAX_SECONDS_PER_GRID:
            raise InvalidInputError(f"{key} holds {high:g} seconds per grid: temporal positions that far do not "
                                    f"fit int64. Pass the processor's timing (seconds per grid of frames)")


def read_stamps(key: str, value: Any, *, frames: list[int] | None = None, grid: str | None = None,
                ) -> torch.Tensor | None:
    """Time stamps of stamped grids' frames, in seconds from each grid's start, grid after grid:
    finite, from 0 to :data:`MAX_SECONDS_PER_GRID`, not decreasing within a grid, and, where
    ``frames`` (each grid's frames: the first column of the key ``grid``) is given, one a frame
    (without it, where each grid's begin is unknown, their order is not checked).
    A tensor keeps its dtype; a list or number becomes float32."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        require_values(key, value)
        if value.dtype not in _REALS:
            raise InvalidInputError(f"{key} must hold real numbers (a time stamp in seconds per frame), got "
                                    f"{value.dtype}; pass the processor's output")
        stamps = value.reshape(-1)
        host = stamps.detach().cpu().to(torch.float64).numpy()
    elif isinstance(value, (list, tuple, int, float, np.ndarray, np.number)) and not isinstance(value, bool):
        host = _numbers(key, value, "iuf", "time stamps in seconds, one per frame").astype(np.float64).reshape(-1)
        stamps = torch.from_numpy(host.astype(np.float32))
    else:
        raise InvalidInputError(f"{key} must be a tensor or list of time stamps in seconds, one per frame, got "
                                f"{type(value).__name__}; pass the processor's output")
    where = f" of {grid}" if grid else ""
    if frames is not None and host.size != sum(frames):
        raise InvalidInputError(f"{key} has {counted(host.size, 'time stamp')} for the {counted(sum(frames), 'frame')}"
                                f" of the {counted(len(frames), 'grid')}{where}; pass one time stamp per frame, grid "
                                f"after grid")
    bad = ~((host >= 0) & (host <= MAX_SECONDS_PER_GRID))  # NaN fails both
    grid_of = np.repeat(np.arange(len(frames)), frames) if frames is not None else np.zeros(host.size, np.int64)
    falls = np.flatnonzero((np.diff(host) < 0) & (grid_of[1:] == grid_of[:-1]) & (frames is not None))
    if bad.any() or falls.size:
        frame = int(np.flatnonzero(bad)[0]) if bad.any() else int(falls[0]) + 1
        item, value = int(grid_of[frame]), float(host[frame])
        first = int(np.searchsorted(grid_of, item))
        what = ("is negative" if value < 0 else "is not finite" if not np.isfinite(value) else
                f"lies beyond {MAX_SECONDS_PER_GRID:g} seconds" if bad[frame] else
                f"comes before the frame before it ({float(host[frame - 1])!r})")
        raise InvalidInputError(f"{key} (grid {item}{where}, frame {frame - first}): the time stamp {value!r} {what}; "
                                f"each grid's stamps are seconds from its start, finite, not negative and not "
                                f"decreasing: pass the processor's time stamps")
    return stamps


def _numbers(key: str, value: Any, kinds: str, what: str) -> np.ndarray:
    """A list or number as a numpy array of one of numpy's ``kinds`` (no bools, strings or objects)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged lists
        raise InvalidInputError(f"{key} must hold {what}, got {value!r}") from exc
    if array.dtype.kind not in kinds:
        raise InvalidInputError(f"{key} must hold {what}, got {value!r}")
    return array


def read_audio_lengths(key: str, value: Any, *, tokens: int | None = None, mask: str | None = None,
                       ) -> torch.Tensor | None:
    """Each audio's feature frames as a 1-D int64 tensor: integers, not negative and, with
    ``tokens``, no more frames than the batch's tokens can stand for. ``mask``: the key of the
    audio feature mask the lengths are the sums of, which the messages name."""
    if value is None:
        return None
    summed = f"{mask}.sum(-1)" if mask else "feature frames per audio"
    if not isinstance(value, torch.Tensor):
        value = torch.from_numpy(_numbers(key, value, "iu", f"integer feature lengths ({summed})"))
    require_values(key, value)
    if value.dtype not in _INTEGERS:
        raise InvalidInputError(f"{key} must hold integer feature lengths, got {value.dtype}; "
                                f"pass {summed if mask else 'the feature frames of each audio'}")
    host = value.detach().cpu().reshape(-1).numpy()  # (numpy: a tenth of torch's time on a few lengths)
    if host.size:
        low, high = float(host.min()), float(host.max())  # compared as floats: a uint64 cannot wrap
        if low < 0 or high > 2.0**62:
            raise InvalidInputError(f"{key} ({summed}) holds a negative or impossible length: "
                                    f"{host.tolist()}")
        if tokens is not None and high > FRAMES_PER_AUDIO_TOKEN * tokens + 4096:
            raise PlaceholderMismatchError(
                f"{key} holds {int(high)} feature frames, more than the batch's {counted(tokens, 'token')} can "
                f"stand for; pass {f'the {mask}' if mask else 'the audio lengths'} of these samples")
    return value.reshape(-1).long()


def read_audio_mask(key: str, value: Any) -> torch.Tensor:
    """An ``(N, frames)`` integer or bool audio feature mask, one row per audio."""
    if not isinstance(value, torch.Tensor):
        raise InvalidInputError(f"{key} must be a tensor of shape (audios, frames), got {type(value).__name__}; "
                                f"pass the processor's output with return_tensors='pt'")
    require_values(key, value)
    if value.dim() != 2 or not (value.dtype in _INTEGERS or value.dtype == torch.bool):
        raise InvalidInputError(f"{key} must be an integer or bool tensor of shape (audios, frames), one row per "
                                f"audio, got {value.dtype} {tuple(value.shape)}")
    return value


def require_string_keys(where: str, inputs: Mapping[Any, Any]) -> None:
    """Refuse a mapping with a key that is not a string: its keys name processor outputs or arguments."""
    for key in inputs:
        if not isinstance(key, str):
            raise InvalidInputError(f"{where} has the key {key!r} ({type(key).__name__}); keys must be strings "
                                    f"naming a processor output or argument")


def require_values(key: str, value: torch.Tensor) -> None:
    """Refuse a tensor whose values cannot be read: one on the meta device."""
    if value.device.type == "meta":
        raise InvalidInputError(f"{key} is on the meta device, which holds no values; pass a tensor with its "
                                f"values, on the CPU or the device of input_ids")
