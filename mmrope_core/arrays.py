"""Small array helpers the engine and the kernels share: reading where values change, and a
few values of a tensor, on the CPU whatever the device (what they find is a handful of numbers)."""

from __future__ import annotations

import numpy as np
import torch

from .compiled import native


def numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array: a view on the CPU, a copy from other devices."""
    return tensor.numpy() if tensor.is_cpu else tensor.cpu().numpy()


def change_points(flat: np.ndarray | torch.Tensor) -> np.ndarray:
    """The indices p where ``flat[p] != flat[p + 1]``, which are few."""
    if isinstance(flat, np.ndarray):
        if flat.itemsize == 1 and native is not None:  # most words of eight bytes hold no change: one comparison each
            return np.frombuffer(native.changes(flat), dtype=np.int64)
        return (flat[1:] != flat[:-1]).nonzero()[0]
    return numpy(torch.nonzero(flat[1:] != flat[:-1]).squeeze(1))


def values_at(flat: np.ndarray | torch.Tensor, indices: np.ndarray) -> np.ndarray:
    """``flat[indices]`` as a numpy array on the CPU, whatever the device of ``flat``."""
    if isinstance(flat, torch.Tensor):
        if flat.device.type != "cpu":
            return numpy(flat.index_select(0, torch.from_numpy(indices).to(flat.device)))
        flat = flat.numpy()
    return flat[indices]
