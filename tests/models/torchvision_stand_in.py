"""Real image processors that need torchvision, run on torch kernels where the tests have none.

Some model types ship only a torchvision image processor (a ``TorchvisionBackend``), and the
tests run without torchvision. :func:`image_processor_class` gives the real class with only the
torchvision kernels it calls (resize, pad, crop, normalize, colour conversions: the
``torchvision.transforms.v2.functional`` it imports as ``tvF``) replaced by the torch ones of
:data:`FUNCTIONAL`. Everything else is the real processor's own code: how it plans tiles and
crops, how many tokens each image gets, which keys it returns, their shapes, dtypes and how it
batches them. Only pixel values can differ from torchvision's, by resampling (antialiased
bilinear and bicubic interpolation as torch computes them)::

    StepImageProcessor = image_processor_class("step3p7", "Step3p7ImageProcessor")
    outputs = StepImageProcessor(size={"height": 56, "width": 56})(images, return_tensors="pt")

With torchvision installed the real class is returned as it is.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F


class InterpolationMode(enum.Enum):
    """torchvision's interpolation modes, by the names transformers reads."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


#: The modes torch's interpolate has; the others resample as the nearest of these.
_TORCH_MODES = {"box": "bilinear", "hamming": "bilinear", "lanczos": "bicubic"}


def resize(image: torch.Tensor, size: Sequence[int] | int, interpolation: Any = InterpolationMode.BILINEAR,
           antialias: bool = True, **_: Any) -> torch.Tensor:
    """``image`` (..., C, H, W) resized to ``size`` (height, width), or its shorter side to ``size``."""
    height, width = image.shape[-2:]
    if isinstance(size, int) or len(size) == 1:
        short = size if isinstance(size, int) else size[0]
        scale = short / min(height, width)
        size = (short, int(width * scale)) if height <= width else (int(height * scale), short)
    mode = getattr(interpolation, "value", interpolation) or "bilinear"
    mode = _TORCH_MODES.get(mode, mode)
    flat = image.reshape(-1, *image.shape[-3:])
    values = flat.float() if not flat.is_floating_point() else flat
    smooth = {"antialias": antialias} if mode in ("bilinear", "bicubic") else {}
    aligned = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
    out = F.interpolate(values, size=tuple(size), mode=mode, **smooth, **aligned)
    if image.dtype == torch.uint8:
        out = out.round().clamp(0, 255).to(torch.uint8)
    return out.reshape(*image.shape[:-2], *out.shape[-2:])


def pad(image: torch.Tensor, padding: Sequence[int] | int, fill: Any = 0, padding_mode: str = "constant",
        **_: Any) -> torch.Tensor:
    """``image`` padded by ``padding``: all sides, (left/right, top/bottom) or (left, top, right, bottom)."""
    sides = [padding] * 4 if isinstance(padding, int) else list(padding)
    if len(sides) == 1:
        sides *= 4
    elif len(sides) == 2:
        sides = [sides[0], sides[1], sides[0], sides[1]]
    left, top, right, bottom = sides
    if padding_mode != "constant":
        mode = {"edge": "replicate"}.get(padding_mode, padding_mode)
        flat = image.reshape(-1, *image.shape[-3:])
        out = F.pad(flat.float(), (left, right, top, bottom), mode=mode).to(image.dtype)
        return out.reshape(*image.shape[:-2], *out.shape[-2:])
    fills = list(fill) if isinstance(fill, (list, tuple)) else [fill or 0]
    out = image.new_empty((*image.shape[:-2], image.shape[-2] + top + bottom, image.shape[-1] + left + right))
    for channel in range(image.shape[-3]):  # one fill per channel, or one for all
        out[..., channel, :, :] = fills[channel % len(fills)]
    out[..., top:top + image.shape[-2], left:left + image.shape[-1]] = image
    return out


def crop(image: torch.Tensor, top: int, left: int, height: int, width: int) -> torch.Tensor:
    return image[..., top:top + height, left:left + width]


