"""Caller-owned scratch: one uint8 buffer per plan, carved into aligned named regions.

Plans lay the regions out once (`layout`); bind/run only take views (`view`), so nothing is ever
allocated per call and the engine keeps ownership of its workspace."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from .validate import check_tensor, require

ALIGN = 256  # bytes; every region starts on this boundary


@dataclass(frozen=True)
class ScratchRegion:
    name: str
    dtype: torch.dtype
    numel: int
    offset: int  # bytes from the start of the scratch buffer

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def layout(regions: Iterable[tuple[str, torch.dtype, int]]) -> dict[str, ScratchRegion]:
    """Place (name, dtype, numel) regions one after another, each ALIGN-aligned."""
    out, offset = {}, 0
    for name, dtype, numel in regions:
        r = ScratchRegion(name, dtype, int(numel), offset)
        out[name] = r
        offset = -(-(offset + r.nbytes) // ALIGN) * ALIGN
    return out


def total_bytes(regions: dict[str, ScratchRegion]) -> int:
    return max((r.offset + r.nbytes for r in regions.values()), default=0)


def view(scratch: torch.Tensor, region: ScratchRegion, shape: tuple[int, ...]) -> torch.Tensor:
    """A typed view of the region's first prod(shape) elements."""
    nbytes = math.prod(shape) * region.dtype.itemsize
    return scratch[region.offset:region.offset + nbytes].view(region.dtype).view(shape)


def check(scratch: torch.Tensor, need: int, device: torch.device | None) -> None:
    check_tensor("scratch", scratch, dtype=torch.uint8, ndim=1, contiguous=True, device=device, align=ALIGN)
    require(scratch.numel() >= need, f"scratch: expected at least {need} bytes (plan.scratch_bytes()), got {scratch.numel()}")
