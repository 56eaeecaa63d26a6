"""Kernel-resolution freeze under upstream b12x's names (`b12x.cute.runtime_control` of
local-inference-lab/b12x): the same switch as b12x.freeze / unfreeze / is_frozen. While frozen, a
kernel that is not loaded raises KernelResolutionFrozenError instead of being loaded or built."""
from __future__ import annotations

from ..errors import KernelResolutionFrozenError  # noqa: F401
from ..registry import freeze, is_frozen, unfreeze


def freeze_kernel_resolution(reason: str | None = None) -> None:
    freeze(reason=reason)


def unfreeze_kernel_resolution() -> None:
    unfreeze()


def kernel_resolution_frozen() -> bool:
    return is_frozen()


# upstream's older names
freeze_compilation = freeze_kernel_resolution
unfreeze_compilation = unfreeze_kernel_resolution
compilation_frozen = kernel_resolution_frozen