def normalize(image: torch.Tensor, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> torch.Tensor:
    mean = torch.as_tensor(mean, dtype=image.dtype, device=image.device).reshape(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype, device=image.device).reshape(-1, 1, 1)
    return (image - mean) / std


def grayscale_to_rgb(image: torch.Tensor) -> torch.Tensor:
    return image.expand(*image.shape[:-3], 3, *image.shape[-2:]).clone() if image.shape[-3] == 1 else image


def rgb_to_grayscale(image: torch.Tensor, num_output_channels: int = 1) -> torch.Tensor:
    weights = torch.tensor([0.2989, 0.587, 0.114], device=image.device).reshape(3, 1, 1)
    gray = (image.float() * weights).sum(-3, keepdim=True)
    if not image.is_floating_point():
        gray = gray.round().clamp(0, 255)
    gray = gray.to(image.dtype)
    return gray.expand(*gray.shape[:-3], num_output_channels, *gray.shape[-2:]).clone()


def to_dtype(image: torch.Tensor, dtype: torch.dtype = torch.float32, scale: bool = False) -> torch.Tensor:
    if not scale or image.is_floating_point() == dtype.is_floating_point:
        return image.to(dtype)
    if dtype.is_floating_point:  # integers 0..255 to 0..1
        return image.to(dtype) / 255
    return (image * 255).round().clamp(0, 255).to(dtype)


def pil_to_tensor(image: Any) -> torch.Tensor:
    """A ``PIL.Image`` as a (C, H, W) tensor of its own dtype (transformers 5.10's backend reads images so)."""
    import numpy as np

    array = np.array(image, copy=True)
    return torch.from_numpy(array[..., None] if array.ndim == 2 else array).permute(2, 0, 1).contiguous()


#: The stand-in of ``torchvision.transforms.v2.functional``: what transformers' image processors call.
FUNCTIONAL = types.ModuleType("torchvision.transforms.v2.functional")
for _function in (resize, pad, crop, normalize, grayscale_to_rgb, rgb_to_grayscale, to_dtype, pil_to_tensor):
    setattr(FUNCTIONAL, _function.__name__, _function)
FUNCTIONAL.InterpolationMode = InterpolationMode  # type: ignore[attr-defined]


def _interpolation_of_resampling() -> dict[Any, InterpolationMode]:
    from transformers.image_utils import PILImageResampling

    return {PILImageResampling.NEAREST: InterpolationMode.NEAREST_EXACT, PILImageResampling.BOX: InterpolationMode.BOX,
            PILImageResampling.BILINEAR: InterpolationMode.BILINEAR,
            PILImageResampling.HAMMING: InterpolationMode.HAMMING,
            PILImageResampling.BICUBIC: InterpolationMode.BICUBIC,
            PILImageResampling.LANCZOS: InterpolationMode.BICUBIC}  # torch has no Lanczos


def _has_torchvision() -> bool:
    from transformers.utils import is_torchvision_available

    return bool(is_torchvision_available())


@contextlib.contextmanager
def _torch_kernels() -> Iterator[None]:
    """transformers' torchvision backend calling the torch kernels, for the block's duration:
    without torchvision the backend module holds no kernels at all."""
    from transformers import image_processing_backends as backends

    mapping = {**_interpolation_of_resampling(), **{int(key): value for key, value in _interpolation_of_resampling().items()}}
    saved = {name: getattr(backends, name, None) for name in ("tvF", "pil_torch_interpolation_mapping")}
    backends.tvF = FUNCTIONAL  # type: ignore[attr-defined]
    backends.pil_torch_interpolation_mapping = mapping
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(backends, name, value)


def _import_with_stand_in(module_name: str) -> types.ModuleType:
    """``module_name`` imported with the stand-in kernels as ``torchvision.transforms.v2.functional``
    (bound to its ``tvF``); no torchvision module is left in ``sys.modules`` afterwards."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    package = {name: types.ModuleType(name) for name in ("torchvision", "torchvision.transforms",
                                                          "torchvision.transforms.v2")}
    package["torchvision.transforms.v2"].functional = FUNCTIONAL  # type: ignore[attr-defined]
    stand_ins = {**package, FUNCTIONAL.__name__: FUNCTIONAL}
    assert not any(name in sys.modules for name in stand_ins), "torchvision is importable: use it"
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module(module_name)
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)


@functools.cache
def image_processor_class(model_type: str, class_name: str) -> type:
    """The real image processor ``class_name`` of ``model_type``, calling torch kernels where
    torchvision is missing (see the module's docstring)."""
    module_name = f"transformers.models.{model_type}.image_processing_{model_type}"
    if _has_torchvision():
        return getattr(importlib.import_module(module_name), class_name)
    real = getattr(_import_with_stand_in(module_name), class_name)

    def preprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _torch_kernels():
            return real.preprocess(self, *args, **kwargs)

    doc = f"{class_name} calling torch kernels in place of torchvision's (tests/models/torchvision_stand_in.py)."
    return type(class_name, (real,), {"preprocess": preprocess, "__doc__": doc, "__module__": __name__})
