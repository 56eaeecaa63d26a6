"""Device facts the planner needs: target arch, SM count and L2 size (queried at plan time, never in run)."""
from __future__ import annotations

import torch

from .errors import InputError

_ARCH_BY_CAPABILITY = {(9, 0): "sm_90a", (12, 0): "sm_120a"}


def device_arch(device: torch.device | int | None = None) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    arch = _ARCH_BY_CAPABILITY.get((major, minor))
    if arch is None:
        raise InputError(f"device: expected compute capability 9.0 (sm_90a) or 12.0 (sm_120a), got {major}.{minor}")
    return arch


def num_sms(device: torch.device | int | None = None) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# What a plan made without a device (Caps(arch=..., num_sms=...)) assumes: the H100's and H200's L2.
DEFAULT_L2_BYTES = 50 * 2**20


def l2_bytes(device: torch.device | int | None = None) -> int:
    """The L2 cache of the device; DEFAULT_L2_BYTES where no CUDA device is present."""
    if not torch.cuda.is_available():
        return DEFAULT_L2_BYTES
    return torch.cuda.get_device_properties(device).L2_cache_size
