"""Input checks run before every launch: each failure names the tensor, what was expected and
what was passed, so a bad call is a Python error rather than a device fault or a wrong answer."""
from __future__ import annotations

from typing import Sequence

import torch

from .errors import InputError


def _same_device(have: torch.device, want: torch.device) -> bool:
    """`want` without an index ("cuda") means the current device of its type, as torch reads it."""
    if want.index is None and have.type == want.type:
        return have.type != "cuda" or have.index == torch.cuda.current_device()
    return have == want


def check_tensor(name: str, t, *, dtype: torch.dtype | None = None, ndim: int | None = None,
                 shape: Sequence[int | None] | None = None, contiguous: bool = False,
                 device: torch.device | None = None, align: int = 16) -> torch.Tensor:
    """`shape` entries of None are free. `device` None skips the device check."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise InputError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and t.dim() != ndim:
        raise InputError(f"{name}: expected {ndim} dims, got {t.dim()} (shape {tuple(t.shape)})")
    if shape is not None:
        for i, (want, have) in enumerate(zip(shape, t.shape)):
            if want is not None and want != have:
                exp = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
                raise InputError(f"{name}: expected shape {exp}, got {tuple(t.shape)} (dim {i}: {want} != {have})")
    if contiguous and not t.is_contiguous():
        raise InputError(f"{name}: expected a contiguous tensor, got strides {t.stride()} for shape {tuple(t.shape)}")
    if device is not None and not _same_device(t.device, torch.device(device)):
        raise InputError(f"{name}: expected device {device}, got {t.device}")
    if t.device.type == "cuda" and t.numel() and t.data_ptr() % align:
        raise InputError(f"{name}: expected a {align}-byte aligned data pointer, got {t.data_ptr():#x}")
    return t


def check_cuda_anchor(name: str, t: torch.Tensor, *others) -> None:
    """`t` sets the device of a call and the kernels need CUDA: when `t` is not on CUDA but
    another tensor of the call is, the error names `t` (not the first tensor compared with its
    device). None entries of `others` are skipped."""
    if t.device.type == "cuda":
        return
    for o in others:
        if isinstance(o, torch.Tensor) and o.device.type == "cuda":
            raise InputError(f"{name}: expected a CUDA tensor, got device {t.device} (the other inputs are on {o.device})")


def require(cond: bool, message: str) -> None:
    if not cond:
        raise InputError(message)
